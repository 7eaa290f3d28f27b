"""``python -m farm`` is the ``farm`` command."""

import sys

from .cli import main

sys.exit(main())
