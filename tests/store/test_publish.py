"""farm publish: layout and index, merge with a diff, the regression gate, refusals, concurrency, lookup."""

import json
import multiprocessing

import pytest

from farm.cli import main
from farm.devices.device import cpu_device
from farm.errors import InputError
from farm.store.overrides.entries import OverrideEntry
from farm.store.overrides.parsing import load_overrides
from farm.store.overrides.files import write_overrides
from farm.store.publish.root import publish
from farm.store.publish.published import find_published
from tests.fakes import fake_props, matmul_problem


def entry(problem, engine, ms, name):
    return OverrideEntry.for_problem(problem, engine, (), {"rank": 0, "min_time_ms": ms, "median_time_ms": ms,
                                                            "problem_name": name, "problem_key": problem.key})


def overrides(folder, props, entries, extra_name=None):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{extra_name or props.signature}.json"
    write_overrides(path, entries, device={"signature": props.signature, "properties": props.to_dict()}, mode="replace")
    return path


P1, P2, P3 = matmul_problem(8, 8, 8), matmul_problem(16, 16, 16), matmul_problem(32, 32, 32)


def test_layout_index_and_merge_with_a_diff(tmp_path, capsys):
    props = fake_props()
    src = tmp_path / "a"
    overrides(src, props, [entry(P1, "torch.matmul", 1.0, "p1"), entry(P2, "torch.matmul", 2.0, "p2")])
    root = tmp_path / "root"
    assert main(["publish", str(src), "--to", str(root)]) == 0
    published = root / "sm_90" / f"{props.signature}.json"
    assert published.exists()
    index = json.loads((root / "index.json").read_text())
    info = index["files"][props.signature]
    assert (info["arch"], info["device_name"], info["entries"], info["path"]) == ("sm_90", "Fake GPU", 2,
                                                                                  f"sm_90/{props.signature}.json")
    import hashlib
    assert info["sha256"] == hashlib.sha256(published.read_bytes()).hexdigest()
    assert info["libraries"] == {"torch": "2.11.0"} and info["created"]

    # second publish: p2 faster with another engine, p3 new; p1 kept (merge by match key)
    src2 = tmp_path / "b"
    overrides(src2, props, [entry(P2, "triton.gemm", 1.5, "p2"), entry(P3, "torch.blas", 3.0, "p3")])
    capsys.readouterr()
    assert main(["publish", str(src2), "--to", str(root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["files"][0]
    assert [c["problem"] for c in report["added"]] == ["p3"]
    assert report["changed"] == [{"problem": "p2", "old_engine": "torch.matmul[default]",
                                  "new_engine": "triton.gemm[default]", "old_ms": 2.0, "new_ms": 1.5}]
    assert report["removed"] == [] and report["unchanged"] == 1
    assert not [p for p in root.rglob("*") if p.name.endswith(".lock")]  # the publish lock goes with its holder
    merged = load_overrides(published)
    assert sorted(e.metadata["problem_name"] for e in merged.entries) == ["p1", "p2", "p3"]
    assert json.loads((root / "index.json").read_text())["files"][props.signature]["entries"] == 3


def test_regression_gate_refuses_slower_winners_unless_forced(tmp_path, capsys):
    props = fake_props()
    root = tmp_path / "root"
    overrides(tmp_path / "a", props, [entry(P1, "torch.matmul", 1.0, "p1")])
    publish(tmp_path / "a", str(root))
    overrides(tmp_path / "b", props, [entry(P1, "triton.gemm", 1.5, "p1")])
    before = (root / "sm_90" / f"{props.signature}.json").read_text()
    capsys.readouterr()
    assert main(["publish", str(tmp_path / "b"), "--to", str(root)]) == 1
    captured = capsys.readouterr()
    assert "refused" in captured.err and "--force" in captured.err and "slower" in captured.out
    assert (root / "sm_90" / f"{props.signature}.json").read_text() == before
    assert main(["publish", str(tmp_path / "b"), "--to", str(root), "--force"]) == 0
    assert load_overrides(root / "sm_90" / f"{props.signature}.json").entries[0].engine_name == "triton.gemm"


def test_a_file_that_fails_validation_is_refused_with_the_reason(tmp_path, capsys):
    props = fake_props()
    overrides(tmp_path / "a", props, [entry(P1, "torch.matmul", 1.0, "p1")], extra_name="wrong-name")
    assert main(["publish", str(tmp_path / "a"), "--to", str(tmp_path / "root")]) == 2
    err = capsys.readouterr().err
    assert "wrong-name.json" in err and "does not match its device signature" in err
    with pytest.raises(InputError, match="no override files"):
        (tmp_path / "empty").mkdir()
        publish(tmp_path / "empty", str(tmp_path / "root"))


def test_a_published_file_in_the_wrong_folder_is_refused(tmp_path):
    props, other = fake_props(), fake_props(name="Other GPU")
    root = tmp_path / "root"
    overrides(tmp_path / "a", props, [entry(P1, "torch.matmul", 1.0, "p1")])
    publish(tmp_path / "a", str(root))
    # someone copied another device's file over ours
    target = root / "sm_90" / f"{props.signature}.json"
    write_overrides(target, [entry(P1, "torch.matmul", 1.0, "p1")],
                    device={"signature": other.signature, "properties": other.to_dict()}, mode="replace")
    [report] = publish(tmp_path / "a", str(root))
    assert not report.written and other.signature in report.refused


def _publish_one(args):
    root, src = args
    return len(publish(src, root))


def test_concurrent_publishers_lose_no_entries(tmp_path):
    props = fake_props()
    sources = []
    for i in range(6):
        p = matmul_problem(8 + i, 8, 8)
        src = tmp_path / f"src{i}"
        overrides(src, props, [entry(p, "torch.matmul", 1.0, f"p{i}")])
        sources.append((str(tmp_path / "root"), src))
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        assert pool.map(_publish_one, sources) == [1] * 6
    f = load_overrides(tmp_path / "root" / "sm_90" / f"{props.signature}.json")
    assert sorted(e.metadata["problem_name"] for e in f.entries) == [f"p{i}" for i in range(6)]
    assert json.loads((tmp_path / "root" / "index.json").read_text())["files"][props.signature]["entries"] == 6


def test_lookup_exact_then_same_arch_with_a_note(tmp_path):
    props = fake_props()
    root = tmp_path / "root"
    overrides(tmp_path / "a", props, [entry(P1, "torch.matmul", 1.0, "p1")])
    publish(tmp_path / "a", str(root))
    path, note = find_published(str(root), props)
    assert path.endswith(f"{props.signature}.json") and note == ""
    newer_driver = fake_props(driver="590.2")
    path, note = find_published(str(root), newer_driver)
    assert path.endswith(f"{props.signature}.json") and "differs in: driver" in note
    assert find_published(str(root), fake_props(arch="gfx942")) is None


def test_publish_to_an_s3_compatible_store_and_read_back(s3_server, tmp_path, monkeypatch):
    import pyarrow.fs as pafs

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("FARM_PUBLISH_CACHE", str(tmp_path / "cache"))
    fs = pafs.S3FileSystem(endpoint_override=s3_server, scheme="http", region="us-east-1", allow_bucket_creation=True)
    fs.create_dir("tunefarm")
    root = f"s3://tunefarm/overrides?endpoint_override={s3_server}&scheme=http&region=us-east-1"
    props = cpu_device().properties
    overrides(tmp_path / "a", props, [entry(P1, "cpu.matmul.einsum", 1.0, "p1")])
    [report] = publish(tmp_path / "a", root)
    assert report.written
    index = json.loads(fs.open_input_stream("tunefarm/overrides/index.json").read())
    assert index["files"][props.signature]["entries"] == 1
    path, note = find_published(root, props)
    assert note == "" and load_overrides(path).entries[0].engine_name == "cpu.matmul.einsum"
    # the Config policy can point at the bucket directly
    from farm.devices.fb import encode_device_properties, encode_problem
    from farm.model.ids import engine_name_to_id
    from policies.config import ConfigPolicy

    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", root)
    s = ConfigPolicy().session(encode_device_properties(props))
    ids = [engine_name_to_id(n) for n in ("cpu.matmul.blas", "cpu.matmul.einsum")]
    assert s.order(ids, encode_problem(P1)).order[0] == ids[1]


def _two_devices(tmp_path, second_ms=1.0):
    a, b = fake_props(), fake_props(name="Other GPU")
    src = tmp_path / "src"
    overrides(src, a, [entry(P1, "torch.matmul", 1.0, "p1")])
    overrides(src, b, [entry(P1, "torch.matmul", second_ms, "p1")])
    return src, a, b


def _snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and
            not p.name.startswith(".")}


def test_a_publish_where_one_file_is_refused_publishes_none(tmp_path, capsys):
    root = tmp_path / "root"
    src, a, b = _two_devices(tmp_path)
    publish(src, str(root))
    before = _snapshot(root)
    # the second device's winner got slower beyond noise: refused, so the first device's new file waits too
    overrides(src, a, [entry(P1, "triton.gemm", 0.5, "p1"), entry(P2, "triton.gemm", 0.5, "p2")])
    overrides(src, b, [entry(P1, "triton.gemm", 9.0, "p1")])
    capsys.readouterr()
    assert main(["publish", str(src), "--to", str(root)]) == 1
    err = capsys.readouterr().err
    assert "all or nothing" in err and "slower" in err
    assert _snapshot(root) == before


def test_a_publish_with_an_invalid_file_writes_nothing(tmp_path, capsys):
    root = tmp_path / "root"
    src, a, b = _two_devices(tmp_path)
    (src / f"{b.signature}.json").write_bytes(b"\xff\xfe{\x00")  # UTF-16 garbage
    assert main(["publish", str(src), "--to", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"{b.signature}.json" in err and "UTF-8" in err and "Traceback" not in err
    assert not (root / "index.json").exists() and not list(root.rglob("*.json"))


def test_a_write_that_fails_half_way_is_rolled_back(tmp_path, monkeypatch, capsys):
    import farm.store.publish.root as publishing

    root = tmp_path / "root"
    src, a, b = _two_devices(tmp_path)
    overrides(src, a, [entry(P1, "torch.matmul", 1.0, "p1")])
    (src / f"{b.signature}.json").unlink()
    publish(src, str(root))  # a is published; b is not yet
    before = _snapshot(root)
    src2, _, _ = _two_devices(tmp_path / "next")
    overrides(src2, a, [entry(P1, "torch.matmul", 1.0, "p1"), entry(P2, "triton.gemm", 0.5, "p2")])
    real_write = publishing.Store.write
    writes = []

    def failing(self, rel, text):
        writes.append(rel)
        if len(writes) == 2:  # a was written; b's write fails (a full disk, a lost connection)
            raise OSError(28, "No space left on device")
        return real_write(self, rel, text)

    monkeypatch.setattr(publishing.Store, "write", failing)
    assert main(["publish", str(src2), "--to", str(root)]) == 2
    err = capsys.readouterr().err
    assert "No space left" in err and "rolled back: nothing published" in err and "Traceback" not in err
    monkeypatch.setattr(publishing.Store, "write", real_write)
    assert _snapshot(root) == before  # a's old file is back, b's never appeared, the index is as it was
    assert find_published(str(root), b)[1]  # no file of b's own: only a's, of the same arch
