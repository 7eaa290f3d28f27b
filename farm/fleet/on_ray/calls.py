"""The executor seam (farm.fleet.executor.WorkerCalls) over Ray: a worker is an actor, a call a remote method."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from farm.errors import first_line
from farm.fleet.driver import WorkerHandle
from farm.fleet.on_ray.launcher import FarmFailed


def worker_gone() -> tuple[type[BaseException], ...]:
    """Ray's errors for a call to a worker that died, is restarting, or cannot be placed again (its node is gone)."""
    import ray

    return (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
            ray.exceptions.ActorUnschedulableError)


class RayCalls:
    """Discovery runs on an actor while the devices work: nothing here waits for it."""

    def __init__(self) -> None:
        self.gone = worker_gone()

    def expand(self, worker: WorkerHandle, chunk: Sequence[tuple[int, Any]]) -> Any:
        return worker.actor.expand.remote(chunk)

    def ready(self, pending: Any) -> bool:
        import ray

        done, _ = ray.wait([pending], timeout=0)
        return bool(done)

    def result(self, pending: Any) -> dict[int, Any]:
        import ray

        return ray.get(pending)

    def with_device(self, worker: WorkerHandle, fn: Callable[..., Any], *args: Any) -> Any:
        import ray

        try:
            return ray.get(worker.actor.with_device.remote(fn, *args))
        except ray.exceptions.RayTaskError as exc:  # fn raised there: its own error, not Ray's wrapping
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            raise FarmFailed(f"{worker.info.name} failed: {type(cause).__name__}: {first_line(cause)}") from None
