"""Ray job entrypoints (python -m jobs.tune ...)."""
