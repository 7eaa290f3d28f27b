"""The farm's view of the cluster's nodes without Ray: which devices a node offers, joins and losses, the cap."""

from farm.devices.sim import SimConfig
from farm.fleet.on_ray.nodes import NodeTable, NodeView, Slot, placed_sim, sim_resource, slots_of
from farm.fleet.options import FarmOptions

SIM = SimConfig.parse({"devices": [{"name": "Sim A"}, {"name": "Sim B", "speed": 2.0}]})


def node(node_id, alive=True, **resources):
    return NodeView(node_id, "host", "10.0.0.1", alive, resources)


def test_a_node_offers_its_gpus_or_the_simulated_devices_it_declares():
    gpu = node("g", GPU=2.0, CPU=16.0)
    assert [s.kind for s in slots_of(gpu, "gpu")] == ["gpu", "gpu"] and slots_of(gpu, "sim", SIM) == []
    mixed = node("s", **{sim_resource("Sim A"): 2.0, sim_resource("Sim B"): 1.0, "sim:Unknown": 4.0})
    assert [s.group.name for s in slots_of(mixed, "sim", SIM)] == ["Sim A", "Sim A", "Sim B"]
    assert slots_of(node("d", alive=False, GPU=8.0), "gpu") == []
    assert slots_of(mixed, "sim", SIM)[0].resource == "sim:Sim A"
    # simulated devices follow nodes only when some live node declares a kind of the config
    assert placed_sim(SIM, [gpu, mixed]) and not placed_sim(SIM, [gpu, node("x", alive=False, **{"sim:Sim A": 1})])
    assert not placed_sim(None, [mixed])


def test_the_table_says_which_nodes_joined_and_which_were_lost_once_each():
    table = NodeTable()
    joined, lost = table.observe([node("a"), node("b")], 0.0)
    assert [v.node_id for v in joined] == ["a", "b"] and lost == []
    assert table.records["a"].joined_s is None  # there at the start
    joined, lost = table.observe([node("a"), node("b", alive=False), node("c")], 12.5)
    assert [v.node_id for v in joined] == ["c"] and lost == ["b"]
    assert table.records["c"].joined_s == 12.5 and table.records["b"].lost_s == 12.5
    assert table.observe([node("a"), node("c")], 20.0) == ([], [])  # gone from the list: lost already
    assert not table.mark_lost("b", 30.0) and table.mark_lost("a", 30.0) and table.is_lost("a")
    assert table.observe([node("c")], 31.0) == ([], [])
    table.add_worker("c", "sim:4", "sig")
    assert [r.node_id for r in table.with_workers()] == ["c"]
    assert table.records["c"].to_json()["workers"] == ["sim:4"]


def test_max_devices_leaves_devices_spare_and_a_lost_worker_s_place_goes_to_one():
    from farm.fleet.on_ray.launcher import WorkerLauncher

    launcher = object.__new__(WorkerLauncher)  # its Ray parts (actor class, cluster) are not used here
    launcher.options = FarmOptions(max_devices=3)
    launcher.spare = [Slot("a", "gpu"), Slot("a", "gpu"), Slot("b", "gpu"), Slot("b", "gpu")]
    launcher.starting = {}
    started = []

    def start(slot):
        started.append(slot)
        launcher.starting[len(started)] = (None, slot)
        return len(started)

    launcher.start = start
    assert launcher.fill(live=0) == [1, 2, 3] and len(launcher.spare) == 1
    launcher.starting.clear()  # they answered: three workers up
    assert launcher.fill(live=3) == []
    assert launcher.fill(live=2) == [4] and launcher.spare == []  # one lost: the spare device takes its place
    assert WorkerLauncher.cap.fget(launcher) == 3


def test_progress_says_when_nodes_join_or_go_and_what_waits_for_a_device():
    from farm.cli.progress import node_events, nodes_part, progress_line
    from farm.fleet.driver import FarmStatus, WorkerStatus
    from farm.fleet.on_ray.nodes import NodeRecord

    a = NodeRecord("a" * 16, "h1", "", workers=["sim:0"])
    b = NodeRecord("b" * 16, "h2", "", workers=["sim:1"])
    workers = [WorkerStatus("sim:0", "S", "Sim", "h1", "busy", node_id=a.node_id),
               WorkerStatus("sim:1", "S", "Sim", "h2", "busy", node_id=b.node_id)]
    seen: dict = {}
    status = FarmStatus(100, 10, 0, 0, 5.0, workers, ["S"], nodes=[a, b])
    assert node_events(status, seen) == [] and nodes_part(status) == "; 2 nodes"
    b.state, b.lost_s, workers[1].state = "lost", 7.0, "lost"
    c = NodeRecord("c" * 16, "h3", "", joined_s=9.0, workers=["sim:2"])
    status = FarmStatus(100, 20, 0, 0, 9.5, workers, ["S"], nodes=[a, b, c], waiting={"T": 25.4})
    lines = node_events(status, seen)
    assert lines == ["node bbbbbbbb (h2: sim:1) lost at 0:07: its tasks run again on devices of its kind",
                     "node cccccccc (h3: sim:2) joined at 0:09: its devices take work now"]
    assert node_events(status, seen) == []  # each once
    c.workers.append("sim:3")  # the joined node's second device started after its join line
    assert node_events(status, seen) == ["node cccccccc (h3): sim:3 take(s) work now too"]
    assert node_events(status, seen) == []
    assert "3 nodes (1 lost, 1 joined); waiting for a device of T (25 s left)" in progress_line(status)
    assert "1/1 workers busy" in progress_line(status)  # a lost worker is not counted
    status = FarmStatus(100, 20, 0, 0, 40.0, workers, ["S"], nodes=[a, b, c], given_up={"T": ["p1", "p2"]})
    assert node_events(status, seen) == ["no device of T came back: 2 problem(s) wait for one (a resume measures them)"]
    assert "; 2 problem(s) wait for a device of T;" in progress_line(status)
