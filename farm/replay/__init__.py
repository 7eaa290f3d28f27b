"""Production: selection policies and the TunableOp-style runtime behind farm.ops."""
