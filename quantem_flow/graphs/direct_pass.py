"""File passes sent straight to the one worker of a cluster, without the scheduler.

On a cluster of one worker process (the embedded default) every task of a
pass over a file goes to that worker: the scheduler has no placement to
choose.  Through it a pass still pays Dask's round trip (the graph's
submission and ordering, the task's transitions, its report, the fetch of
its result and the release of its keys): about twice Dask's own no-op task
on a 2-vCPU VM, which is most of what a small interactive pass costs
(benchmarks/RESULTS.md, "Fifteenth stop").  Here the client sends the worker
one message (the pass's spec and the chunk groups the graph's tasks would
run), the worker runs the groups on its own task threads (the same
``run_chunk_group`` a graph task runs, its tasks sharing their work as they
would), combines them and answers with one partial.

The route is taken only where nothing is given up that a person would see:

* the cluster has exactly one worker, it runs the quantem-flow worker plugin
  (whose handler this is) and it declares the pass's runtime;
* no progress bar is shown (the graph route reports each task as it ends);
* the pass gathers no pixels (SSB streams them back chunk by chunk);
* it is the only pass of its ``compute`` (several go out together as one graph);
* the memory its tasks need together is at most :data:`NEED_SHARE` of the
  worker's pool for it (the scheduler admits graph tasks against that
  budget; these jobs do not count against it).

The worker itself sends a pass back while it is paused or its direct passes
together already need that share of a pool.  A worker that cannot be reached
or has no handler makes the pass run as a graph, and the route rests for
:data:`RETRY_AFTER_S`; the provenance's ``query_route`` says why either way.
The task groups' partials are added as the graph's combine tasks add them, so
the sums have the graph's bits, float data included.  Not covered: a worker
that hangs without dropping its connection makes a direct pass wait as long
(a graph pass waits for its task the same way), and once a group fails the
other groups already running finish before the error is answered.
``qf.config.set(direct_passes=False)`` sends every file pass through the
scheduler.
"""

from __future__ import annotations

import functools
import math
import time
import weakref
from typing import Any

from .pass_groups import run_chunk_group
from .query_service import answer_with, ask_workers, read_request, route_record
from .tasks import ChunkPartial, PassSpec, combine_in_tree, running_on

__all__ = [
    "NEED_SHARE",
    "PASS_HANDLER",
    "RETRY_AFTER_S",
    "direct_pass_blocker",
    "forget_pass_route",
    "install_pass_handler",
    "need_over_share",
    "pass_need",
    "pass_route",
    "run_direct_pass",
]

#: The worker handler's name (an ``op`` of distributed's RPC).
PASS_HANDLER = "qf_direct_pass"

#: Largest share of the worker's memory pool a direct pass's tasks may need together.
NEED_SHARE = 0.25

#: Seconds a route that failed (a worker without the handler, one that did not answer)
#: stays unused before the scheduler is asked again.
RETRY_AFTER_S = 30.0

#: Per client: ``(the cluster's state as the route was taken (:func:`_cluster_state`), route
#: or None, why not, time.monotonic() after which a failed route is asked for again)``.
_KEPT: weakref.WeakKeyDictionary[Any, tuple[tuple[int, int], dict[str, Any] | None, str, float]] = (
    weakref.WeakKeyDictionary()
)


def install_pass_handler(worker: Any) -> None:
    """Add the direct file-pass handler to a Dask worker's RPC handlers."""

    async def handle(spec: Any, groups: bytes) -> dict[str, Any]:
        return await _answer(worker, spec, groups)

    worker.handlers[PASS_HANDLER] = handle


def _run_group(
    where: dict[str, str], spec: PassSpec, chunks: tuple[tuple[int, int, int], ...]
) -> list[tuple[int, ChunkPartial]]:
    with running_on(where):
        return [(chunks[0][0], run_chunk_group(spec, chunks))]


def _reserved(worker: Any) -> dict[str, float]:
    """Bytes of each memory pool the worker's running direct passes need (on its loop)."""
    kept: dict[str, float] | None = getattr(worker, "_qf_direct_reserved", None)
    if kept is None:
        kept = {}
        worker._qf_direct_reserved = kept
    return kept


def need_over_share(
    need: dict[str, float], resources: dict[str, float], reserved: dict[str, float]
) -> str | None:
    """Why a direct pass needing ``need`` bytes per pool is too big, or ``None``.

    Too big where, with what the worker's running direct passes hold
    (``reserved``), it would need more than :data:`NEED_SHARE` of the worker's
    pool (its ``resources``): the scheduler admits graph tasks against the pool,
    and direct passes do not count there.  The client asks it before sending
    (nothing reserved in its view), the worker again as it takes the pass.
    """
    from .capabilities import MEMORY_PREFIX

    for pool, nbytes in need.items():
        budget = float(resources.get(MEMORY_PREFIX + pool, 0.0))
        held = reserved.get(pool, 0.0)
        if held + nbytes > NEED_SHARE * budget:
            beside = f" beside the {held / 2**20:.0f} MiB of direct passes running" if held else ""
            return (
                f"the pass's tasks need {nbytes / 2**20:.0f} MiB of {pool} together{beside}, "
                f"more than {NEED_SHARE:.0%} of the worker's {budget / 2**20:.0f} MiB: the "
                "scheduler admits graph tasks against that budget"
            )
    return None


def _refusal(worker: Any, need: dict[str, float]) -> str | None:
    """Why the worker sends a pass back to the graph now, or ``None`` to run it.

    Not while it is paused (its memory monitor stopped its tasks) or closing,
    nor where :func:`need_over_share` says so with its running direct passes.
    """
    from distributed.core import Status

    if getattr(worker, "status", Status.running) != Status.running:
        return f"the worker is {getattr(worker.status, 'name', worker.status)}"
    total = getattr(getattr(worker, "state", None), "total_resources", {}) or {}
    return need_over_share(need, dict(total), _reserved(worker))


async def _answer(worker: Any, spec_sent: Any, payload_bytes: bytes) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        spec, payload, pickled = read_request(spec_sent, payload_bytes)
        groups: list[tuple[tuple[int, int, int], ...]] = list(payload["groups"])
        need = {str(k): float(v) for k, v in dict(payload.get("need") or {}).items()}
    except Exception as exc:  # a client of another version: say so, the caller falls back
        return {"status": "unreadable", "why": f"{type(exc).__name__}: {exc}"}
    refusal = _refusal(worker, need)
    if refusal is not None:
        return {"status": "busy", "why": refusal}
    where = {"worker": str(worker.address), "worker_name": str(worker.name)}
    jobs = [functools.partial(_run_group, where, spec, tuple(group)) for group in groups]
    reserved = _reserved(worker)
    for pool, nbytes in need.items():  # the loop runs this handler: no other thread adds
        reserved[pool] = reserved.get(pool, 0.0) + nbytes
    try:
        return await answer_with(worker, jobs, t0=t0, per_group=list, pickled=pickled)
    finally:
        for pool, nbytes in need.items():
            reserved[pool] = max(0.0, reserved.get(pool, 0.0) - nbytes)


def _workers_of(dask_scheduler: Any = None) -> list[dict[str, Any]]:
    """Every worker's address, threads and resources (on the scheduler)."""
    return [
        {
            "address": ws.address,
            "nthreads": int(ws.nthreads),
            "resources": {str(k): float(v) for k, v in (ws.resources or {}).items()},
        }
        for ws in dask_scheduler.workers.values()
    ]


def _cluster_state(client: Any) -> tuple[int, int]:
    """What changes when the route may have: the workers counted, the last departure heard.

    The count comes with the client's periodic scheduler update (no request);
    departures (a worker lost or restarted: the same count, another address)
    are pushed by the placement plugin to subscribed clients (:mod:`.pass_watch`).
    """
    from .pass_watch import pass_watch

    kept = getattr(client, "_scheduler_identity", None) or {}
    n = kept.get("n_workers") if isinstance(kept, dict) else None
    try:
        latest = pass_watch(client).latest()
    except Exception:  # a client that cannot subscribe: the count alone
        latest = -1
    return (int(n) if isinstance(n, int) else -1), latest


def pass_route(client: Any) -> tuple[dict[str, Any] | None, str]:
    """The cluster's one worker (``address``, ``nthreads``, ``resources``), or ``None`` and why.

    Asked of the scheduler once and kept with the client until the number
    of workers its periodic scheduler update counts changes, a worker departs
    (one restarted keeps the count and changes the address), or
    :func:`forget_pass_route`.
    """
    from .capabilities import RUNTIME_PREFIX

    counted = _cluster_state(client)
    kept = _KEPT.get(client)
    if kept is not None and kept[0] == counted and time.monotonic() < kept[3]:
        return kept[1], kept[2]
    try:
        workers = client.run_on_scheduler(_workers_of)
    except Exception as exc:  # the scheduler could not say: the graph asks it properly
        return None, f"the scheduler's workers could not be read ({type(exc).__name__}: {exc})"
    route: dict[str, Any] | None = None
    if len(workers) != 1:
        why = f"the cluster has {len(workers)} workers: the scheduler places the tasks"
    elif not any(k.startswith(RUNTIME_PREFIX) for k in workers[0]["resources"]):
        why = "its worker does not run the quantem-flow worker plugin (the pass handler)"
    else:
        route, why = workers[0], ""
    _KEPT[client] = (counted, route, why, math.inf)
    return route, why


def forget_pass_route(client: Any, *, failed: str | None = None) -> None:
    """Drop the kept route: the next pass asks the scheduler again.

    With ``failed`` (why the route failed), file passes take the graph for
    :data:`RETRY_AFTER_S` first, saying why, rather than trying a worker
    without the handler on every pass.
    """
    if failed is None:
        _KEPT.pop(client, None)
        return
    why = f"the direct route failed {RETRY_AFTER_S:.0f} s ago or less: {failed}"
    _KEPT[client] = (_cluster_state(client), None, why, time.monotonic() + RETRY_AFTER_S)


def direct_pass_blocker(
    lowered: Any, route: dict[str, Any], *, progress: bool, n_passes: int
) -> str | None:
    """Why the lowered pass should go through the scheduler, or ``None`` to send it direct."""
    from .capabilities import RUNTIME_PREFIX

    spec: PassSpec = lowered.spec
    if spec.gather is not None:
        return "a gather (SSB) streams its pixels back chunk by chunk"
    if progress:
        return "a progress bar is shown: the graph's tasks report as they end"
    if n_passes > 1:
        return f"{n_passes} passes in one compute go out together as one graph"
    resources = route["resources"]
    if resources.get(RUNTIME_PREFIX + spec.runtime, 0.0) <= 0:
        return f"the worker does not declare runtime {spec.runtime!r}"
    return need_over_share(pass_need(lowered), resources, {})


def run_direct_pass(
    client: Any, lowered: Any, route: dict[str, Any]
) -> tuple[ChunkPartial, dict[str, Any]]:
    """Run a lowered file pass by one message to the cluster's one worker.

    Parameters
    ----------
    client
        The ``distributed.Client``.
    lowered
        The pass as lowered (:class:`~quantem_flow.graphs.lowering.LoweredPass`):
        its spec and the chunks each of its tasks covers.
    route
        :func:`pass_route`'s worker.

    Returns
    -------
    tuple
        The combined partial, and the route's record for provenance.

    Raises
    ------
    DirectQueryUnavailable
        The worker could not be reached or has no handler; the caller runs
        the pass as a graph.
    Exception
        What the kernels raised (a missing file, a corrupt chunk), with its type.
    """
    from distributed.protocol.pickle import dumps

    t0 = time.perf_counter()
    spec: PassSpec = lowered.spec
    chunks = spec.dataset.chunks
    groups = [tuple((i, *chunks[i]) for i in covered) for covered in lowered.covers]
    request = dumps({"groups": groups, "need": pass_need(lowered)})
    parts, seconds = ask_workers(client, PASS_HANDLER, spec, {str(route["address"]): request})
    record = route_record(
        "a file pass on a cluster of one worker: one message to it, no scheduling", seconds, t0
    )
    # the task groups' partials added as the pass's graph adds them (bit for bit)
    return combine_in_tree([p for _, p in parts], lowered.fan_in), record


def pass_need(lowered: Any) -> dict[str, float]:
    """Bytes of each memory pool the lowered pass's tasks need together (``qf_need``)."""
    layer = lowered.graph.layers.get(lowered.spec.pass_name)
    need = ((getattr(layer, "annotations", None) or {}).get("qf_need") or {}).get("total") or {}
    n_tasks = len(lowered.chunk_keys)
    return {str(pool): n_tasks * float(nbytes) for pool, nbytes in need.items()}
