"""Regenerate farm/devices/fb/generated/ from the .fbs schemas with flatc.

    python -m farm.devices.fb.generate            # rewrite the committed code
    python -m farm.devices.fb.generate --check    # exit 1 if it differs from what flatc makes now

flatc writes an __init__.py into every namespace folder it creates, so it runs
in a temporary folder and only farm/devices/fb/generated/ is copied back.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCHEMAS = ("device_properties.fbs", "problem.fbs")
GENERATED = HERE / "generated"


def generate(into: Path, flatc: str = "flatc") -> Path:
    """Run flatc on the schemas; returns the generated package folder under ``into``."""
    cmd = [flatc, "--python", "-o", str(into), *(str(HERE / s) for s in SCHEMAS)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return into / "farm" / "devices" / "fb" / "generated"


def differences(a: Path, b: Path) -> list[str]:
    names = sorted({p.name for p in a.glob("*.py")} | {p.name for p in b.glob("*.py")})
    return [n for n in names if not (a / n).exists() or not (b / n).exists() or not filecmp.cmp(a / n, b / n, shallow=False)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    ap.add_argument("--flatc", default="flatc", help="flatc binary (default: flatc on PATH)")
    args = ap.parse_args()
    if shutil.which(args.flatc) is None:
        print(f"flatc not found ({args.flatc}); on Debian: apt-get install flatbuffers-compiler", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        if args.check:
            diff = differences(fresh, GENERATED)
            for name in diff:
                print(f"differs: farm/devices/fb/generated/{name}", file=sys.stderr)
            return 1 if diff else 0
        shutil.rmtree(GENERATED, ignore_errors=True)
        shutil.copytree(fresh, GENERATED)
    print(f"wrote {GENERATED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
