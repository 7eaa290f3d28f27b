"""Stop the Ray head this machine runs for tunefarm, and no other Ray: ``python -m jobs.stop_head DIR``.

DIR is the ``--temp-dir`` the head was started with (``ray start --head --temp-dir=DIR``). ``ray stop`` would stop
every Ray process of this user on the machine (a developer's own cluster, another job's head); this stops the
processes of that one instance (farm.fleet.on_ray.ray_instance).
"""

import sys

from farm.errors import FarmError
from farm.fleet.on_ray.ray_instance import stop_instance


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m jobs.stop_head TEMP_DIR  (the --temp-dir the head was started with)", file=sys.stderr)
        return 2
    try:
        pids = stop_instance(argv[0])
    except FarmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not pids:
        print(f"no Ray instance with temp dir {argv[0]} runs here: nothing stopped")
    else:
        print(f"stopped the Ray instance of {argv[0]} ({len(pids)} processes); any other Ray here is untouched")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
