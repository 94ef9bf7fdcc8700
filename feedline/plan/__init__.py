"""The logical plan: operators over one source, relational sources and their schemas."""
