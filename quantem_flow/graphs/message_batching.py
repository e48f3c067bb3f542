"""How long the local cluster's processes hold a message back to batch it with others.

Dask sends the small control messages between client, scheduler and workers
(a graph, "run this task", "task finished", "key in memory", "release")
over batched streams that wait up to a fixed interval after each send, so
that a burst of messages goes out in one write: 10 ms from a client, 5 ms
from the scheduler to a worker, 2 ms from a worker and from the scheduler
to a client.  A pass is a chain of such messages (graph -> spec task ->
chunk tasks -> result -> release), and a message that follows another
within the interval waits for it.  Measured on this project's 2-vCPU VM: a
task that does nothing took 10.5 ms there and back on the embedded cluster
when submitted right after another, 3.9 ms alone; a BF + ADF + CoM pass
over 4 x 4 frames through the embedded default took 31.6 ms back to back,
15.8 ms with every interval 0.5 ms (benchmarks/RESULTS.md, "The fixed cost
of a pass", and docs/architecture-notes.md).  Batching pays on a busy cluster of
many small tasks; a quantem-flow pass has tens of chunk tasks, so the
clusters quantem-flow starts (:func:`~quantem_flow.graphs.cluster.start_local_cluster`,
the embedded default) use ``qf.config.get("message_batch_ms")`` on every
stream instead.  Clusters started by others keep Dask's intervals.

The intervals are attributes of ``distributed.batched.BatchedSend``
(``interval``, seconds) held by ``Client.scheduler_comm``,
``Scheduler.stream_comms`` / ``Scheduler.client_comms`` and
``Worker.batched_stream``.  Where one is missing (another Dask version) the
stream keeps its interval and :func:`set_interval` says so by returning
``False``; ``tests/test_message_batching.py`` checks that every stream of
the embedded cluster has the configured interval.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import ParameterError

try:  # distributed is a hard dependency; the guard keeps imports cheap to reason about
    from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin
except ImportError:  # pragma: no cover
    SchedulerPlugin = WorkerPlugin = object

__all__ = [
    "BatchIntervalSchedulerPlugin",
    "BatchIntervalWorkerPlugin",
    "batch_interval_s",
    "set_interval",
]

logger = logging.getLogger("quantem_flow.message_batching")


def batch_interval_s(milliseconds: float | None = None) -> float:
    """The batching interval in seconds: ``milliseconds``, or ``qf.config`` ``message_batch_ms``.

    Raises
    ------
    ParameterError
        A negative or non-finite interval.
    """
    from .. import config

    value = config.get("message_batch_ms") if milliseconds is None else milliseconds
    try:
        ms = float(value)
    except (TypeError, ValueError) as exc:
        raise ParameterError(
            f"message_batch_ms must be a number of milliseconds >= 0, got {value!r}"
        ) from exc
    if not ms >= 0.0 or ms == float("inf"):
        raise ParameterError(f"message_batch_ms must be a number of milliseconds >= 0, got {ms!r}")
    return ms / 1000.0


def set_interval(stream: Any, seconds: float) -> bool:
    """Give one batched stream (``BatchedSend``) the interval ``seconds``.

    Returns
    -------
    bool
        ``False`` when ``stream`` is not a batched stream with an interval
        (left as it is).
    """
    if stream is None or not isinstance(getattr(stream, "interval", None), (int, float)):
        return False
    stream.interval = float(seconds)
    return True


class _Interval:
    """What both plugins hold: the interval, in seconds (see :func:`batch_interval_s`)."""

    name = "quantem-flow-message-batching"

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)


class BatchIntervalSchedulerPlugin(_Interval, SchedulerPlugin):  # type: ignore[misc]
    """Set the interval of the scheduler's streams to every worker and client."""

    async def start(self, scheduler: Any) -> None:
        """Set the streams of the workers and clients already connected."""
        for stream in list(getattr(scheduler, "stream_comms", {}).values()):
            set_interval(stream, self.seconds)
        for stream in list(getattr(scheduler, "client_comms", {}).values()):
            set_interval(stream, self.seconds)

    def add_worker(self, scheduler: Any, worker: str) -> None:
        """A worker registered: its stream exists already (Dask creates it first)."""
        if not set_interval(getattr(scheduler, "stream_comms", {}).get(worker), self.seconds):
            logger.debug("quantem-flow: no batched stream to worker %s to set", worker)

    def add_client(self, scheduler: Any, client: str) -> None:
        """A client connected: its stream is created after this hook, so set it next."""

        def later() -> None:
            set_interval(getattr(scheduler, "client_comms", {}).get(client), self.seconds)

        loop = getattr(scheduler, "loop", None)
        if loop is not None:
            loop.add_callback(later)


class BatchIntervalWorkerPlugin(_Interval, WorkerPlugin):  # type: ignore[misc]
    """Set the interval of a worker's stream to the scheduler."""

    def setup(self, worker: Any) -> None:
        """Set the stream (it exists from the worker's construction on)."""
        set_interval(getattr(worker, "batched_stream", None), self.seconds)
