"""Library models from the command line, as a user runs them on a CPU: farm capture (its coverage report), a tune,
farm apply's model check, and ``farm.apply`` on the run, the model computing what it computes without the farm (the mistakes a user makes
in a target: tests/nn/test_models.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the model tests need torch (pip install torch==2.14.1)")
pytest.importorskip("transformers", reason="the library model tests need transformers (pip install '.[models]')")
pytest.importorskip("timm", reason="the library model tests need timm (pip install '.[models]')")

ROOT = Path(__file__).resolve().parents[2]
MODELS = f"{ROOT}/examples/library_models.py"


def _farm(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FARM_HEUR_CONFIG_PATH", None)
    return subprocess.run([sys.executable, "-m", "farm", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("target, steps", [("llama", ["batch=1", "batch=2"]), ("resnet", ["channels_last=1"])])
def test_a_library_model_captured_tuned_checked_and_applied_from_the_command_line(tmp_path, target, steps):
    withs = [x for s in steps for x in ("--with", s)]
    run = tmp_path / "run"
    cap = _farm("capture", f"{MODELS}:{target}", *withs, "--out", str(run / "workload.yaml"), "--json", cwd=tmp_path)
    assert cap.returncode == 0, cap.stderr[-3000:]
    captured = json.loads(cap.stdout)
    assert captured["problems"] and len(captured["coverage"]) == len(steps)
    assert all(0 < c["covered"] <= 1 for c in captured["coverage"])
    text = (run / "workload.yaml").read_text()
    assert "library: torch" in text and "the farm's problems take" in text
    tune = _farm("tune", str(run / "workload.yaml"), "--out", str(run), "--in-process", cwd=tmp_path)
    assert tune.returncode in (0, 3), tune.stderr[-3000:]  # 3: a decision flagged where replayed (said, kept)
    check = _farm("apply", f"{MODELS}:{target}", str(run), *withs, "--rounds", "8", "--json", cwd=tmp_path)
    assert check.returncode == 0, check.stderr[-3000:]
    sys.path.insert(0, str(ROOT / "examples"))
    import farm
    import library_models

    given = dict(kv.split("=") for s in steps[:1] for kv in s.split(","))
    model, args, kwargs = getattr(library_models, target)(**{k: int(v) for k, v in given.items()})
    with torch.no_grad():
        ref = model(*args, **kwargs)
        farm.apply(model, str(run))
        out = model(*args, **kwargs)
    farm.unapply(model)
    ref, out = (getattr(x, "logits", x) for x in (ref, out))
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4)

