"""The farm driver without Ray: assignments, results, a worker lost mid-task, silence, short endings."""

from fakes import fake_props, fake_result, matmul_problem
from farm.fleet.driver import Driver, LossKind, WorkerHandle, WorkerState, WorkerStatus
from farm.fleet.options import FarmOptions
from farm.fleet.tasks import Candidate
from farm.fleet.scheduler import Scheduler
from farm.fleet.on_ray.worker import TaskEnd, WorkerInfo
from farm.model.ids import engine_name_to_id
from farm.model.plans import PlanSpec
from farm.model.records import AutotuneConfig, Disposition
from farm.model.workload import EngineSelection, WorkloadProblem

P = matmul_problem()
WP = WorkloadProblem(0, "mm", P, EngineSelection())
PROPS = fake_props()


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Sink:
    def __init__(self):
        self.rows, self.ranks = [], {}

    def write(self, rows):
        self.rows.extend(rows)

    def set_ranks(self, session, ranks):
        self.ranks[session] = ranks


def cands(n):
    return [Candidate(PlanSpec(engine_name_to_id("e"), (("k", i),)), "e", i) for i in range(n)]


def setup(n_candidates=3, workers=1, **options):
    sched = Scheduler(shard_size=100)
    cs = cands(n_candidates)
    sched.add_problem(PROPS.signature, 0, WP, cs)
    handles = [WorkerHandle(i, WorkerInfo(f"sim:{i}", f"a{i}", "node", "host", 1, PROPS), actor=object(),
                            status=WorkerStatus(f"sim:{i}", PROPS.signature, PROPS.name, "host", WorkerState.IDLE.value))
               for i in range(workers)]
    clock, sink = Clock(), Sink()
    driver = Driver(sched, handles, sink, AutotuneConfig(), FarmOptions(**options), clock=clock)
    return driver, handles, sink, clock, cs


def result(c, ms=1.0):
    return fake_result(P, c.engine_name, (ms, ms, ms), knobs=c.spec.knobs, candidate=c.index)


def test_a_task_runs_reports_and_ends():
    driver, [w], sink, clock, cs = setup()
    [(got, task)] = driver.assignments()
    assert got is w and w.status.state == "busy" and len(task.specs) == 3 and driver.assignments() == []
    driver.on_started(w)
    clock.t = 2.0
    driver.on_batch(w, [result(c) for c in cs])
    driver.on_end(w, TaskEnd("s", {"k": 0}))
    driver.on_stream_end(w)
    assert len(sink.rows) == 3 and w.free and w.status.state == "idle" and w.status.busy_s == 2.0
    assert driver.done and driver.status().finished == 3 and w.status.candidates == 3


def test_a_worker_lost_mid_task_goes_on_with_its_unreported_candidates_after_it_restarts():
    driver, [w], sink, clock, cs = setup()
    driver.assignments()
    driver.on_started(w)
    driver.on_batch(w, [result(cs[0])])
    driver.on_lost(w, "SIGKILL")
    assert w.restarting and w.status.state == "restarting" and w.status.restarts == 1
    assert driver.assignments() == []  # not before it answers again
    assert not driver.done and not driver.stuck
    driver.on_back(w)
    [(_, retry)] = driver.assignments()
    # what it reported stays; the rest goes on as one task (one death names nobody)
    assert not retry.careful and retry.specs == tuple(c.spec for c in cs[1:])
    assert len(sink.rows) == 1  # nobody charged yet: the batch named no culprit


def test_a_careful_task_that_goes_silent_times_out_its_candidate_at_once():
    driver, [w], sink, clock, cs = setup(n_candidates=1, candidate_timeout_s=5)
    driver.assignments()
    driver.on_started(w)
    driver.on_lost(w, "died")  # the batch task died: its candidate goes on, then (died again) alone
    driver.on_back(w)
    [(_, again)] = driver.assignments()
    driver.on_started(w)
    driver.on_lost(w, "died")
    driver.on_back(w)
    [(_, careful)] = driver.assignments()
    assert careful.careful and not again.careful
    driver.on_started(w)
    clock.t = 4.0
    assert driver.on_silent() == []
    clock.t = 10.0
    assert driver.on_silent() == [w]  # the caller kills it
    [(row, wp, where)] = sink.rows
    assert row.disposition is Disposition.TIMED_OUT and wp is WP and where.session_id
    assert w.restarting and driver.sched.finished == 1


def test_silence_before_the_task_started_charges_nobody():
    driver, [w], sink, clock, cs = setup(startup_timeout_s=30, candidate_timeout_s=5)
    [(_, task)] = driver.assignments()
    clock.t = 10.0
    assert driver.on_silent() == []  # not started yet: the startup limit applies
    clock.t = 40.0
    assert driver.on_silent() == [w] and sink.rows == [] and w.status.restarts == 0
    driver.on_back(w)
    [(_, again)] = driver.assignments()
    assert again.specs == task.specs and not again.careful  # queued again as it was, nobody blamed


def test_a_task_that_ends_without_every_result_retries_the_rest_on_the_same_worker():
    driver, [w], sink, clock, cs = setup()
    driver.assignments()
    driver.on_started(w)
    driver.on_batch(w, [result(cs[0])])
    driver.on_end(w, TaskEnd("s", {}, error="RuntimeError: engine bug"))
    assert w.free and not w.restarting  # an error in a task is not a dead worker
    driver.on_stream_end(w)  # the stream closes after: already settled
    retries = driver.assignments()
    assert len(retries) == 1 and retries[0][1].careful


def test_two_workers_share_a_signature_and_results_are_kept_when_asked():
    driver, ws, sink, clock, cs = setup(n_candidates=250, workers=2, keep_results=True)
    tasks = driver.assignments()
    assert [w.index for w, _ in tasks] == [0, 1] and sum(t.size for _, t in tasks) == 200
    for w, t in tasks:
        driver.on_started(w)
        driver.on_batch(w, [result(c, 1.0 + c.index) for c in cs if c.spec in t.specs])
        driver.on_end(w, TaskEnd("s", {}))
        driver.on_stream_end(w)
    assert len(driver.results[(PROPS.signature, "mm")]) == 200


def test_loss_kinds_are_the_schedulers_words():
    # a lost node is the scheduler's not_started (the driver passes it so): the task runs again as it was
    assert {k.value for k in LossKind} - {"node_lost"} == {"crash", "silent", "timeout", "error", "not_started"}


def on_node(driver, index, node, props=PROPS):
    w = WorkerHandle(index, WorkerInfo(f"sim:{index}", f"a{index}", node, "host", 1, props), actor=object(),
                     status=WorkerStatus(f"sim:{index}", props.signature, props.name, "host", WorkerState.IDLE.value,
                                         node_id=node))
    driver.add_worker(w)
    return w


def test_a_lost_node_s_task_runs_again_as_it_was_on_a_surviving_device_and_charges_nobody():
    driver, [], sink, clock, cs = setup(n_candidates=4, workers=0)
    a, b = on_node(driver, 0, "node-a"), on_node(driver, 1, "node-b")
    [(w, task)] = driver.assignments()  # one task of 4: the first free worker takes it
    driver.on_started(w)
    driver.on_batch(w, [result(cs[0])])
    lost = driver.on_node_lost(w.info.node_id, "removed")
    assert lost == [w] and w.lost and not w.restarting and w.status.state == "lost" and w.status.restarts == 0
    other = b if w is a else a
    [(got, again)] = driver.assignments()
    assert got is other and not again.careful and set(again.specs) == {c.spec for c in cs[1:]}
    driver.on_started(other)
    driver.on_batch(other, [result(c) for c in cs[1:]])
    driver.on_end(other, TaskEnd("s", {}))
    driver.on_stream_end(other)
    # every candidate has exactly one row, none of them a failure; the lost worker does not hold the job open
    assert sorted(r[0].candidate for r in sink.rows) == [0, 1, 2, 3] and all(r[0].succeeded for r in sink.rows)
    # (with the confirmation stage off, rows of two sessions get a finalist round, as after any split)
    [(got, finalists)] = driver.assignments()
    assert got is other and finalists.round == "finalist"
    driver.on_batch(other, [result(c) for c in cs if c.spec in finalists.specs])
    driver.on_end(other, TaskEnd("f", {}))
    driver.on_stream_end(other)
    assert driver.done and driver.status().nodes[0].state == "lost" and driver.status().nodes[1].state == "active"
    assert driver.on_node_lost(w.info.node_id) == []  # told twice (the node list and an error): once


def test_the_only_node_of_a_signature_lost_waits_then_gives_its_problems_up_and_the_job_ends():
    driver, [], sink, clock, cs = setup(n_candidates=3, workers=0, device_wait_s=30)
    w = on_node(driver, 0, "node-a")
    driver.assignments()
    driver.on_started(w)
    driver.on_node_lost("node-a")
    assert driver.check_waits() == [] and not driver.done and not driver.stuck
    assert driver.status().waiting == {PROPS.signature: 30.0}
    clock.t = 29.0
    assert driver.check_waits() == [] and driver.status().waiting[PROPS.signature] == 1.0
    clock.t = 30.0
    assert driver.check_waits() == [PROPS.signature]
    assert driver.done and driver.status().given_up == {PROPS.signature: ["mm"]} and sink.rows == []


def test_a_node_that_joins_while_a_signature_waits_takes_its_work():
    driver, [], sink, clock, cs = setup(n_candidates=3, workers=0, device_wait_s=30)
    w = on_node(driver, 0, "node-a")
    driver.assignments()
    driver.on_node_lost("node-a")
    driver.check_waits()
    clock.t = 10.0
    late = on_node(driver, 1, "node-b")
    assert driver.check_waits() == [] and driver.status().waiting == {}
    [(got, task)] = driver.assignments()
    assert got is late and task.size == 3
    assert [n.joined_s for n in driver.status().nodes] == [None, None]  # the table of a real run knows (NodeTable)



def test_a_worker_that_died_on_a_node_still_listed_alive_is_judged_once_ray_knows():
    # its node is then listed dead: a node loss, nobody charged, the task runs again as it was
    driver, [], sink, clock, cs = setup(n_candidates=3, workers=0, node_grace_s=30)
    w, other = on_node(driver, 0, "node-a"), on_node(driver, 1, "node-b")
    [(got, task)] = driver.assignments()
    driver.on_started(got)
    driver.on_unreachable(got, "connection lost")
    assert got.status.state == "unreachable" and not got.free and not driver.done and not driver.stuck
    assert driver.assignments() == [] and driver.on_silent(now=1e6) == []  # its task waits for the judgement
    driver.on_node_lost(got.info.node_id)
    [(again_on, again)] = driver.assignments()
    assert again_on is not got and again.size == 3 and not again.careful and again.attempt == 1
    assert got.lost and got.unreachable is None


def test_an_unreachable_worker_that_answers_again_or_stays_silent_past_the_grace_crashed():
    driver, [], sink, clock, cs = setup(n_candidates=3, workers=0, node_grace_s=30)
    w = on_node(driver, 0, "node-a")
    [(got, task)] = driver.assignments()
    driver.on_started(w)
    driver.on_unreachable(w, "worker died")
    driver.on_back(w)  # restarted on its node: it was a crash (the first names nobody: one task again, attempt 2)
    assert w.free and w.status.restarts == 1
    [(_, again)] = driver.assignments()
    assert again.attempt == 2 and again.size == 3
    driver.on_started(w)
    driver.on_unreachable(w, "worker died")
    clock.t = 29.0
    assert driver.settle_unreachable() == []
    clock.t = 30.0
    assert driver.settle_unreachable() == [w] and w.restarting and w.unreachable is None
    driver.on_back(w)
    [(_, careful)] = driver.assignments()
    assert careful.careful and careful.size == 1  # a second death on it: candidates are isolated


class StorageSink(Sink):
    """Shared storage: the workers write their rows; what a session has there is ``on_storage[session]``."""

    def __init__(self):
        super().__init__()
        self.on_storage, self.counted, self.fenced = {}, 0, []

    def count(self, results):
        self.counted += len(list(results))

    def add_parts(self, parts):
        pass

    def results_of_session(self, signature, op, session_id):
        return list(self.on_storage.get(session_id, []))

    def fence(self, signature, op, session_id):
        self.fenced.append(session_id)


def test_a_stage_whose_rows_a_lost_worker_wrote_before_reporting_them_is_not_run_twice():
    from farm.model.records import ConfirmSettings

    sched = Scheduler(shard_size=100, confirm=ConfirmSettings())
    cs = cands(3)
    sched.add_problem(PROPS.signature, 0, WP, cs)
    sink = StorageSink()
    driver = Driver(sched, [], sink, AutotuneConfig(), FarmOptions(), clock=Clock(), workers_write=True)
    a, b = on_node(driver, 0, "node-a"), on_node(driver, 1, "node-b")
    [(w, main)] = driver.assignments()
    driver.on_started(w)
    driver.on_batch(w, [result(c, 1.0 + c.index) for c in cs])
    driver.on_end(w, TaskEnd("s", {}))
    driver.on_stream_end(w)
    [(w, stage)] = driver.assignments()
    assert stage.round == "confirm"
    driver.on_started(w)
    # the stage's one part is on the storage, then the node goes before the worker reports it
    sink.on_storage[w.task.where.session_id] = [result(c) for c in cs if c.spec in stage.specs]
    driver.on_node_lost(w.info.node_id)
    assert driver.assignments() == [] and driver.done  # counted, not run again
    assert sink.counted == 3 + stage.size and sink.fenced == []

    # a part with fewer rows than the stage (none here) is a stage cut short: it runs again
    sched2 = Scheduler(shard_size=100, confirm=ConfirmSettings())
    sched2.add_problem(PROPS.signature, 0, WP, cs)
    sink2 = StorageSink()
    driver2 = Driver(sched2, [], sink2, AutotuneConfig(), FarmOptions(), clock=Clock(), workers_write=True)
    a2, b2 = on_node(driver2, 0, "node-a"), on_node(driver2, 1, "node-b")
    [(w2, _)] = driver2.assignments()
    driver2.on_batch(w2, [result(c, 1.0 + c.index) for c in cs])
    driver2.on_end(w2, TaskEnd("s", {}))
    driver2.on_stream_end(w2)
    [(w2, stage2)] = driver2.assignments()
    driver2.on_started(w2)
    w2_session = w2.task.where.session_id
    driver2.on_node_lost(w2.info.node_id)
    [(other, again)] = driver2.assignments()
    assert again.round == "confirm" and set(again.specs) == set(stage2.specs) and other is not w2
    assert sink2.fenced == [w2_session]  # a part its worker writes late is set aside at the end
