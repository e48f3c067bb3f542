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

A worker that does not answer or has no handler makes the pass run as a
graph, and the provenance's ``query_route`` says why either way.
``qf.config.set(direct_passes=False)`` sends every file pass through the
scheduler.
"""

from __future__ import annotations

import functools
import time
import weakref
from typing import Any

from .pass_groups import run_chunk_group
from .query_service import DirectQueryUnavailable, answer_with, ask_workers, spec_as_sent
from .tasks import ChunkPartial, PassSpec, running_on

__all__ = [
    "NEED_SHARE",
    "PASS_HANDLER",
    "direct_pass_blocker",
    "forget_pass_route",
    "install_pass_handler",
    "pass_route",
    "run_direct_pass",
]

#: The worker handler's name (an ``op`` of distributed's RPC).
PASS_HANDLER = "qf_direct_pass"

#: Largest share of the worker's memory pool a direct pass's tasks may need together.
NEED_SHARE = 0.25

#: Per client: ``(workers the client's scheduler update counted, route or None, why not)``.
_KEPT: weakref.WeakKeyDictionary[Any, tuple[int, dict[str, Any] | None, str]] = (
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


async def _answer(worker: Any, spec_sent: Any, groups_bytes: bytes) -> dict[str, Any]:
    from distributed.protocol.pickle import loads

    t0 = time.perf_counter()
    try:
        spec = spec_as_sent(spec_sent)
        groups: list[tuple[tuple[int, int, int], ...]] = loads(groups_bytes)
    except Exception as exc:  # a client of another version: say so, the caller falls back
        return {"status": "unreadable", "why": f"{type(exc).__name__}: {exc}"}
    where = {"worker": str(worker.address), "worker_name": str(worker.name)}
    jobs = [functools.partial(_run_group, where, spec, tuple(group)) for group in groups]
    return await answer_with(worker, jobs, t0=t0)


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


def _counted_workers(client: Any) -> int:
    kept = getattr(client, "_scheduler_identity", None) or {}
    n = kept.get("n_workers") if isinstance(kept, dict) else None
    return int(n) if isinstance(n, int) else -1


def pass_route(client: Any) -> tuple[dict[str, Any] | None, str]:
    """The cluster's one worker (``address``, ``nthreads``, ``resources``), or ``None`` and why.

    Asked of the scheduler once and kept with the client until the number
    of workers its periodic scheduler update counts changes, or
    :func:`forget_pass_route`.
    """
    from .capabilities import RUNTIME_PREFIX

    counted = _counted_workers(client)
    kept = _KEPT.get(client)
    if kept is not None and kept[0] == counted:
        return kept[1], kept[2]
    workers = client.run_on_scheduler(_workers_of)
    route: dict[str, Any] | None = None
    if len(workers) != 1:
        why = f"the cluster has {len(workers)} workers: the scheduler places the tasks"
    elif not any(k.startswith(RUNTIME_PREFIX) for k in workers[0]["resources"]):
        why = "its worker does not run the quantem-flow worker plugin (the pass handler)"
    else:
        route, why = workers[0], ""
    _KEPT[client] = (counted, route, why)
    return route, why


def forget_pass_route(client: Any) -> None:
    """Drop the kept route: the next pass asks the scheduler again."""
    _KEPT.pop(client, None)


def direct_pass_blocker(
    lowered: Any, route: dict[str, Any], *, progress: bool, n_passes: int
) -> str | None:
    """Why the lowered pass should go through the scheduler, or ``None`` to send it direct."""
    from .capabilities import MEMORY_PREFIX, RUNTIME_PREFIX

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
    layer = lowered.graph.layers.get(spec.pass_name)
    need = ((getattr(layer, "annotations", None) or {}).get("qf_need") or {}).get("total") or {}
    n_tasks = len(lowered.chunk_keys)
    for pool, nbytes in need.items():
        budget = resources.get(MEMORY_PREFIX + str(pool), 0.0)
        if n_tasks * float(nbytes) > NEED_SHARE * budget:
            return (
                f"its {n_tasks} tasks need {n_tasks * float(nbytes) / 2**20:.0f} MiB of "
                f"{pool} together, more than {NEED_SHARE:.0%} of the worker's "
                f"{budget / 2**20:.0f} MiB: the scheduler admits them against that budget"
            )
    return None


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
    address = str(route["address"])
    partials, seconds = ask_workers(client, PASS_HANDLER, spec, {address: dumps(groups)})
    if len(partials) != 1:  # pragma: no cover - ask_workers answers once per request
        raise DirectQueryUnavailable(f"{len(partials)} answers from one worker")
    record = {
        "path": "direct",
        "why": "a file pass on a cluster of one worker: one message to it, no scheduling",
        "workers": 1,
        "worker_s": seconds,
        "round_trip_s": time.perf_counter() - t0,
    }
    return partials[0], record
