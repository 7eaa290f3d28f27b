"""The float64 attention references: the backward is the gradient of the forward (finite differences)."""

import numpy as np
import pytest

from farm import Problem
from farm.tuner.reference import reference


@pytest.mark.parametrize("hq,hk,sq,skv,causal", [(2, 2, 3, 4, 0), (4, 2, 5, 3, 1), (2, 1, 4, 4, 1)])
def test_sdpa_bwd_is_the_gradient_of_sdpa_fwd(hq, hk, sq, skv, causal):
    rng = np.random.default_rng(7)
    d = 3
    q, k, v = (rng.standard_normal(s) for s in ((2, hq, sq, d), (2, hk, skv, d), (2, hk, skv, d)))
    do = rng.standard_normal((2, hq, sq, d))
    fwd = Problem.create("sdpa_fwd", {"Q": list(q.shape), "K": list(k.shape), "V": list(v.shape)}, dtype="fp32",
                         criteria={"causal": causal})
    bwd = Problem.create("sdpa_bwd", {t: list(a.shape) for t, a in (("Q", q), ("K", k), ("V", v), ("O", do),
                                                                      ("dO", do))},
                         dtype="fp32", criteria={"causal": causal})

    def loss(qq, kk, vv):  # sum(O * dO): its gradients are what a backward pass with dO computes
        return float((reference(fwd, {"Q": qq, "K": kk, "V": vv})["O"] * do).sum())

    o = reference(fwd, {"Q": q, "K": k, "V": v})["O"]
    got = reference(bwd, {"Q": q, "K": k, "V": v, "O": o, "dO": do})
    eps = 1e-6
    for name, arr in (("dQ", q), ("dK", k), ("dV", v)):
        numeric = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            plus, minus = arr.copy(), arr.copy()
            plus[i] += eps
            minus[i] -= eps
            args = {"dQ": (plus, k, v), "dK": (q, plus, v), "dV": (q, k, plus)}[name]
            args_m = {"dQ": (minus, k, v), "dK": (q, minus, v), "dV": (q, k, minus)}[name]
            numeric[i] = (loss(*args) - loss(*args_m)) / (2 * eps)
        assert got[name].shape == arr.shape
        np.testing.assert_allclose(got[name], numeric, rtol=1e-5, atol=1e-7, err_msg=name)
