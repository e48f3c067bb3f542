"""Queries on resident chunks sent straight to the workers that hold them.

A query on a persisted dataset (an ADF ring dragged across the pattern) needs
no scheduling: its chunks are already where they will be computed.  Through
the scheduler a pass still costs its registration, the graph's submission,
the tasks' transitions, the combine task and the gather, about 30 ms on the
embedded default (benchmarks/RESULTS.md, "Close to the machine").  Here the
client sends each worker holding chunks one message (the pass's spec, as Dask
serializes data, and its chunk keys cut into one group per worker thread); the
worker's threads claim the chunks one at a time, each group's partial is added
as the graph's task for that group adds it, and the worker answers with one
partial per group; the client adds the groups as the graph's combine tasks do
(the same bits).  Nothing goes through the scheduler.

The route (which worker holds which chunk, and how many threads it has) is
taken from the scheduler once and kept with the resident chunks
(:meth:`~quantem_flow.graphs.persist.ResidentChunks.route`).  When it no longer
holds (a worker left, a chunk was reloaded elsewhere, a worker without the
handler), :func:`run_direct` raises :class:`DirectQueryUnavailable` and the
caller runs the pass as a graph instead, which Dask's own recovery covers,
and records why.  Errors raised by the kernels are the kernels' errors,
raised on the client as they would be from a task.

``qf.config.set(direct_queries=False)`` sends every query through the
scheduler (the dashboard's task stream then shows them).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..representations import Chunk
from .tasks import (
    ChunkPartial,
    PassSpec,
    combine_in_tree,
    combine_partials,
    run_resident_kernels,
    running_on,
)

__all__ = [
    "HANDLER",
    "DirectQueryBusy",
    "DirectQueryUnavailable",
    "answer_with",
    "ask_workers",
    "install_query_handler",
    "read_request",
    "route_record",
    "run_direct",
    "spec_as_sent",
]

#: Seconds a direct query waits to connect to a holding worker before the graph route
#: takes over (a worker lost since the placement was kept).
CONNECT_TIMEOUT_S = 5.0

#: The worker handler's name (an ``op`` of distributed's RPC).
HANDLER = "qf_resident_query"


class DirectQueryUnavailable(Exception):  # noqa: N818 - a condition, not an error shown to users
    """The direct route cannot run this query; the caller runs it as a graph (why: ``args[0]``)."""


class DirectQueryBusy(DirectQueryUnavailable):
    """The worker sent this one request back (paused, or its direct passes' memory in use)."""


def install_query_handler(worker: Any) -> None:
    """Add the resident-query handler to a Dask worker's RPC handlers."""

    async def handle(spec: Any, groups: bytes) -> dict[str, Any]:
        return await _answer(worker, spec, groups)

    worker.handlers[HANDLER] = handle


class _ChunkQueue:
    """Resident chunks in chunk order, claimed one at a time by the worker's threads.

    Each thread takes the next chunk when it is done with its last, so the
    threads finish within one chunk of each other whatever their speed (a
    static half each finished 5-30 ms apart on two vCPUs sharing their
    memory bandwidth, fifteenth stop); a failure empties the queue, so the
    other threads stop after their current chunk.
    """

    def __init__(self, chunks: Sequence[tuple[int, Chunk]]) -> None:
        self._chunks = collections.deque(chunks)
        self._lock = threading.Lock()

    def take(self) -> tuple[int, Chunk] | None:
        with self._lock:
            return self._chunks.popleft() if self._chunks else None

    def clear(self) -> None:
        with self._lock:
            self._chunks.clear()


def _run_claimed(
    where: dict[str, str], spec: PassSpec, queue: _ChunkQueue
) -> list[tuple[int, ChunkPartial]]:
    done: list[tuple[int, ChunkPartial]] = []
    with running_on(where):
        while (claimed := queue.take()) is not None:
            index, chunk = claimed
            try:
                done.append((index, run_resident_kernels(spec, chunk, index)))
            except BaseException:
                queue.clear()
                raise
    return done


def read_request(spec_sent: Any, payload_bytes: bytes) -> tuple[PassSpec, Any, bool]:
    """A direct request's spec, its payload (unpickled), and whether the spec came pickled.

    A client before the fifteenth stop sends the spec as pickled bytes and reads
    the answer's partial as pickled bytes; the answer is made as it asks.

    Raises
    ------
    Exception
        What unpickling raised, or :class:`TypeError` from :func:`spec_as_sent`.
    """
    from distributed.protocol.pickle import loads

    pickled = isinstance(spec_sent, (bytes, bytearray, memoryview))
    return spec_as_sent(spec_sent), loads(payload_bytes), pickled


def _resident_groups(payload: Any) -> list[tuple[tuple[int, ...], list[Any]]]:
    """The chunk groups of a resident request (an older client sends them alone)."""
    if isinstance(payload, dict):
        return list(payload["groups"])
    return list(payload)


async def _answer(worker: Any, spec_sent: Any, groups_bytes: bytes) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        spec, payload, pickled = read_request(spec_sent, groups_bytes)
        groups = _resident_groups(payload)
    except Exception as exc:  # a client of another version: say so, the caller falls back
        return {"status": "unreadable", "why": f"{type(exc).__name__}: {exc}"}
    data = worker.data
    missing = [key for _, keys in groups for key in keys if key not in data]
    if missing:
        why = f"{len(missing)} chunk(s) not held, e.g. {missing[0]!r}"
        return {"status": "missing", "why": why}
    where = {"worker": str(worker.address), "worker_name": str(worker.name)}
    chunks = sorted(
        ((int(i), data[k]) for indices, keys in groups for i, k in zip(indices, keys, strict=True)),
        key=lambda item: item[0],
    )
    queue = _ChunkQueue(chunks)  # one job per thread the client counted, as many as groups

    def per_group(ordered: list[tuple[int, ChunkPartial]]) -> list[tuple[int, ChunkPartial]]:
        # as the graph's tasks add them: each group's chunks in turn (run_resident_group),
        # whichever thread ran which chunk; the client adds the groups as its tree does
        by_index = dict(ordered)
        return [(int(ix[0]), combine_partials(*(by_index[int(i)] for i in ix))) for ix, _ in groups]

    jobs = [functools.partial(_run_claimed, where, spec, queue) for _ in groups]
    return await answer_with(worker, jobs, t0=t0, per_group=per_group, pickled=pickled)


async def answer_with(
    worker: Any,
    jobs: Sequence[Callable[[], list[tuple[int, ChunkPartial]]]],
    *,
    t0: float,
    per_group: Callable[[list[tuple[int, ChunkPartial]]], list[tuple[int, ChunkPartial]]],
    pickled: bool = False,
) -> dict[str, Any]:
    """Run ``jobs`` on the worker's task threads and answer with one partial per task group.

    Each job returns ``(chunk index, partial)`` pairs; ``per_group`` gets all of
    them in chunk order, whichever thread ran them, and returns ``(first chunk
    index, partial)`` of each of the request's groups, added as the pass's graph
    task would add them; the client adds the groups as the graph's combine tasks
    do (:func:`~quantem_flow.graphs.tasks.combine_in_tree`), so the sums have the
    graph's bits.  The reply: ``{"status": "ok", "parts"}`` (travelling as Dask
    serializes data, arrays out of band), or for a request that came ``pickled``
    (an older client) ``{"status": "ok", "partial"}``, the groups merged and
    pickled as it reads them; ``{"status": "error", "error"}`` (the pickled
    exception, or its text where it cannot travel); with ``seconds`` since
    ``t0`` (:func:`time.perf_counter`).
    """
    from distributed.protocol import to_serialize
    from distributed.protocol.pickle import dumps

    loop = asyncio.get_running_loop()
    executor = worker.executors["default"]
    try:
        done = await asyncio.gather(*(loop.run_in_executor(executor, job) for job in jobs))
        ordered = sorted((pair for pairs in done for pair in pairs), key=lambda pair: pair[0])
        parts = per_group(ordered)
        reply: dict[str, Any] = (
            {"status": "ok", "partial": dumps(combine_partials(*(p for _, p in parts)))}
            if pickled
            else {"status": "ok", "parts": to_serialize(parts)}
        )
    except Exception as exc:
        try:
            reply = {"status": "error", "error": dumps(exc)}
        except Exception:  # an exception that cannot travel: its text does
            text = RuntimeError(f"{type(exc).__name__}: {exc}")
            reply = {"status": "error", "error": dumps(text)}
    reply["seconds"] = time.perf_counter() - t0
    return reply


def run_direct(
    client: Any,
    spec: PassSpec,
    route: dict[str, list[list[int]]],
    keys: Sequence[Any],
    *,
    fan_in: int = 0,
) -> tuple[ChunkPartial, dict[str, Any]]:
    """Run one pass on resident chunks by one message to each holding worker.

    Parameters
    ----------
    client
        The ``distributed.Client`` holding the resident chunks.
    spec
        The pass (no gather).
    route
        ``{worker address: [chunk indices of one thread, ...]}``.
    keys
        The resident chunks' keys, in chunk order.
    fan_in
        The combine tree's fan-in of the pass as lowered (0: none), so the
        groups' sums are added as its graph adds them.

    Returns
    -------
    tuple
        The combined partial, and the route's record for provenance
        (``path``, ``workers``, ``seconds`` per worker).

    Raises
    ------
    DirectQueryUnavailable
        A worker could not be reached, does not hold its chunks or has no
        handler; the caller runs the pass as a graph.
    Exception
        What the kernels raised on a worker.
    """
    from distributed.protocol.pickle import dumps

    t0 = time.perf_counter()
    requests = {
        address: dumps({"groups": [(tuple(g), [keys[i] for i in g]) for g in groups]})
        for address, groups in route.items()
    }
    parts, seconds = ask_workers(client, HANDLER, spec, requests)
    record = route_record(
        "resident chunks: one message to each holding worker, no scheduling", seconds, t0
    )
    return combine_in_tree([p for _, p in parts], fan_in), record


def route_record(why: str, seconds: dict[str, float], t0: float) -> dict[str, Any]:
    """The ``query_route`` provenance of a pass that took a direct route."""
    return {
        "path": "direct",
        "why": why,
        "workers": len(seconds),
        "worker_s": seconds,
        "round_trip_s": time.perf_counter() - t0,
    }


def spec_as_sent(sent: Any) -> PassSpec:
    """The pass spec a direct request carried.

    Dask-serialized (deserialized by the comm, its weights out of band) or,
    from an older client, pickled bytes.

    Raises
    ------
    TypeError
        Neither a spec nor bytes of one.
    """
    from distributed.protocol.pickle import loads

    spec = loads(sent) if isinstance(sent, (bytes, bytearray, memoryview)) else sent
    if not isinstance(spec, PassSpec):
        raise TypeError(f"a direct request carried {type(spec).__name__}, not a PassSpec")
    return spec


def ask_workers(
    client: Any, handler: str, spec: PassSpec, requests: dict[str, bytes]
) -> tuple[list[tuple[int, ChunkPartial]], dict[str, float]]:
    """Send each worker its request (``{address: groups}``) by ``handler``; their partials.

    The spec travels once per worker as Dask serializes data (its weight rows
    out of band, not copied into a pickle).  Returns every worker's ``(first
    chunk index, partial)`` per task group, in chunk order, and each worker's
    seconds.  Raises :class:`DirectQueryUnavailable` where a worker did not
    answer or could not take the request, and what the kernels raised where
    they failed.
    """
    from distributed.protocol import to_serialize
    from distributed.protocol.pickle import loads

    spec_sent = to_serialize(spec)

    async def ask(address: str, groups: bytes) -> dict[str, Any]:
        # connect with a short deadline: a worker that died since the route was kept
        # refuses connections, which distributed retries for its whole connect timeout
        # (30 s); the graph route is the answer long before that
        comm = await client.rpc.connect(address, timeout=CONNECT_TIMEOUT_S)
        client.rpc.reuse(address, comm)
        reply: dict[str, Any] = await getattr(client.rpc(address), handler)(
            spec=spec_sent, groups=groups
        )
        return reply

    async def ask_all() -> list[Any]:
        return list(
            await asyncio.gather(*(ask(a, g) for a, g in requests.items()), return_exceptions=True)
        )

    replies = client.sync(ask_all)
    parts: list[tuple[int, ChunkPartial]] = []
    seconds: dict[str, float] = {}
    for address, reply in zip(requests, replies, strict=True):
        if isinstance(reply, BaseException):
            raise DirectQueryUnavailable(
                f"worker {address} did not answer ({type(reply).__name__}: {reply})"
            )
        status = reply.get("status") if isinstance(reply, dict) else None
        if status == "error":
            raise loads(reply["error"])
        if status != "ok":
            why = reply.get("why") if isinstance(reply, dict) else repr(reply)
            unavailable = DirectQueryBusy if status == "busy" else DirectQueryUnavailable
            raise unavailable(f"worker {address}: {status}: {why}")
        if "parts" in reply:  # deserialized by the comm
            parts.extend((int(i), p) for i, p in reply["parts"])
        else:  # a worker before the fifteenth stop: its groups merged, pickled
            merged = loads(reply["partial"])
            first = min((int(r["chunk"]) for r in merged.records), default=0)
            parts.append((first, merged))
        seconds[address] = float(reply.get("seconds", 0.0))
    return sorted(parts, key=lambda part: part[0]), seconds
