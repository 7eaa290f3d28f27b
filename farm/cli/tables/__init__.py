"""The CLI's tables: a run's (runs.py: farm tune in-process, the reduce), the Ray farm's (farm.py), engines,
devices and policies (engines.py), reports (reports.py) and farm verify's (verify.py)."""
