"""The loop a user runs: farm tune (Ray) -> farm publish -> FARM_HEUR_CONFIG_PATH in a fresh process -> farm.ops."""

import pytest
import json
import os
import subprocess
import sys
import textwrap

from farm.cli import main
from farm.store.overrides.parsing import load_overrides

WORKLOAD = """
name: e2e
autotune: {strategy: run_until_stable, max_iterations: 10, max_tuning_duration_ms: 20}
engines:
  sweep:
    cpu.matmul.blocked: {block_k: [64, 128]}
    cpu.matmul.blas: {order: [direct, transposed]}
problems:
  - {name: mm, op: matmul, tensors: {A: [96, 64], B: [64, 48]}}
  - {name: conv, op: conv_fprop, criteria: {pad_h: 1, pad_w: 1}, tensors: {X: [2, 4, 12, 12], W: [8, 4, 3, 3]}}
  - {name: attn, op: sdpa_fwd, criteria: {causal: 1}, tensors: {Q: [1, 4, 32, 16], K: [1, 2, 32, 16], V: [1, 2, 32, 16]}}
"""

REPLAY = textwrap.dedent("""
    import json, sys
    import numpy as np
    import farm.ops as ops
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    a, b = f(96, 64), f(64, 48)
    c = ops.matmul(a, b)
    assert np.allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    ops.conv2d(f(2, 4, 12, 12), f(8, 4, 3, 3), padding=1)
    ops.sdpa(f(1, 4, 32, 16), f(1, 2, 32, 16), f(1, 2, 32, 16), causal=True)
    print(json.dumps({"choices": ops.choices(), "measured": ops.runtime("cpu", 0).measurements}))
""")


@pytest.mark.slow
def test_tune_publish_then_a_fresh_process_replays_the_winners(tmp_path, repo_root, capsys):
    wl = tmp_path / "e2e.yaml"
    wl.write_text(WORKLOAD)
    out = tmp_path / "run"
    assert main(["tune", str(wl), "--devices", "cpu", "--out", str(out), "--json"]) == 0  # on a local Ray instance
    tuned = json.loads(capsys.readouterr().out)
    assert tuned["executor"] == "ray"
    root = tmp_path / "published"
    assert main(["publish", str(out / "overrides"), "--to", str(root)]) == 0
    [published] = list((root).glob("*/*.json"))
    winners = {e.metadata["problem_key"]: (e.engine_name, dict(e.knobs)) for e in load_overrides(published).entries}
    assert len(winners) == 3

    env = {k: v for k, v in os.environ.items() if not k.startswith(("FARM_TUNABLE_", "FARM_HEUR_"))}
    env.update(FARM_HEUR_CONFIG_PATH=str(root), PYTHONPATH=repo_root)
    proc = subprocess.run([sys.executable, "-c", REPLAY], env=env, capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    replay = json.loads(proc.stdout)
    assert replay["measured"] == 0
    assert len(replay["choices"]) == 3
    for choice in replay["choices"]:
        assert choice["source"] == "SelectionHeuristic::Config", choice
        assert (choice["engine"], choice["knobs"]) == winners[choice["problem_key"]]
