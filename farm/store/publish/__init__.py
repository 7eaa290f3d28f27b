"""Publishing: a root of override files per architecture (root.py), the results history beside it (history.py),
and reading a published root (published.py)."""
