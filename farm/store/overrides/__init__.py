"""The override file: its entries (entries.py), reading it as hipDNN does (parsing.py), writing it (files.py), and
the formats beside it (hipDNN's own dialect and names, PyTorch TunableOp's CSV)."""
