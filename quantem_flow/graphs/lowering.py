"""Lowering a pass over one dataset to a Dask graph with per-key annotations.

The graph has these kinds of layer:

``qf-weights-<content digest>``
    One data node holding the pass's weight rows, keyed by their content;
    the client holds it between passes, and a pass that repeats them names
    the held key instead (:mod:`.held_weights`).
``qf-spec-<token>``
    One data node holding the :class:`~quantem_flow.graphs.tasks.PassSpec`
    without its weight rows, shipped once to each worker, where the spec
    carries its data (an in-memory array) or pickles large; otherwise every
    chunk task carries it (about 2 KB).  A pass of one chunk task whose
    weights are not held carries the whole spec, rows included.
``qf-pass-<token>``
    One task per chunk: load (read + decode + transform) and run every
    requested kernel on the chunk while it is in memory.  The chunk is read
    and decoded exactly once and never leaves the task.
``qf-combine-<token>``
    A tree of merges (fan-in 8) of partials holding sum or maximum patterns;
    partials of scan blocks only are merged by whoever runs the pass.

Loading and kernels are fused into one task for unpersisted data: a
separate load task would leave a 128 MiB payload in worker memory for
another task to fetch, which Dask's work stealing may move between
workers.  Persisted datasets (resident chunks) get kernel tasks pinned to
the holder instead: on a cluster one task per holding worker
(:func:`resident_groups`), in-process one per chunk.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.task_spec import DataNode, Task, TaskRef

from .. import config
from ..dataset import Dataset4D
from ..io.read_method import checked_read_method
from ..representations import Chunk
from ..representations.detector_ops import binned_dtype
from .annotations import validate_annotations
from .capabilities import memory_pool
from .pass_groups import group_chunks, run_chunk_group
from .resident_query import run_resident_group
from .streamed import map_piece_bytes, piece_bytes
from .tasks import (
    PassSpec,
    combine_partials,
    load_resident_chunk,
    reduce_in_tree,
    run_chunk_pass,
    run_resident_kernels,
    with_weights,
)
from .work_sharing import why_not_shared

__all__ = [
    "PATTERN_FAN_IN",
    "LoweredLoad",
    "LoweredPass",
    "MemoryNeed",
    "lower_load",
    "lower_pass",
    "max_chunk_nbytes",
    "pass_info",
    "resident_groups",
    "streamed_piece_bytes",
    "task_memory_need",
]

Key = tuple[Any, ...] | str


@dataclasses.dataclass
class LoweredPass:
    """A pass ready to submit.

    Attributes
    ----------
    graph
        The high-level graph (spec, chunk and combine layers).
    chunk_keys
        One key per chunk task, in chunk order; for a persisted dataset on a
        cluster, one per worker group (:func:`resident_groups`), keyed by its
        first chunk.
    output_key
        Key of the final combined partial; ``None`` when the pass has no
        combine tasks (partials of scan blocks only): whoever runs it merges
        the chunk partials with :func:`~quantem_flow.graphs.tasks.combine_partials`.
    weight_keys
        Weight-map keys in the order of the spec's weight rows.
    spec
        The pass specification.
    covers
        Per chunk key, the indices of the chunks its task runs (several for a group of
        unpersisted chunks, :mod:`.pass_groups`, or a worker's resident chunks).
    tasks
        How the chunks went to tasks, for provenance: ``{"n_tasks", "chunks_per_task",
        "threads", "rule"}``.
    weights_key
        Key of the weight rows' data task (their content: :mod:`.held_weights`);
        ``None`` where ``held_weights_mib`` is 0.
    weights_task
        Whether the graph has that task and the chunk tasks take the rows from
        it; otherwise they travel inside the spec.
    """

    graph: HighLevelGraph
    chunk_keys: list[Key]
    output_key: Key | None
    weight_keys: list[str]
    spec: PassSpec
    covers: list[tuple[int, ...]]
    tasks: dict[str, Any]
    weights_key: str | None = None
    weights_task: bool = False
    #: Partials per combine task of the pass's tree; 0 where it has none (its partials
    #: are merged in one run): :func:`~quantem_flow.graphs.tasks.combine_in_tree`
    fan_in: int = 0


#: Partials per combine task when they hold sum or maximum patterns.
PATTERN_FAN_IN = 8

#: Stacked weight rows of recent passes, newest last (:func:`stacked_rows`).
_RECENT_ROWS: list[tuple[tuple[str, ...], np.ndarray]] = []
_RECENT_ROWS_LOCK = threading.Lock()  # passes are lowered on several threads at once

#: How many stacks :data:`_RECENT_ROWS` keeps, and the largest it keeps (bytes).
RECENT_ROWS_KEPT = 4
RECENT_ROWS_MAX_BYTES = 16 * 2**20


def stacked_rows(weights: Mapping[str, np.ndarray], k: int) -> np.ndarray:
    """``weights`` as one read-only ``(n, k)`` float64 array, rows in the mapping's order.

    A pass whose maps equal, value for value, those of one of the last
    :data:`RECENT_ROWS_KEPT` passes (the same query again, an explorer going back
    to a ring) gets that pass's array: a fresh one costs its page faults (0.6 MB
    for BF + ADF + CoM at 128 x 128, 80 faults, 0.25 ms in a pass here).  Each map
    is compared in full, so whatever the keys mean to the operators that chose
    them, equal rows are the only ones shared.
    """
    keys = tuple(weights)
    if not keys:
        return np.zeros((0, k), dtype=np.float64)
    maps = [np.asarray(weights[name], dtype=np.float64).reshape(k) for name in keys]
    with _RECENT_ROWS_LOCK:
        for i, (seen, rows) in enumerate(_RECENT_ROWS):
            if seen == keys and all(np.array_equal(r, m) for r, m in zip(rows, maps, strict=True)):
                _RECENT_ROWS.append(_RECENT_ROWS.pop(i))
                return rows
    rows = np.stack(maps)
    rows.flags.writeable = False
    if rows.nbytes <= RECENT_ROWS_MAX_BYTES:
        with _RECENT_ROWS_LOCK:
            _RECENT_ROWS.append((keys, rows))
            del _RECENT_ROWS[:-RECENT_ROWS_KEPT]
    return rows


def lower_pass(
    ds: Dataset4D,
    weights: dict[str, np.ndarray],
    *,
    want_sum: bool,
    want_max: bool,
    runtime: str,
    fan_in: int | None = None,
    resident: Sequence[Any] | None = None,
    gather: np.ndarray | None = None,
    radial: Mapping[str, tuple[float, float, float, float]] | None = None,
    threads: int | None = None,
    weights_task: Callable[[str], bool] | None = None,
    processes: int = 1,
) -> LoweredPass:
    """Build the graph of one fused pass over ``ds``.

    Parameters
    ----------
    ds
        The dataset.
    weights
        ``{key: (k_r, k_c) float64}`` weight maps, de-duplicated by key.
    want_sum, want_max
        Pattern reductions.
    runtime
        Runtime the chunk kernels run on.
    fan_in
        Partials merged per combine task; by default :data:`PATTERN_FAN_IN` when
        a sum or maximum pattern is asked for (each partial holds a detector-sized
        array: a tree frees them as it goes) and no combine task otherwise:
        partials of scan blocks add up to the result's size whatever merges
        them, and the client fetches every chunk's partial anyway (progress,
        gathered pixels), so it merges them itself, one task round trip fewer
        after the last chunk (``output_key`` is then ``None``).
    resident
        For a persisted dataset: one entry per chunk, either the key of the
        resident chunk on the cluster or (in-process execution) the
        :class:`~quantem_flow.representations.Chunk` itself.  Chunk tasks
        then read the resident chunk (role ``kernel``) instead of the source.
    radial
        ``{key: (centre row, centre col, scale row, scale col)}`` of disk and annulus
        maps (:attr:`~quantem_flow.operators.base.ChunkPlan.radial`), shipped per row.
    threads
        Task threads of where the pass runs: the chunks of an unpersisted dataset
        go to tasks in groups, at least ``pass_tasks_per_thread`` per thread
        (:func:`~quantem_flow.graphs.pass_groups.group_chunks`); ``None``: one
        task per chunk.
    weights_task
        Given the weights' task key, whether a pass of ONE chunk task takes its
        weight rows from a data task (the runner's
        :meth:`~quantem_flow.graphs.runner.Runner.weights_task`: the client holds
        them, or sent them lately); ``None``: such a pass carries them in its task.
        A pass of several tasks always does while ``held_weights_mib`` is above 0
        (:mod:`.held_weights`).
    processes
        Processes those threads are in (the cluster's workers; 1 in this
        process).  Where it is one and every task of the pass can start at once
        (one task per thread), the tasks share their work
        (:mod:`.work_sharing`, the ``share_work`` setting) instead of running
        ``pass_tasks_per_thread`` tasks per thread for Dask to balance.

    Returns
    -------
    LoweredPass
        Graph and keys.
    """
    token = uuid.uuid4().hex[:16]
    keys = list(weights)
    k = ds.detector_shape[0] * ds.detector_shape[1]
    w = stacked_rows(weights, k)
    spec = PassSpec(
        # tasks on resident chunks read no source: an in-memory array stays on the client
        dataset=ds if resident is None else ds.for_resident_tasks(),
        weights=w,
        want_sum=want_sum,
        want_max=want_max,
        runtime=runtime,
        gather=None if gather is None else np.unique(np.asarray(gather, dtype=np.int64)),
        stream_piece_bytes=piece_bytes(),
        map_piece_bytes=map_piece_bytes(),
        complement_queries=bool(config.get("complement_queries")),
        radial=tuple((radial or {}).get(name) for name in keys),
        radial_queries=bool(config.get("radial_queries")),
        read_method=checked_read_method(str(config.get("read_method"))),
        digest_in_kernel=bool(config.get("digest_in_kernel")),
        pass_name=f"qf-pass-{token}",
    )
    spec_name = f"qf-spec-{token}"
    pass_name = spec.pass_name
    comb_name = f"qf-combine-{token}"

    kind = "pass" if resident is None else "resident pass"
    announce = validate_annotations({"qf_pass": pass_info(ds, pass_name, kind)})
    if resident is not None and len(resident) != len(ds.chunks):
        raise ValueError(f"{len(resident)} resident chunks for {len(ds.chunks)} chunks")
    groups = None if resident is None else resident_groups(ds, resident)
    gather_pixels = 0 if spec.gather is None else len(spec.gather)
    spans: list[tuple[int, int]] | None = None  # chunk runs of unpersisted data, one per task
    sharing = _work_sharing(ds, want_sum=want_sum, resident=resident is not None)
    if resident is None and threads is None:
        spans = [(i, i + 1) for i in range(len(ds.chunks))]
        sharing = "off: one task per chunk (no threads given to group them for)"
    elif resident is None and threads is not None:
        sizes = [(r1 - r0) * _row_bytes(ds) for r0, r1 in ds.chunks]
        partials = [
            partial_bytes(ds, r1 - r0, n_weights=len(keys), gather_pixels=gather_pixels)
            for r0, r1 in ds.chunks
        ]
        spans, sharing = _shared_spans(sizes, partials, threads, processes, sharing)
        if spans is None:
            spans = group_chunks(sizes, partials, threads=threads)
    spec = dataclasses.replace(spec, share_work=sharing.startswith("on"))
    n_tasks = len(spans) if spans is not None else len(groups) if groups else len(ds.chunks)
    layers: dict[str, Any] = {}
    dependencies: dict[str, set[str]] = {}
    spec_arg, weights_key = _spec_argument(
        spec, spec_name, n_tasks, weights_task, layers, dependencies, announce
    )
    inline_spec = spec_name not in layers
    weights_deps = {weights_key} if weights_key is not None and weights_key in layers else set()
    weights_as_task = bool(weights_deps)
    chunk_keys: list[Key] = []
    chunk_tasks: dict[Key, Task] = {}
    covers: dict[Key, tuple[int, ...]] = {}
    local: dict[Key, DataNode] = {}
    resident_of: dict[Key, Key] = {}
    for i0, i1 in spans or ():  # whole chunks of unpersisted data, run in turn per task
        key = (pass_name, i0)
        chunk_keys.append(key)
        covers[key] = tuple(range(i0, i1))
        if i1 - i0 == 1 and not spec.share_work:
            chunk_tasks[key] = Task(key, run_chunk_pass, spec_arg, i0, *ds.chunks[i0])
        else:
            run = tuple((i, *ds.chunks[i]) for i in range(i0, i1))
            chunk_tasks[key] = Task(key, run_chunk_group, spec_arg, run)
    for members in groups or ():  # one kernel task per holding worker, over all its chunks
        assert resident is not None
        key = (pass_name, members[0])
        chunk_keys.append(key)
        covers[key] = tuple(members)
        resident_of[key] = resident[members[0]]
        refs = (TaskRef(resident[i]) for i in members)
        chunk_tasks[key] = Task(key, run_resident_group, spec_arg, tuple(members), *refs)
    # resident chunks whose holders are not grouped (in-process): one kernel task per chunk
    for i, ref in enumerate(resident if resident is not None and not groups else ()):
        key = (pass_name, i)
        chunk_keys.append(key)
        covers[key] = (i,)
        if isinstance(ref, Chunk):  # in-process: the chunk itself is a data node
            local_key = (f"qf-resident-{token}", i)
            local[local_key] = DataNode(local_key, ref)
            ref = local_key
        resident_of[key] = ref
        chunk_tasks[key] = Task(key, run_resident_kernels, spec_arg, TaskRef(ref), i)
    role = "pass" if resident is None else "kernel"
    annotations: dict[str, Any] = {
        "qf_runtime": runtime,
        "qf_representation": ds.representation,
        "qf_role": role,
    }
    if role == "pass":
        annotations["qf_nbytes"] = max_chunk_nbytes(ds)
        annotations["qf_need"] = task_memory_need(
            ds,
            runtime=runtime,
            n_weights=len(keys),
            want_sum=want_sum,
            want_max=want_max,
            gather_pixels=gather_pixels,
            piece_bytes=streamed_piece_bytes(
                ds, runtime, spec.stream_piece_bytes, map_piece=spec.map_piece_bytes
            ),
            chunks_per_task=max(len(c) for c in covers.values()),
        ).to_annotation()
    for covered in covers.values():  # every per-key value is checked here, on the client
        validate_annotations({"qf_chunks": covered})
    pass_annotations = validate_annotations(annotations)
    # a callable layer annotation is evaluated per key by dask when the graph is packed
    pass_annotations["qf_chunks"] = covers.__getitem__
    if inline_spec:
        pass_annotations.update(announce)  # on the one chunk task: the pass announces itself
    if resident_of:
        for ref in resident_of.values():  # every per-key value is checked here, on the client
            validate_annotations({"qf_resident": ref})
        pass_annotations["qf_resident"] = resident_of.__getitem__
    if local:
        layers[f"qf-resident-{token}"] = MaterializedLayer(local)
        dependencies[f"qf-resident-{token}"] = set()
    layers[pass_name] = MaterializedLayer(chunk_tasks, annotations=pass_annotations)
    dependencies[pass_name] = (
        ({spec_name} if not inline_spec else set())
        | weights_deps
        | ({f"qf-resident-{token}"} if local else set())
    )

    if spans is not None and threads is not None and spec.share_work:
        rule = (
            f"whole chunks in contiguous groups: one task per thread of {threads} in one "
            f"process (they share their work), each at most pass_task_mib="
            f"{config.get('pass_task_mib')} MiB (graphs/pass_groups.py)"
        )
    elif spans is not None and threads is not None:
        rule = (
            f"whole chunks in contiguous groups: at least pass_tasks_per_thread="
            f"{config.get('pass_tasks_per_thread')} tasks per thread of {threads}, each at most "
            f"pass_task_mib={config.get('pass_task_mib')} MiB (graphs/pass_groups.py)"
        )
    elif groups:
        rule = "one task per thread of each worker holding resident chunks (resident_groups)"
    else:
        rule = "one task per chunk"
    tasks_record = {
        "n_tasks": len(chunk_keys),
        "chunks_per_task": sorted({len(c) for c in covers.values()}),
        "threads": threads,
        "rule": rule,
        "work_sharing": sharing,
    }
    if fan_in is None and not (want_sum or want_max):
        graph = HighLevelGraph(layers, dependencies)
        return LoweredPass(
            graph=graph,
            chunk_keys=chunk_keys,
            output_key=None,
            weight_keys=keys,
            spec=spec,
            covers=[covers[k] for k in chunk_keys],
            tasks=tasks_record,
            weights_key=weights_key,
            weights_task=weights_as_task,
        )
    if fan_in is None:
        fan_in = PATTERN_FAN_IN
    combine_tasks: dict[Key, Task] = {}

    def combine_task(group: Sequence[Key], depth: int, index: int) -> Key:
        ckey: Key = (comb_name, depth, index)
        combine_tasks[ckey] = Task(ckey, combine_partials, *(TaskRef(g) for g in group))
        return ckey

    output_key = reduce_in_tree(chunk_keys, fan_in, combine_task)
    layers[comb_name] = MaterializedLayer(
        combine_tasks,
        annotations=validate_annotations({"qf_role": "combine", "qf_runtime": "any"}),
    )
    dependencies[comb_name] = {pass_name}
    graph = HighLevelGraph(layers, dependencies)
    return LoweredPass(
        graph=graph,
        chunk_keys=chunk_keys,
        output_key=output_key,
        weight_keys=keys,
        spec=spec,
        covers=[covers[k] for k in chunk_keys],
        tasks=tasks_record,
        weights_key=weights_key,
        weights_task=weights_as_task,
        fan_in=fan_in,
    )


def _shared_spans(
    sizes: list[int], partials: list[int], threads: int, processes: int, sharing: str
) -> tuple[list[tuple[int, int]] | None, str]:
    """One task per thread where the pass's tasks may share their work, or ``None`` and why not.

    Sharing needs every task of the pass to start at once in one process: a
    thread whose help finds nothing leaves, and a task that starts later would
    then run alone while it idles.
    """
    if not sharing.startswith("on"):
        return None, sharing
    if threads < 2:
        return None, "off: one thread runs the pass (nothing to share)"
    if processes != 1:
        return None, (
            f"off: the pass runs in {processes} worker processes; Dask balances their "
            f"pass_tasks_per_thread tasks per thread"
        )
    spans = group_chunks(sizes, partials, threads=threads, tasks_per_thread=1)
    if len(spans) > threads:
        return None, (
            f"off: {len(spans)} tasks for {threads} threads (pass_task_mib, or the results a "
            "task keeps): a task that starts later would run alone"
        )
    return spans, sharing


def _work_sharing(ds: Dataset4D, *, want_sum: bool, resident: bool) -> str:
    """Whether a pass's tasks share their work (``on: ...``) or why not (``off: ...``)."""
    if resident:
        why: str | None = "resident chunks are queried where they are held, one task per holder"
    elif not bool(config.get("share_work")):
        why = "the share_work setting is off"
    else:
        why = why_not_shared(ds.dtype, want_sum=want_sum, representation=ds.representation)
    if why is not None:
        return f"off: {why}"
    return (
        "on: a task whose own chunks are done runs chunks still queued for another task of "
        "the pass in its process (for that task), then the later half of the scan rows "
        "another thread's stream has not started, where the runtime's stream can stop "
        "early (graphs/work_sharing.py)"
    )


#: Largest pickled spec (without its weight rows) that each chunk task carries itself.
INLINE_SPEC_BYTES = 64 * 1024


def _spec_argument(
    spec: PassSpec,
    spec_name: str,
    n_tasks: int,
    weights_task: Callable[[str], bool] | None,
    layers: dict[str, Any],
    dependencies: dict[str, set[str]],
    announce: dict[str, Any],
) -> tuple[Any, str | None]:
    """How the chunk tasks get the spec: ``(argument, the weights' key)``.

    Adds the spec's data task (``spec_name``) and the weights' (their key) to
    ``layers`` where they are used: whether they are tells the caller which way
    each went.  The weight rows are a data task of their own, keyed by their
    content (:mod:`.held_weights`), in a pass of several tasks (while
    ``held_weights_mib`` is above 0) and in a pass of one task whose weights the
    runner holds or sent lately (``weights_task``).  The rest of the spec
    (about 2 KB for a file) then travels in every chunk task: no spec task
    round trip before the work starts.  A spec that carries its data (an
    in-memory array) or pickles above :data:`INLINE_SPEC_BYTES` stays a data
    task, sent to each worker once.  A pass of one task whose weights are not
    held carries the whole spec in its task (docs/architecture-notes.md, "The
    fixed cost of a pass through a cluster").  The key is ``None`` where
    ``held_weights_mib`` is 0.
    """
    from .held_weights import held_weights_bytes, weights_task_key

    def spec_task(value: PassSpec) -> TaskRef:
        layers[spec_name] = MaterializedLayer(
            {spec_name: DataNode(spec_name, value)}, annotations=announce
        )
        dependencies[spec_name] = set()
        return TaskRef(spec_name)

    key = weights_task_key(spec.weights) if held_weights_bytes() > 0 else None
    as_task = key is not None and (n_tasks > 1 or (weights_task is not None and weights_task(key)))
    if key is None or not as_task:
        return (spec if n_tasks == 1 else spec_task(spec)), key
    layers[key] = MaterializedLayer({key: DataNode(key, spec.weights)})
    dependencies[key] = set()
    slim = dataclasses.replace(spec, weights=spec.weights[:0])
    spec_value = slim if _travels_inline(slim) else spec_task(slim)
    return Task(None, with_weights, spec_value, TaskRef(key)), key


def _travels_inline(slim: PassSpec) -> bool:
    """Whether every chunk task may carry ``slim`` (a spec without its weight rows)."""
    source = slim.dataset.source
    if source.for_resident_tasks() is not source:  # it carries its data (an in-memory array)
        return False
    import pickle

    try:
        return len(pickle.dumps(slim, protocol=5)) <= INLINE_SPEC_BYTES
    except Exception:  # whatever Dask does with it, it is not small and plain
        return False


def relower(
    lowered: LoweredPass, *, weights_task: Callable[[str], bool] | None = None
) -> LoweredPass:
    """The same pass lowered again (new keys; resident groups from a fresh placement).

    ``weights_task`` as :func:`lower_pass` takes it.
    """
    spec = lowered.spec
    ds = spec.dataset
    resident = ds.resident.graph_refs() if ds.is_persisted else None
    return lower_pass(
        ds,
        dict(zip(lowered.weight_keys, spec.weights, strict=True)),
        want_sum=spec.want_sum,
        want_max=spec.want_max,
        runtime=spec.runtime,
        resident=resident,
        gather=spec.gather,
        radial={
            key: hint
            for key, hint in zip(lowered.weight_keys, spec.radial, strict=False)
            if hint is not None
        },
        weights_task=weights_task,
    )


def resident_groups(ds: Dataset4D, resident: Sequence[Any]) -> list[list[int]] | None:
    """Chunk indices grouped into one kernel task per worker thread, or ``None`` (one per chunk).

    A query on a persisted dataset then costs one kernel task per thread of
    each worker holding chunks (each runs its chunks in turn and returns one
    combined partial) instead of one per chunk: on a busy machine every task
    adds scheduling latency (benchmarks/RESULTS.md, "Persisted ring query
    (issue 14)").  Groups come from the scheduler's ``who_has`` at lowering
    time (:meth:`~quantem_flow.graphs.persist.ResidentChunks.task_groups`), so
    no chunk moves; ``None`` in-process, or when a chunk's holder is unknown.
    """
    res = ds.resident if ds.is_persisted else None
    if res is None or getattr(res, "client", None) is None or len(resident) != len(ds.chunks):
        return None
    groups: list[list[int]] | None = res.task_groups()
    return groups


def max_chunk_nbytes(ds: Dataset4D) -> int:
    """Bytes of the largest chunk as loaded (after transforms)."""
    return max(r1 - r0 for r0, r1 in ds.chunks) * _row_bytes(ds)


def _row_bytes(ds: Dataset4D) -> int:
    """Logical bytes of one scan row (after transforms)."""
    return int(ds.shape[1] * ds.shape[2] * ds.shape[3] * ds.dtype.itemsize)


@dataclasses.dataclass
class LoweredLoad:
    """Graph of the load tasks that make a dataset resident.

    Attributes
    ----------
    graph
        One ``qf-load-<token>`` layer (role ``load``).
    keys
        One key per chunk, in chunk order.
    """

    graph: HighLevelGraph
    keys: list[Key]


def lower_load(ds: Dataset4D, *, runtime: str) -> LoweredLoad:
    """Build the graph that loads every chunk of ``ds`` and keeps it resident."""
    token = uuid.uuid4().hex[:16]
    name = f"qf-load-{token}"
    ds_name = f"qf-dataset-{token}"
    tasks: dict[Key, Task] = {}
    keys: list[Key] = []
    for i, (r0, r1) in enumerate(ds.chunks):
        key = (name, i)
        keys.append(key)
        tasks[key] = Task(key, load_resident_chunk, TaskRef(ds_name), runtime, i, r0, r1)
    annotations = validate_annotations(
        {
            "qf_role": "load",
            "qf_runtime": runtime,
            "qf_representation": ds.representation,
            "qf_nbytes": max_chunk_nbytes(ds),
            "qf_need": task_memory_need(ds, runtime=runtime, kernels=False).to_annotation(),
        }
    )
    graph = HighLevelGraph(
        {
            ds_name: MaterializedLayer(
                {ds_name: DataNode(ds_name, ds)},
                annotations=validate_annotations({"qf_pass": pass_info(ds, name, "persist")}),
            ),
            name: MaterializedLayer(tasks, annotations=annotations),
        },
        {ds_name: set(), name: {ds_name}},
    )
    return LoweredLoad(graph=graph, keys=keys)


def pass_info(ds: Dataset4D, name: str, kind: str) -> dict[str, Any]:
    """What the scheduler's plugin shows of a pass or load (the ``qf_pass`` annotation).

    Parameters
    ----------
    ds
        The dataset passed over.
    name
        The pass's layer name (``qf-pass-...``, ``qf-load-...``), the prefix of its chunk keys.
    kind
        ``"pass"``, ``"resident pass"``, ``"resident query"`` or ``"persist"``.

    Returns
    -------
    dict
        ``{"name", "kind", "label", "scan_shape", "chunks", "row_bytes"}``.
    """
    R, C = (int(x) for x in ds.scan_shape)
    kr, kc = (int(x) for x in ds.detector_shape)
    return {
        "name": name,
        "kind": kind,
        "label": f"{R}x{C} scan, {len(ds.chunks)} chunks, {ds.representation}",
        "scan_shape": [R, C],
        "chunks": [[int(a), int(b)] for a, b in ds.chunks],
        "row_bytes": C * kr * kc * int(ds.dtype.itemsize),
    }


#: Frames an encoded or packed kernel decodes at a time (upper bound for the scratch).
_DECODE_FRAMES = 64


@dataclasses.dataclass(frozen=True)
class MemoryNeed:
    """What one chunk task needs in memory at its peak, per memory pool.

    Attributes
    ----------
    parts
        ``{part: bytes}`` for the largest chunk: ``payload``, ``staging
        buffer``, ``transform scratch``, ``decode scratch``, ``device copy``,
        ``kernel``, ``partial``.
    pools
        ``{pool: bytes}``: the parts summed by the memory they live in
        (:func:`~quantem_flow.graphs.capabilities.memory_pool`).
    rows
        Scan rows of the largest chunk.
    fixed, per_row
        ``{pool: bytes}`` with ``pools == fixed + rows * per_row`` (the need
        is linear in the chunk's rows), for suggesting a chunk size.
    source_row_bytes
        Decoded source bytes of one scan row (what ``chunk_mib`` counts).
    """

    parts: dict[str, int]
    pools: dict[str, int]
    rows: int
    fixed: dict[str, int]
    per_row: dict[str, int]
    source_row_bytes: int

    @property
    def total(self) -> int:
        """Bytes over every pool."""
        return sum(self.pools.values())

    def to_annotation(self) -> dict[str, Any]:
        """Return the ``qf_need`` annotation value (plain ints and strings)."""
        return {
            "total": dict(self.pools),
            "parts": dict(self.parts),
            "rows": self.rows,
            "fixed": dict(self.fixed),
            "per_row": dict(self.per_row),
            "source_row_bytes": self.source_row_bytes,
        }


def _transform_bytes(
    ds: Dataset4D, frames: int, dtype: np.dtype[Any], shape: tuple[int, int]
) -> tuple[int, int, bool]:
    """Scratch of the detector transforms, bytes of their result, and whether it is new memory.

    Mirrors :meth:`Dataset4D.load_block`: crops are views; binning by
    ``np.add.reduceat`` with a wider dtype first casts its input, then makes
    one array per binned axis; a threshold and the final cast or contiguous
    copy make one array each.  Intermediates are summed (an upper bound).
    """
    scratch = 0
    new = False
    contiguous = True
    kr, kc = shape
    for op in ds.detector_ops:
        if op.kind == "crop":
            r0, r1, c0, c1 = op.params
            kr, kc = r1 - r0, c1 - c0
            contiguous = False
            continue
        fr, fc = int(op.params[0]), int(op.params[1])
        acc = binned_dtype(dtype)
        made: list[int] = []
        if acc != dtype or not contiguous:
            made.append(frames * kr * kc * acc.itemsize)  # the cast input
        if fr > 1:
            kr = -(-kr // fr)
            made.append(frames * kr * kc * acc.itemsize)
        if fc > 1:
            kc = -(-kc // fc)
            made.append(frames * kr * kc * acc.itemsize)
        if new:
            scratch += frames * shape[0] * shape[1] * dtype.itemsize  # the previous result
        scratch += sum(made[:-1])
        dtype, shape, new, contiguous = acc, (kr, kc), True, True
    final = frames * kr * kc * ds.dtype.itemsize
    if ds.representation_options.get("threshold") is not None:
        if new:
            scratch += frames * kr * kc * dtype.itemsize
        new = True
    if dtype != ds.dtype or not contiguous:
        if new:
            scratch += frames * kr * kc * dtype.itemsize
        new = True
    return scratch, final, new


def _generic_check(representation: str) -> bool:
    """Whether ``representation`` uses the base class's exactness check (decode and compare)."""
    from ..representations import get_representation
    from ..representations.base import Representation

    return type(get_representation(representation)).check is Representation.check


def _host_copy_value_bytes(runtime: str) -> int | None:
    """Bytes per value of a runtime's own copy of a payload in host memory (its declaration)."""
    from ..runtimes.registry import runtime_specs

    spec = runtime_specs().get(runtime)
    return None if spec is None else spec.host_copy_value_bytes


def streamed_piece_bytes(
    ds: Dataset4D, runtime: str, piece: int, *, map_piece: int = 0
) -> int | None:
    """Bytes of the piece a chunk task of ``ds`` holds when every chunk streams, else ``None``.

    A streamed chunk task (:mod:`.streamed`) reads, decodes and runs its chunk one piece at
    a time, so admission counts one piece, not the chunk: the larger of a read piece and a
    mapped one (``map_piece``, whose pages the task holds until they are dropped).  Asked
    from the declarations on the client: the runtime's class says whether it streams
    (nothing is started).
    """
    from ..runtimes.registry import get_spec, load_attribute
    from .streamed import largest_piece, raw_frame_nbytes, stream_pieces, why_not_streamed

    if piece <= 0 or runtime in ("any", "auto"):
        return None
    try:
        streams = bool(getattr(load_attribute(get_spec(runtime).factory), "streams", False))
    except Exception:  # an unknown or broken runtime is refused elsewhere, with its reason
        return None
    if not streams or any(why_not_streamed(ds, rows, piece) for rows in ds.chunks):
        return None
    frame = raw_frame_nbytes(ds)
    rows = (0, max(r1 - r0 for r0, r1 in ds.chunks))  # the largest chunk's pieces

    def held(target: int) -> int:
        return largest_piece(stream_pieces(rows, int(ds.shape[1]), frame, target)) * frame

    return max(held(piece), held(map_piece) if map_piece > piece else 0)


def _need_parts(
    ds: Dataset4D,
    rows: int,
    *,
    runtime: str,
    kernels: bool,
    n_weights: int,
    want_sum: bool,
    want_max: bool,
    gather_pixels: int,
    piece_bytes: int | None = None,
    chunks_per_task: int = 1,
) -> dict[str, tuple[str, int]]:
    """``{part: (pool, bytes)}`` of one chunk of ``rows`` scan rows.

    ``piece_bytes``: the chunk streams in pieces of this many source bytes, so its
    staging buffer, transform scratch and payload are one piece's.  ``chunks_per_task``:
    the task runs this many such chunks in turn (:mod:`.pass_groups`) and keeps each
    one's results.
    """
    frames = rows * ds.shape[1]
    src_shape = (int(ds.source.shape[2]), int(ds.source.shape[3]))
    src_dtype = np.dtype(ds.source.dtype)
    raw = frames * src_shape[0] * src_shape[1] * src_dtype.itemsize
    k = ds.detector_shape[0] * ds.detector_shape[1]
    logical = frames * k * ds.dtype.itemsize
    host = "host"
    device = memory_pool(runtime) if runtime != "any" else host
    parts: dict[str, tuple[str, int]] = {}
    if ds.representation == "dense" and piece_bytes is not None:
        # streamed: one piece is read, hashed and run at a time into a reused buffer
        piece_frames = max(1, min(frames, piece_bytes // max(raw // max(frames, 1), 1)))
        scratch, final, new = _transform_bytes(ds, piece_frames, src_dtype, src_shape)
        parts["staging buffer (one streamed piece)"] = (host, min(raw, piece_bytes))
        parts["transform scratch"] = (host, scratch + (final if new else 0))
        payload = final
    elif ds.representation == "dense":
        scratch, final, new = _transform_bytes(ds, frames, src_dtype, src_shape)
        # the chunk is decoded into a staging buffer (reused, one per running task); with
        # transforms the payload is a new array made from it
        if new:
            parts["staging buffer"] = (host, raw)
            parts["transform scratch"] = (host, scratch)
            parts["payload"] = (host, final)
        else:
            parts["payload (in the staging buffer)"] = (host, raw)
        payload = final
    elif ds.representation in ds.source.payload_representations:
        # read natively (compressed chunks, events); its size is bounded by the logical size
        parts["payload"] = (host, logical)
        parts["transform scratch"] = (host, logical if ds.detector_ops else 0)
        parts["decode scratch"] = (host, _DECODE_FRAMES * k * 8)
        payload = logical
    else:
        # converted from a dense block (fresh), then checked by decoding it again
        scratch, final, new = _transform_bytes(ds, frames, src_dtype, src_shape)
        verify = str(ds.representation_options.get("verify", "full"))
        if ds.representation == "paired":
            # at most every pixel an event: a 32-bit index and a count each, plus frame offsets
            payload = frames * k * (4 + ds.dtype.itemsize) + (frames + 1) * 8
        else:
            payload = logical
        check = 0
        if verify != "none" and _generic_check(ds.representation):
            # Representation.check decodes the chunk back and compares it with the block
            # (NaN-aware, through float64 temporaries): measured 36 MiB for 8 MiB of uint16
            check = frames * k * (ds.dtype.itemsize + 8)
        parts["decoded block"] = (host, raw)
        parts["transform scratch"] = (host, scratch + (final if new else 0))
        parts["payload"] = (host, payload)
        parts["decode scratch"] = (host, check + _DECODE_FRAMES * k * 8)
    if device != host:
        # the payload is copied into the runtime's memory (cuda, an external worker)
        parts["device copy"] = (device, payload)
    elif (copy_bytes := _host_copy_value_bytes(runtime)) is not None:
        # the runtime copies the payload into its own arrays in the same memory (MLX)
        parts["device copy"] = (host, max(payload, frames * k * copy_bytes))
    if kernels:
        m = n_weights + 1  # the CPU kernel pads to an even number of rows
        work = m * k * 8 + 3 * k * 8  # weights as float64, sum and max patterns (and a copy)
        # the CPU kernel's structure analysis of the weight rows (once per weight stack, then
        # cached): per-pixel coordinates, support signatures and cell labels
        work += (m + 4) * k * 8
        if ds.dtype == np.float16:
            work += frames * k * 4  # widened to float32 for the kernel
        if runtime == "cpu" and ds.representation == "dense" and ds.dtype.kind in "iu":
            from ..runtimes.cpu.scratch import exact_scratch_bytes

            # a pass this process has no compiled kernel for yet runs NumPy's float64
            # products of blocks of frames meanwhile (runtimes/cpu/exact_numpy.py)
            work += exact_scratch_bytes()
        parts["kernel"] = (device, work)
        # a task running several chunks in turn keeps every chunk's results until it ends
        results = partial_bytes(ds, rows, n_weights=n_weights, gather_pixels=gather_pixels)
        parts["partial"] = (host, chunks_per_task * results)
    return parts


def partial_bytes(ds: Dataset4D, rows: int, *, n_weights: int, gather_pixels: int) -> int:
    """Bytes of the results of ``rows`` scan rows a chunk task keeps and serialises.

    Per-frame values (one float64 per weight row, padded to an even count) and
    gathered pixels (counted at 8 bytes, twice: values and their copy), kept once
    and serialised once.
    """
    frames = rows * int(ds.shape[1])
    m = int(n_weights) + 1
    return 2 * frames * (m * 8 + 2 * int(gather_pixels) * 8)


def task_memory_need(
    ds: Dataset4D,
    *,
    runtime: str,
    kernels: bool = True,
    n_weights: int = 0,
    want_sum: bool = True,
    want_max: bool = True,
    gather_pixels: int = 0,
    piece_bytes: int | None = None,
    chunks_per_task: int = 1,
) -> MemoryNeed:
    """Return what the largest chunk task of ``ds`` needs in memory while it runs.

    Counted on the client when the pass is lowered, from the dataset's
    shapes and dtypes alone (nothing is read): the payload, the staging
    buffer it is decoded into, the scratch of detector transforms and of
    decoding or converting a representation, the runtime's copy of the
    payload (device memory for ``cuda``; the same RAM for ``mps``), the
    kernel's working memory and the partial it returns.  Transient
    intermediates are summed, so it is an upper bound.

    Parameters
    ----------
    ds
        The dataset.
    runtime
        Runtime the kernels run on (its memory pool holds the device parts).
    kernels
        False for a load task (persist): no kernel memory and no partial.
    n_weights
        Weight rows of the pass.
    want_sum, want_max
        Pattern reductions of the pass.
    gather_pixels
        Pixels gathered per frame (SSB), 0 for none.
    piece_bytes
        The chunks stream in pieces of this many bytes (:func:`streamed_piece_bytes`):
        a task holds one piece, not its chunk.
    chunks_per_task
        Chunks the largest task runs in turn (:mod:`.pass_groups`): it holds one
        chunk's working memory and every one of those chunks' results.

    Returns
    -------
    MemoryNeed
        Parts, per-pool totals, and the linear model in scan rows.
    """
    rows = max(r1 - r0 for r0, r1 in ds.chunks)

    def of(n_rows: int) -> dict[str, tuple[str, int]]:
        return _need_parts(
            ds,
            n_rows,
            runtime=runtime,
            kernels=kernels,
            n_weights=int(n_weights),
            want_sum=bool(want_sum),
            want_max=bool(want_max),
            gather_pixels=int(gather_pixels),
            piece_bytes=piece_bytes,
            chunks_per_task=int(chunks_per_task),
        )

    def pools(parts: dict[str, tuple[str, int]]) -> dict[str, int]:
        out: dict[str, int] = {}
        for pool, n in parts.values():
            out[pool] = out.get(pool, 0) + int(n)
        return out

    parts = of(rows)
    one = pools(of(1))
    two = pools(of(2))
    per_row = {p: two.get(p, 0) - one.get(p, 0) for p in two}
    fixed = {p: one.get(p, 0) - per_row.get(p, 0) for p in one}
    kr, kc = ds.source.shape[2:]
    return MemoryNeed(
        parts={name: int(n) for name, (_, n) in parts.items()},
        pools=pools(parts),
        rows=int(rows),
        fixed=fixed,
        per_row=per_row,
        source_row_bytes=int(ds.shape[1] * kr * kc * np.dtype(ds.source.dtype).itemsize),
    )
