"""The farm's bookkeeping without Ray: shards, finalists, careful retries, strikes, resume."""

import pytest

from fakes import fake_result, matmul_problem
from farm.model.records import AutotuneConfig, ConfirmSettings, Disposition
from farm.model.ids import engine_name_to_id
from farm.model.plans import PlanSpec
from farm.fleet.tasks import FINALIST, MAIN, Candidate, PriorRow
from farm.fleet.scheduler import Scheduler
from farm.model.workload import EngineSelection, WorkloadProblem

CFG = AutotuneConfig()
P = matmul_problem()
WP = WorkloadProblem(0, "mm", P, EngineSelection())


def cands(n, engine="e"):
    return [Candidate(PlanSpec(engine_name_to_id(engine), (("k", i),)), engine, i) for i in range(n)]


def result(c, median=1.0, ok=True):
    samples = (median,) * 3
    r = fake_result(P, c.engine_name, samples, knobs=c.spec.knobs, candidate=c.index,
                    disposition=None if ok else Disposition.FAILED_RUN)
    return r


def drain(s, sig, session_of=lambda t: f"s{t.id}", median=lambda c: 1.0 + c.index / 100):
    """Run every queued task to completion; returns the tasks in the order they ran."""
    ran = []
    while (t := s.next_task(sig)) is not None:
        ran.append(t)
        cs = s.candidates_of(t)
        for spec in t.specs:
            s.on_result(t, result(cs[spec], median(cs[spec])), session_of(t))
        s.on_task_end(t)
    return ran


def test_small_problem_is_one_task_and_needs_no_finalist():
    s = Scheduler(shard_size=10)
    c = cands(5)
    s.add_problem("sig", 0, WP, c)
    ran = drain(s, "sig")
    assert [len(t.specs) for t in ran] == [5] and ran[0].round == MAIN
    assert s.done and s.total == s.finished == 5 and s.remeasured == 0


def test_large_problem_is_sharded_then_finalists_are_measured_together():
    s = Scheduler(shard_size=4, finalist_k=2)
    c = cands(10)
    s.add_problem("sig", 0, WP, c)
    first = [s.next_task("sig") for _ in range(3)]
    assert [t.specs for t in first] == [tuple(x.spec for x in c[i:i + 4]) for i in (0, 4, 8)]
    assert s.next_task("sig") is None
    for t in first:
        cs = s.candidates_of(t)
        for spec in t.specs:
            s.on_result(t, result(cs[spec], 1.0 + cs[spec].index / 100), f"session{t.id}")
        s.on_task_end(t)
    assert not s.done
    final = s.next_task("sig")
    assert final.round == FINALIST
    # the best 2 of each shard, in discovery order
    assert [s.candidates_of(final)[x].index for x in final.specs] == [0, 1, 4, 5, 8, 9]
    for spec in final.specs:
        s.on_result(final, result(s.candidates_of(final)[spec]), "final")
    s.on_task_end(final)
    assert s.done and s.remeasured == 6 and s.finished == 10


def test_signatures_have_their_own_queues():
    s = Scheduler()
    s.add_problem("a", 0, WP, cands(3))
    s.add_problem("b", 0, WP, cands(2, "f"))
    assert s.next_task("b").signature == "b" and s.next_task("b") is None
    assert s.pending_tasks("a") == 1 and s.pending_tasks() == 1


def test_a_first_crash_goes_on_as_one_task_a_second_splits_it_and_two_strikes_quarantine():
    s = Scheduler(max_strikes=2)
    c = cands(4)
    s.add_problem("sig", 0, WP, c)
    t = s.next_task("sig")
    s.on_result(t, result(c[0]), "s1")
    assert s.on_task_lost(t, [c[0].spec], "crash", CFG) == []  # batched: nobody is charged
    # one death names nobody (a kill): what was not reported goes on as one task, c0 is not measured again
    rest = s.next_task("sig")
    assert not rest.careful and rest.specs == (c[1].spec, c[2].spec, c[3].spec) and rest.attempt == 2
    assert s.next_task("sig") is None
    assert s.on_task_lost(rest, [], "crash", CFG) == []  # it dies too: now each candidate alone
    careful = [s.next_task("sig") for _ in range(3)]
    assert all(x.careful and len(x.specs) == 1 for x in careful)
    assert [x.specs[0] for x in careful] == [c[1].spec, c[2].spec, c[3].spec]
    # c2 kills its careful task twice
    assert s.on_task_lost(careful[1], [], "crash", CFG) == []
    retry = s.next_task("sig")
    assert retry.careful and retry.specs == (c[2].spec,)
    rows = s.on_task_lost(retry, [], "crash", CFG, "worker w died")
    assert len(rows) == 1 and rows[0].disposition is Disposition.CRASHED
    assert "killed its worker 2 times; quarantined: worker w died" in rows[0].error
    assert rows[0].candidate == 2 and rows[0].engine_name == "e"
    for x in (careful[0], careful[2]):
        s.on_result(x, result(s.candidates_of(x)[x.specs[0]]), f"s{x.id}")
        s.on_task_end(x)
    assert s.finished == 4
    assert s.next_task("sig").round == FINALIST  # successes now span several sessions
    assert not s.done


def test_a_silent_batch_is_split_at_once():
    s = Scheduler()
    c = cands(3)
    s.add_problem("sig", 0, WP, c)
    t = s.next_task("sig")
    assert s.on_task_lost(t, [c[0].spec], "silent", CFG) == []
    split = [s.next_task("sig") for _ in range(2)]
    assert all(x.careful and len(x.specs) == 1 for x in split) and s.next_task("sig") is None


def test_a_careful_hang_times_out_at_once_and_not_started_charges_nobody():
    s = Scheduler()
    c = cands(2)
    s.add_problem("sig", 0, WP, c)
    t = s.next_task("sig")
    s.on_task_lost(t, [], "timeout", CFG)
    a, b = s.next_task("sig"), s.next_task("sig")
    assert s.on_task_lost(a, [], "not_started", CFG) == []  # the worker was restarting
    again = s.next_task("sig")
    assert again.specs == a.specs and again.careful
    rows = s.on_task_lost(again, [], "timeout", CFG)
    assert rows[0].disposition is Disposition.TIMED_OUT and "timeout" in rows[0].error
    s.on_result(b, result(c[1]), "x")
    s.on_task_end(b)
    assert s.done and s.finished == 2


def test_resume_skips_measured_candidates_and_adds_a_finalist_when_sessions_differ():
    c = cands(4)
    prior = [PriorRow(c[0].spec, MAIN, "old", True, 1.0), PriorRow(c[1].spec, MAIN, "old", False, None)]
    s = Scheduler()
    s.add_problem("sig", 0, WP, c, prior)
    t = s.next_task("sig")
    assert t.specs == (c[2].spec, c[3].spec) and s.total == 2
    for spec in t.specs:
        s.on_result(t, result(s.candidates_of(t)[spec]), "new")
    s.on_task_end(t)
    final = s.next_task("sig")
    assert final.round == FINALIST and c[0].spec in final.specs and c[1].spec not in final.specs
    # everything measured before, with a finalist round: nothing to do
    done = [PriorRow(x.spec, MAIN, "old", True, 1.0) for x in c] + [PriorRow(c[0].spec, FINALIST, "f", True, 1.0)]
    s2 = Scheduler()
    s2.add_problem("sig", 0, WP, c, done)
    assert s2.next_task("sig") is None and s2.done and s2.total == 0
    # rows of candidates the workload no longer has are ignored
    s3 = Scheduler()
    s3.add_problem("sig", 0, WP, c[:2], [PriorRow(PlanSpec(1, ()), MAIN, "old", True, 1.0)])
    assert s3.total == 2


def test_a_finalist_round_cut_short_runs_again_on_resume():
    c = cands(6)
    main = [PriorRow(x.spec, MAIN, "s1" if x.index < 3 else "s2", True, 1.0 + x.index / 10, 0.0) for x in c]
    # the driver died after the round's first finalist reached disk
    s = Scheduler(finalist_k=1)
    s.add_problem("sig", 0, WP, c, main + [PriorRow(c[0].spec, FINALIST, "f1", True, 1.0, 0.0)])
    again = s.next_task("sig")
    assert again.round == FINALIST and set(again.specs) == {c[0].spec, c[3].spec} and s.total == 0
    # a complete round: nothing to do
    s2 = Scheduler(finalist_k=1)
    s2.add_problem("sig", 0, WP, c, main + [PriorRow(x.spec, FINALIST, "f2", True, 1.0, 0.0) for x in (c[0], c[3])])
    assert s2.next_task("sig") is None and s2.done


def test_each_sessions_fastest_stable_candidate_is_a_finalist():
    """The winner rule prefers a stable candidate within noise of a noisy fastest one: it must be in the round."""
    c = cands(6)
    noisy = {1: 0.2, 4: 0.2}  # MAD: far above 5 % of the median
    main = [PriorRow(x.spec, MAIN, "s1" if x.index < 3 else "s2", True, 1.0 + x.index / 100, noisy.get(x.index, 0.0))
            for x in c[1:]] + [PriorRow(c[0].spec, MAIN, "s1", True, 2.0, 0.0)]
    s = Scheduler(finalist_k=1)
    s.add_problem("sig", 0, WP, c, main)
    final = s.next_task("sig")
    # s1: fastest c1 (noisy), then its fastest stable c2; s2: fastest c3 (stable); c0 (slow) is not one
    assert final.round == FINALIST and final.specs == (c[1].spec, c[2].spec, c[3].spec)


def test_invalid_settings():
    with pytest.raises(ValueError):
        Scheduler(shard_size=0)


def test_a_device_passes_over_problems_of_a_kernel_family_another_device_is_running():
    from farm.model.problem import Problem

    def wp(i, dtype):
        p = Problem.create("matmul", {"A": [64, 64], "B": [64, 64]}, dtype=dtype)
        return WorkloadProblem(i, f"p{i}", p, EngineSelection())

    s = Scheduler()
    for i, dtype in enumerate(["bf16", "bf16", "fp16", "bf16", "fp32"]):
        s.add_problem("sig", i, wp(i, dtype), cands(2))
    first = s.next_task("sig", "gpu0")
    second = s.next_task("sig", "gpu1")  # p1 shares p0's kernels: gpu1 starts the fp16 problem instead
    assert (first.problem, second.problem) == (0, 2)
    third = s.next_task("sig", "gpu0")  # bf16 again: its own family, its cache is warm
    assert third.problem == 1
    s.on_task_end(second)
    assert s.next_task("sig", "gpu1").problem == 4  # bf16 is still running on gpu0
    s.on_task_end(first)
    s.on_task_end(third)
    assert s.next_task("sig", "gpu1").problem == 3  # nothing of bf16 runs elsewhere now


def test_when_every_task_is_of_a_family_running_elsewhere_the_first_is_taken():
    s = Scheduler(shard_size=2)
    s.add_problem("sig", 0, WP, cands(6))  # three shards of one problem: one family
    a, b = s.next_task("sig", "gpu0"), s.next_task("sig", "gpu1")
    assert (a.specs[0], b.specs[0]) == (cands(6)[0].spec, cands(6)[2].spec)  # in order: nobody idles
    assert s.next_task("sig") is not None  # without a device: plain order


def test_a_device_goes_on_with_the_problem_it_set_up_and_another_takes_a_problem_nobody_runs():
    """Problem affinity: one problem's shards and its confirmation stage stay on the device that paid its setup
    (inputs, library plans, loaded kernels) while other problems are waiting."""
    from farm.model.problem import Problem

    def wp(i):
        p = Problem.create("matmul", {"A": [128 - 64 * i, 64], "B": [64, 64]})  # p0 the larger
        return WorkloadProblem(i, f"p{i}", p, EngineSelection())

    s = Scheduler(shard_size=2, confirm=ConfirmSettings())
    s.add_problem("sig", 0, wp(0), cands(4))  # two shards
    s.add_problem("sig", 1, wp(1), cands(2))
    a = s.next_task("sig", "gpu0")
    b = s.next_task("sig", "gpu1")  # p0's second shard waits for gpu0: gpu1 starts p1, which nobody runs
    assert (a.problem, b.problem) == (0, 1)
    for t in (b, a):
        for spec in t.specs:
            s.on_result(t, result(s.candidates_of(t)[spec]), f"s{t.id}")
        s.on_task_end(t)
    assert s.next_task("sig", "gpu0").problem == 0  # the sibling shard, on the device that set p0 up
    assert s.next_task("sig", "gpu1").problem == 1  # p1's stage (urgent), where p1 was measured


def test_the_largest_queued_problem_goes_first_so_devices_finish_together():
    from farm.model.problem import Problem

    s = Scheduler()
    for i, m in enumerate([64, 4096, 512]):
        s.add_problem("sig", i, WorkloadProblem(i, f"p{i}", Problem.create("matmul", {"A": [m, 256], "B": [256, 256]}),
                                                EngineSelection()), cands(3))
    order = [s.next_task("sig", f"gpu{i}").problem for i in range(3)]
    assert order == [1, 2, 0]


def test_the_default_candidate_joins_the_finalist_round_even_when_outside_its_shards_top_k():
    s = Scheduler(shard_size=4, finalist_k=1)
    default = Candidate(PlanSpec(engine_name_to_id("lib"), ()), "lib", 0)  # default knobs, discovered first
    c = [default] + cands(7)[1:]
    s.add_problem("sig", 0, WP, c)
    # the default is the slowest of its shard: without the rule it would not be re-measured
    drain(s, "sig", median=lambda x: 2.0 if x is default else 1.0 + x.index / 100)
    assert s.done and s.remeasured == 3  # the best of each of the 2 shards, and the default


def test_a_settled_problem_lets_go_of_its_candidates_and_one_still_running_keeps_them():
    """The driver's memory follows the problems in flight: a settled one keeps no per-candidate state."""
    s = Scheduler(shard_size=4, finalist_k=2)
    s.add_problem("sig", 0, WP, cands(10))  # sharded: settles only after its finalist round
    s.add_problem("sig", 1, WP, cands(3))
    first = [s.next_task("sig") for _ in range(4)]
    for t in first[:3]:  # problem 0's shards end; its finalist round is queued
        cs = s.candidates_of(t)
        for spec in t.specs:
            s.on_result(t, result(cs[spec], 1.0 + cs[spec].index / 100), f"session{t.id}")
        s.on_task_end(t)
    assert len(s._problems[("sig", 0)].candidates) == 10  # the finalist round still needs them
    drain(s, "sig")
    t = first[3]
    cs = s.candidates_of(t)
    for spec in t.specs:
        s.on_result(t, result(cs[spec]), "other")
    s.on_task_end(t)
    assert s.done and s.remeasured > 0
    assert all(not p.candidates and not p.successes for p in s._problems.values())
