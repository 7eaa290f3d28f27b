"""The embedded Ray instance on a loaded machine (issue 72): a start that times out is tried once more, what it
started stopped first; a second failure ends in one line that says what to do (run again, or --in-process)."""

import pytest

ray = pytest.importorskip("ray", reason="the farm needs ray[default]")

from farm.errors import FarmError  # noqa: E402
from farm.fleet.on_ray import cluster  # noqa: E402
from farm.fleet.options import DeviceRequest  # noqa: E402


class FakeRay:
    """ray.init failing its first ``failures`` calls as Ray does when its node times out starting."""

    def __init__(self, failures: int) -> None:
        self.failures, self.inits, self.shutdowns = failures, 0, 0

    def init(self, **kwargs):
        self.inits += 1
        if self.inits <= self.failures:
            raise Exception("The current node timed out during startup. This could happen because some of the Ray "
                            "processes failed to startup.\n(30 more lines)")

    def shutdown(self):
        self.shutdowns += 1


@pytest.mark.parametrize("failures", [0, 1])
def test_a_start_that_times_out_once_is_tried_again(monkeypatch, failures):
    fake = FakeRay(failures)
    monkeypatch.setattr(ray, "init", fake.init)
    monkeypatch.setattr(ray, "shutdown", fake.shutdown)
    cluster._init_ray(None, DeviceRequest("cpu", 1))
    assert fake.inits == failures + 1 and fake.shutdowns == failures  # each failed try stopped what it started


def test_a_start_that_keeps_failing_ends_in_one_line_naming_in_process(monkeypatch):
    fake = FakeRay(cluster.LOCAL_START_ATTEMPTS)
    monkeypatch.setattr(ray, "init", fake.init)
    monkeypatch.setattr(ray, "shutdown", fake.shutdown)
    with pytest.raises(FarmError) as got:
        cluster._init_ray(None, DeviceRequest("cpu", 1))
    message = str(got.value)
    assert "\n" not in message and "--in-process" in message and "timed out during startup" in message
    assert fake.inits == fake.shutdowns == cluster.LOCAL_START_ATTEMPTS
