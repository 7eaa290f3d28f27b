"""Selection policies (hipDNN heuristics RFC): built-ins and plugins of group farm.policies."""
