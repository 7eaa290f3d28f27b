"""Judging measurements: paired ratios and their intervals (paired.py), a session's ranking (ranking.py), the
confirmation stage's verdict (confirm.py) and the winner's rule every surface calls (winner.py)."""
