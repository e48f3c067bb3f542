"""``compute()``: plan, lower, submit, gather and finish lazy results.

All chunk operators over one dataset (same source, regions, binning and
chunking) merge into ONE pass: their weight maps are de-duplicated and
stacked, their pattern reductions united, and every chunk is read and
decoded once.  Derived operators (DPC, iDPC) then run on the client on the
small gathered results.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .. import config
from ..dataset import Dataset4D
from ..errors import ParameterError
from ..operators.base import (
    ChunkOperator,
    ChunkPlan,
    DerivedOperator,
    LazyResult,
    PassOutputs,
    PlanContext,
    register_executor,
)
from ..operators.probe import ProbeEstimate, estimate_probe, sample_positions, sampled_mean
from ..results import Result
from ..runtimes import BackendChoice, resolve_backend, runtimes_supporting
from .digest import dataset_digest
from .lowering import LoweredPass, lower_pass
from .nonfinite import record_pass, report_result
from .runner import Runner, in_process, progress_default
from .tasks import ChunkPartial

__all__ = ["compute"]


def _collect(targets: Sequence[LazyResult]) -> list[LazyResult]:
    """Return every lazy result needed, dependencies first, each once."""
    order: list[LazyResult] = []
    seen: set[int] = set()

    def visit(node: LazyResult) -> None:
        if id(node) in seen:
            return
        for dep in node.dependencies:
            visit(dep)
        seen.add(id(node))
        order.append(node)

    for t in targets:
        visit(t)
    return order


def dataset_pass_key(ds: Dataset4D) -> tuple[Any, ...]:
    """Key under which operators share one pass: same reads (or resident chunks), same chunks."""
    return (
        repr(sorted(ds.source.identity.to_dict().items())),
        ds.scan_block,
        ds.detector_ops,
        tuple(ds.chunks),
        id(ds.resident) if ds.is_persisted else None,
    )


def _choose_client(client: Any, datasets: list[Dataset4D]) -> Any:
    """Use the client that holds persisted chunks; refuse a mismatch."""
    holders = {id(ds.resident.client): ds.resident for ds in datasets if ds.is_persisted}
    if not holders:
        return client
    for res in holders.values():
        if res.released:
            raise ParameterError(
                "the dataset's resident chunks were released; persist it again or use the "
                "dataset returned by release()"
            )
    if len(holders) > 1:
        raise ParameterError("datasets persisted on different clusters cannot compute together")
    res = next(iter(holders.values()))
    if res.client is None:
        if client is not None and not in_process(client):
            raise ParameterError(
                "the dataset was persisted in-process (client='synchronous' or 'threads'); "
                f"compute it with client='synchronous' or 'threads' (got {client!r}), or persist "
                "it on this client"
            )
        return client if in_process(client) else "synchronous"
    if client is None or client is res.client or client == res.scheduler:
        return res.client
    if isinstance(client, str) or str(client.scheduler.address) != res.scheduler:
        raise ParameterError(
            f"the dataset is persisted on scheduler {res.scheduler}; compute it with that "
            "client (or client=None), or persist it again on this one"
        )
    return client


def _probe_provider(runner: Runner, ds: Dataset4D) -> Any:
    def provide() -> ProbeEstimate:
        pos = sample_positions(ds.scan_shape, int(config.get("probe_sample_frames")))
        pattern = runner.call(sampled_mean, ds, pos)
        return estimate_probe(
            pattern, pattern_from=f"mean of {len(pos)} frames sampled evenly over the scan"
        )

    return provide


def _pass_choice(ds: Dataset4D, backend: str, operations: tuple[str, ...]) -> BackendChoice:
    """The runtime of a pass over ``ds``: the resident runtime for persisted data, else resolved.

    The runtime must declare every operation of the pass on the dataset's
    representation and dtype.
    """
    # A dtype no runtime declares on the representation is one the representation cannot
    # hold (paired real data, say): leave it to the load to say so, in the
    # representation's own words, rather than blaming the runtimes.
    dtype = ds.dtype if runtimes_supporting(operations, ds.representation, ds.dtype) else None
    if not ds.is_persisted:
        return resolve_backend(
            backend, operation=operations, representation=ds.representation, dtype=dtype
        )
    runtime = str(ds.resident.runtime)
    if backend not in ("auto", runtime):
        raise ParameterError(
            f"the dataset is persisted for runtime {runtime!r} but backend={backend!r} was "
            f"requested; moving resident chunks between devices is never done silently. Use "
            f"backend='auto' or {runtime!r}, or persist(backend={backend!r})"
        )
    resolve_backend(  # the resident runtime must run this pass on its chunks (raises if not)
        runtime, operation=operations, representation=ds.representation, dtype=dtype
    )
    resident: BackendChoice = ds.resident.backend
    return resident


def _outputs(
    ds: Dataset4D,
    lowered: LoweredPass,
    partial: ChunkPartial,
    backend: BackendChoice,
    runner: Runner,
    timings: dict[str, float],
    route: dict[str, Any] | None = None,
    weights_travel: str = "inside the pass spec",
) -> PassOutputs:
    R, C = ds.scan_shape
    n_w = len(lowered.weight_keys)
    per_frame = np.empty((R, C, n_w))  # every row is written, or the pass fails below
    covered = np.zeros(R, dtype=bool)
    for (r0, r1), block in partial.blocks:
        per_frame[r0:r1] = block
        covered[r0:r1] = True
    if not covered.all():
        missing = np.flatnonzero(~covered)
        raise ParameterError(f"internal error: scan rows {missing[:10].tolist()} were not computed")
    records = sorted(partial.records, key=lambda r: r["chunk"])
    units = [u for r in records for u in (r.pop("digest_units", None) or [])]
    content_digest = dataset_digest(units, ds)  # docs/data-integrity.md
    details: list[dict[str, Any]] = []
    for r in records:  # once per pass: how each runtime computed (precision, device)
        d = r.pop("runtime_detail", None)
        if d is not None and d not in details:
            details.append(d)
    bytes_read = int(sum(r["bytes_read"] for r in records))
    payload_bytes = int(sum(r.get("payload_bytes", 0) for r in records))
    made = sorted({str(r.get("made", "")) for r in records if r.get("made")})
    checks = sorted({str(r["check"]["check"]) for r in records if isinstance(r.get("check"), dict)})
    layouts: list[Any] = []
    for r in records:  # the payload layout (codec...) once per distinct value
        lay = r.pop("payload", None)
        if lay is not None and lay not in layouts:
            layouts.append(lay)
    runtimes = sorted({r["runtime"] for r in records})
    backend_record = backend.to_dict()
    if ds.is_persisted:
        backend_record = {
            **ds.resident.backend.to_dict(),
            "note": "runtime of the resident chunks (chosen at persist time)",
        }
    execution = {
        "backend": backend_record,
        "scheduler": runner.description,
        "workers_departed": [dict(d) for d in runner.departures],
        "n_chunks": len(records),
        "tasks": dict(lowered.tasks),
        "chunk_rows": ds.chunk_rows,
        "bytes_read": bytes_read,
        "dataset_read_bytes": ds.read_nbytes,
        "read_once": bytes_read == ds.read_nbytes,
        "weights_in_pass": n_w,
        "weights_travel": weights_travel,
        "representation": ds.representation,
        "storage_schema": ds.storage_schema,
        "payload_bytes": payload_bytes,
        "dense_bytes": ds.nbytes,
        "payloads_made_by": made,
        "conversion_checks": checks,
        "payload_layouts": layouts,
        "workers": sorted({r["worker"] for r in records}),
        "runtimes": runtimes,
        "runtime_details": details,
        "resident": ds.resident.describe() if ds.is_persisted else None,
        "query_route": route,
        "read_s_total": float(sum(r["read_s"] for r in records)),
        "kernel_s_total": float(sum(r["kernel_s"] for r in records)),
        "compile_s_total": float(sum(r.get("compile_s", 0.0) for r in records)),
        "hash_s_total": float(sum(r.get("hash_s", 0.0) for r in records)),
        "content_digest": content_digest,
        "chunks": records,
    }
    record_pass(per_frame, lowered.weight_keys, execution)  # NaN/inf values: provenance
    return PassOutputs(
        per_frame={k: per_frame[:, :, i] for i, k in enumerate(lowered.weight_keys)},
        pattern_sum=partial.pattern_sum,
        pattern_max=partial.pattern_max,
        n_frames=R * C,
        execution=execution,
        timings=dict(timings),
    )


def _flatten(items: Iterable[Any]) -> list[LazyResult]:
    out: list[LazyResult] = []
    for item in items:
        if isinstance(item, LazyResult):
            out.append(item)
        elif isinstance(item, dict):
            out.extend(_flatten(item.values()))
        elif isinstance(item, (list, tuple)):
            out.extend(_flatten(item))
        else:
            raise ParameterError(
                f"compute() takes lazy results (from quantem_flow operators), got "
                f"{type(item).__name__}"
            )
    return out


def compute(
    *results: Any,
    client: Any = None,
    backend: str = "auto",
    progress: bool | None = None,
) -> tuple[Result, ...]:
    """Compute lazy results, every operator over one dataset in ONE pass.

    Parameters
    ----------
    *results
        Lazy results (or lists/dicts of them).
    client
        A ``distributed.Client`` (any cluster), or its scheduler's address
        (``"tcp://host:port"``, as ``quantem-flow run --scheduler`` takes;
        connected once per process); ``None`` for the embedded local cluster
        on 127.0.0.1 (started once per process); ``"threads"`` to run in this
        process on a thread per CPU (no cluster to start: Dask's threaded
        scheduler); or ``"synchronous"`` to run in this process on one thread
        (debugging).
    backend
        ``"auto"`` (best available runtime, recorded) or a runtime name.
    progress
        Show a progress bar; ``None`` shows one on a terminal when
        ``config.get("progress")`` is true.

    Returns
    -------
    tuple of Result
        The typed results, in the order given (flattened).
    """
    t_start = time.perf_counter()
    targets = _flatten(results)
    if not targets:
        raise ParameterError("compute() needs at least one lazy result")
    order = _collect(targets)
    datasets = [n.dataset for n in order if n.dataset is not None]
    for ds in datasets:  # a persisted dataset decides its runtime: check before resolving
        if ds.is_persisted:
            _pass_choice(ds, backend, ("frame_pass",))
    resolve_backend(backend)  # an unknown or unavailable runtime fails before any work
    runner = Runner(_choose_client(client, datasets))
    if progress is None:
        progress = progress_default()

    # plan: group chunk operators by the pass they share
    groups: dict[tuple[Any, ...], list[LazyResult]] = {}
    pass_keys: dict[int, tuple[Any, ...]] = {}  # once per dataset: its identity stats the files
    for node in order:
        if isinstance(node.operator, ChunkOperator):
            assert node.dataset is not None
            key = pass_keys.get(id(node.dataset))
            if key is None:
                key = pass_keys[id(node.dataset)] = dataset_pass_key(node.dataset)
            groups.setdefault(key, []).append(node)
    t_plan = time.perf_counter()
    plans: dict[int, ChunkPlan] = {}
    lowered: list[tuple[Dataset4D, LoweredPass, list[LazyResult]]] = []
    choices: list[BackendChoice] = []
    for nodes in groups.values():
        contexts: dict[int, PlanContext] = {}
        first = nodes[0].dataset
        assert first is not None
        shared_probe = PlanContext(first, _probe_provider(runner, first))
        weights: dict[str, np.ndarray] = {}
        radial: dict[str, tuple[float, float, float, float]] = {}
        gathers: list[np.ndarray] = []
        want_sum = want_max = False
        for node in nodes:
            assert node.dataset is not None and isinstance(node.operator, ChunkOperator)
            ctx = contexts.get(id(node.dataset))
            if ctx is None:
                ctx = PlanContext(node.dataset, shared_probe.probe)
                contexts[id(node.dataset)] = ctx
            plan = node.operator.plan(ctx)
            plans[id(node)] = plan
            weights.update(plan.weights)
            radial.update(plan.radial)
            if plan.gather is not None:
                gathers.append(np.asarray(plan.gather, dtype=np.int64))
            want_sum |= plan.want_sum
            want_max |= plan.want_max
        operations = ("frame_pass", "gather") if gathers else ("frame_pass",)
        choice = _pass_choice(first, backend, operations)
        choices.append(choice)
        lowered.append(
            (
                first,
                lower_pass(
                    first,
                    weights,
                    want_sum=want_sum,
                    want_max=want_max,
                    runtime=choice.chosen,
                    resident=first.resident.graph_refs() if first.is_persisted else None,
                    gather=np.unique(np.concatenate(gathers)) if gathers else None,
                    radial=radial,
                    threads=runner.task_threads,
                    processes=runner.task_processes,
                    weights_task=runner.weights_task,
                ),
                nodes,
            )
        )
    t_lower = time.perf_counter()
    partials = runner.run([lp for _, lp, _ in lowered], progress=progress) if lowered else []
    t_pass = time.perf_counter()

    done: dict[int, Result] = {}
    try:
        for i, ((ds, lp, nodes), partial) in enumerate(zip(lowered, partials, strict=True)):
            timings = {
                "plan_s": t_lower - t_plan,
                "pass_s": t_pass - t_lower,
                "pass_bytes_per_s": ds.read_nbytes / max(t_pass - t_lower, 1e-12),
            }
            route = runner.routes[i] if i < len(runner.routes) else None
            outputs = _outputs(
                ds, lp, partial, choices[i], runner, timings, route, runner.weights_travel[i]
            )
            if lp.spec.gather is not None:
                outputs.gathered = runner.gathered[i]
                outputs.gather_indices = lp.spec.gather
            for node in nodes:
                result = plans[id(node)].finalize(outputs)
                result.name = node.name
                report_result(result, plans[id(node)].weights, stacklevel=3)  # NonFiniteWarning
                done[id(node)] = result
    finally:
        runner.cleanup()
    for node in order:
        if isinstance(node.operator, DerivedOperator):
            inputs = [done[id(d)] for d in node.dependencies]
            result = node.operator.finalize(inputs)
            result.name = node.name
            result.provenance.timings["finalize_s"] = time.perf_counter() - t_pass
            done[id(node)] = result
    total = time.perf_counter() - t_start
    for r in done.values():
        r.provenance.timings["compute_total_s"] = total
    return tuple(done[id(t)] for t in targets)


def _compute_one(result: LazyResult, **options: Any) -> Result:
    return compute(result, **options)[0]


register_executor(_compute_one)
