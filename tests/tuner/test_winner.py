"""The one winner rule (farm.tuner.judging.winner): noise never helps a candidate win; only the default and the incumbent
get the benefit of the doubt."""

import numpy as np

from farm.tuner.judging.winner import NOISY_RELATIVE, Rule, decide, decide_groups, why


def test_noisy_slow_early_loses_to_stable_fast_late():
    # the H200 case: torch.blas (discovered first, median 0.0722, MAD 0.0033) vs a stable 0.0671 (MAD 0.0007)
    d = decide([0.0722, 0.0671], [0.0033, 0.0007], [0, 1])
    assert (d.winner, d.fastest, d.rule) == (1, 1, Rule.FASTEST)
    # even when the noisy one is the default: its own noise cannot buy it the benefit of the doubt
    d = decide([0.0722, 0.0671], [0.0033, 0.0007], [0, 1], default=[True, False])
    assert d.winner == 1 and d.rule is Rule.FASTEST


def test_faster_median_wins_among_non_default_candidates_whatever_their_order():
    # neither is the default: a hair faster wins, discovery order does not matter
    for order in ([0, 1], [1, 0]):
        d = decide([1.000, 0.995], [0.002, 0.002], order)
        assert d.winner == 1 and d.rule is Rule.FASTEST


def test_default_within_noise_is_kept_beyond_noise_is_not():
    d = decide([1.00, 0.99, 1.5], [0.002, 0.002, 0.0], [0, 1, 2], default=[True, False, False])
    assert (d.winner, d.fastest, d.rule) == (0, 1, Rule.DEFAULT_WITHIN_NOISE)
    assert d.ranked == (0, 1, 2) and d.threshold_ms > 0.01
    d = decide([1.00, 0.80, 1.5], [0.002, 0.002, 0.0], [0, 1, 2], default=[True, False, False])
    assert (d.winner, d.rule) == (1, Rule.FASTEST) and d.ranked == (1, 0, 2)
    # noiseless samples: only the 0.5 % floor protects the default
    assert decide([1.000, 0.997], [0.0, 0.0], [0, 1], default=[True, False]).winner == 0
    assert decide([1.00, 0.98], [0.0, 0.0], [0, 1], default=[True, False]).winner == 1


def test_incumbent_within_noise_is_kept_before_the_default():
    med, mad = [1.00, 0.99, 0.995], [0.002, 0.002, 0.002]
    d = decide(med, mad, [0, 1, 2], default=[True, False, False], incumbent=[False, False, True])
    assert (d.winner, d.fastest, d.rule) == (2, 1, Rule.INCUMBENT_WITHIN_NOISE)
    # an incumbent beaten beyond noise is replaced
    d = decide([1.00, 0.70, 0.995], mad, [0, 1, 2], incumbent=[False, False, True])
    assert (d.winner, d.rule) == (1, Rule.FASTEST)
    # the incumbent leading already: the default does not take over
    d = decide([1.00, 1.2, 0.998], mad, [0, 1, 2], default=[True, False, False], incumbent=[False, False, True])
    assert (d.winner, d.rule) == (2, Rule.FASTEST)


def test_a_noisy_fastest_loses_the_tie_to_a_stable_runner_up():
    d = decide([1.00, 0.98, 0.99], [0.001, 0.08, 0.001], [0, 1, 2])
    assert (d.winner, d.fastest, d.rule) == (2, 1, Rule.STABLE_OVER_NOISY)
    # but not a tie it clearly wins
    d = decide([1.00, 0.50, 0.99], [0.001, 0.03, 0.001], [0, 1, 2])
    assert (d.winner, d.rule) == (1, Rule.FASTEST)


def test_groups_are_decided_independently_and_match_one_at_a_time():
    rng = np.random.default_rng(7)
    groups = np.repeat(np.arange(50), 6)
    med = rng.uniform(0.9, 1.1, groups.size)
    mad = rng.uniform(0.0, 0.06, groups.size) * med / 1.4826
    order = np.tile(np.arange(6), 50)
    default = order == 0
    perm = rng.permutation(groups.size)  # rows need not arrive sorted by group
    d = decide_groups(groups[perm], med[perm], mad[perm], order[perm], default=default[perm], top_k=6)
    for g in range(50):
        rows = np.flatnonzero(groups == g)
        one = decide(med[rows], mad[rows], order[rows], default=default[rows])
        assert perm[d.winner[g]] == rows[one.winner]
        assert Rule(d.rule[g]) is one.rule


def test_why_is_one_phrase_and_empty_for_the_fastest():
    assert why(Rule.FASTEST, winner_ms=1.0, fastest_ms=1.0, fastest_label="x", threshold_ms=0.0) == ""
    text = why(Rule.DEFAULT_WITHIN_NOISE, winner_ms=1.0, fastest_ms=0.996, fastest_label="blas[tile=64]",
               threshold_ms=0.012)
    assert text == "default kept: blas[tile=64] 0.4 % faster is within noise (±1.2 %)"
    assert "noisy" in why(Rule.STABLE_OVER_NOISY, winner_ms=1.0, fastest_ms=0.98, fastest_label="x",
                          threshold_ms=0.2, fastest_noise=2 * NOISY_RELATIVE)
