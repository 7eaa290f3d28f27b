"""Ray job entrypoint: ``ray job submit --working-dir . -- python -m jobs.tune WORKLOAD --out DIR``.

The same job as ``farm tune`` (same arguments, same outputs); inside a Ray job it
attaches to the cluster Ray started it on ($RAY_ADDRESS).
"""

import sys

from farm.cli import main

if __name__ == "__main__":
    sys.exit(main(["tune", *sys.argv[1:]]))
