"""A results file PyTorch's own TunableOp writes on this GPU maps onto our problems of the same GEMMs."""

import os
import subprocess
import sys

import pytest

from .conftest import cuda_or_skip

pytestmark = pytest.mark.gpu
RT, COUNT = cuda_or_skip()
pytest.importorskip("torch", reason="PyTorch TunableOp needs torch")

from farm.model.problem import Problem  # noqa: E402
from farm.store.overrides.tunableop_csv import load_tunableop_csv  # noqa: E402

# in a process of its own: TunableOp writes its file as it tunes and at exit
TUNE = """
import torch
a = torch.randn(384, 256, device="cuda", dtype=torch.float16)
b = torch.randn(256, 128, device="cuda", dtype=torch.float16)
bt = torch.randn(128, 256, device="cuda", dtype=torch.float16).t()  # a column-major B
torch.mm(a, b)
torch.mm(a, bt)
torch.cuda.synchronize()
"""


def test_pytorchs_tunableop_file_matches_our_gemm_problems(tmp_path):
    path = tmp_path / "tunableop_results0.csv"
    env = {**os.environ, "PYTORCH_TUNABLEOP_ENABLED": "1", "PYTORCH_TUNABLEOP_TUNING": "1",
           "PYTORCH_TUNABLEOP_MAX_TUNING_ITERATIONS": "3", "PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS": "5",
           "PYTORCH_TUNABLEOP_FILENAME": str(tmp_path / "tunableop_results%d.csv"), "CUDA_VISIBLE_DEVICES": "0"}
    subprocess.run([sys.executable, "-c", TUNE], env=env, check=True, timeout=300)
    text = path.read_text()
    print(text)  # the record of what this PyTorch wrote (pytest -s)
    f = load_tunableop_csv(path)
    row = Problem.create("matmul", {"A": [384, 256], "B": [256, 128]}, dtype="fp16")
    col = Problem.create("matmul", {"A": [384, 256], "B": {"dims": [256, 128], "strides": [1, 256]}}, dtype="fp16")
    assert f.match(row) is not None, text
    assert f.match(col) is not None, text
    assert f.match(row) is not f.match(col)
    assert f.match(Problem.create("matmul", {"A": [256, 384], "B": [384, 128]}, dtype="fp16")) is None
