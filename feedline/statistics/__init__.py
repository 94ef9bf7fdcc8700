"""Descriptive statistics from mergeable partials, their sketches, HTML report and drift."""
