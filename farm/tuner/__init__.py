"""How one problem is measured: the autotuner, the numerical check, compile claims, the winner rule."""
