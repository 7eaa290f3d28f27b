"""Engine plugins. Built-in CPU engines live in ``engines.cpu``; GPU engines beside them."""
