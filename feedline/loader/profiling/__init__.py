"""Where a loader's time goes: per-stage accounting, the profile report and the diagnosis."""
