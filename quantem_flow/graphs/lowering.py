"""Lowering a pass over one dataset to a Dask graph with per-key annotations.

The graph has three kinds of layer:

``qf-spec-<token>``
    One data node holding the :class:`~quantem_flow.graphs.tasks.PassSpec`
    (dataset description and weight rows), shipped once to each worker.
``qf-pass-<token>``
    One task per chunk: load (read + decode + transform) and run every
    requested kernel on the chunk while it is in memory.  The chunk is read
    and decoded exactly once and never leaves the task.
``qf-combine-<token>``
    A tree of small merges (fan-in 8) of the partials.

Loading and kernels are fused into one task for unpersisted data: a
separate load task would leave a 128 MiB payload in worker memory for
another task to fetch, which Dask's work stealing may move between
workers.  Persisted datasets (resident chunks) get kernel tasks pinned to
the holder instead.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.task_spec import DataNode, Task, TaskRef

from ..dataset import Dataset4D
from ..representations import Chunk
from .annotations import validate_annotations
from .tasks import (
    PassSpec,
    combine_partials,
    load_resident_chunk,
    run_chunk_pass,
    run_resident_kernels,
)

__all__ = ["LoweredLoad", "LoweredPass", "lower_load", "lower_pass", "max_chunk_nbytes"]

Key = tuple[Any, ...] | str


@dataclasses.dataclass
class LoweredPass:
    """A pass ready to submit.

    Attributes
    ----------
    graph
        The high-level graph (spec, chunk and combine layers).
    chunk_keys
        One key per chunk task, in chunk order.
    output_key
        Key of the final combined partial.
    weight_keys
        Weight-map keys in the order of the spec's weight rows.
    spec
        The pass specification.
    """

    graph: HighLevelGraph
    chunk_keys: list[Key]
    output_key: Key
    weight_keys: list[str]
    spec: PassSpec


def lower_pass(
    ds: Dataset4D,
    weights: dict[str, np.ndarray],
    *,
    want_sum: bool,
    want_max: bool,
    runtime: str,
    fan_in: int = 8,
    resident: Sequence[Any] | None = None,
    gather: np.ndarray | None = None,
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
        Partials merged per combine task.
    resident
        For a persisted dataset: one entry per chunk, either the key of the
        resident chunk on the cluster or (in-process execution) the
        :class:`~quantem_flow.representations.Chunk` itself.  Chunk tasks
        then read the resident chunk (role ``kernel``) instead of the source.

    Returns
    -------
    LoweredPass
        Graph and keys.
    """
    token = uuid.uuid4().hex[:16]
    keys = list(weights)
    k = ds.detector_shape[0] * ds.detector_shape[1]
    w = (
        np.stack([np.asarray(weights[name], dtype=np.float64).reshape(k) for name in keys])
        if keys
        else np.zeros((0, k), dtype=np.float64)
    )
    spec = PassSpec(
        dataset=ds,
        weights=w,
        want_sum=want_sum,
        want_max=want_max,
        runtime=runtime,
        gather=None if gather is None else np.unique(np.asarray(gather, dtype=np.int64)),
    )
    spec_name = f"qf-spec-{token}"
    pass_name = f"qf-pass-{token}"
    comb_name = f"qf-combine-{token}"

    spec_layer = MaterializedLayer({spec_name: DataNode(spec_name, spec)})
    layers: dict[str, Any] = {spec_name: spec_layer}
    dependencies: dict[str, set[str]] = {spec_name: set()}
    chunk_keys: list[Key] = []
    chunk_tasks: dict[Key, Task] = {}
    if resident is not None and len(resident) != len(ds.chunks):
        raise ValueError(f"{len(resident)} resident chunks for {len(ds.chunks)} chunks")
    local: dict[Key, DataNode] = {}
    resident_of: dict[Key, Key] = {}
    for i, (r0, r1) in enumerate(ds.chunks):
        key = (pass_name, i)
        chunk_keys.append(key)
        if resident is None:
            chunk_tasks[key] = Task(key, run_chunk_pass, TaskRef(spec_name), i, r0, r1)
            continue
        ref = resident[i]
        if isinstance(ref, Chunk):  # in-process: the chunk itself is a data node
            local_key = (f"qf-resident-{token}", i)
            local[local_key] = DataNode(local_key, ref)
            ref = local_key
        resident_of[key] = ref
        chunk_tasks[key] = Task(key, run_resident_kernels, TaskRef(spec_name), TaskRef(ref), i)
    role = "pass" if resident is None else "kernel"
    annotations: dict[str, Any] = {
        "qf_runtime": runtime,
        "qf_representation": ds.representation,
        "qf_role": role,
    }
    if role == "pass":
        annotations["qf_nbytes"] = max_chunk_nbytes(ds)
    pass_annotations = validate_annotations(annotations)
    if resident_of:
        for ref in resident_of.values():  # every per-key value is checked here, on the client
            validate_annotations({"qf_resident": ref})
        # a callable layer annotation is evaluated per key by dask when the graph is packed
        pass_annotations["qf_resident"] = resident_of.__getitem__
    if local:
        layers[f"qf-resident-{token}"] = MaterializedLayer(local)
        dependencies[f"qf-resident-{token}"] = set()
    layers[pass_name] = MaterializedLayer(chunk_tasks, annotations=pass_annotations)
    dependencies[pass_name] = {spec_name} | ({f"qf-resident-{token}"} if local else set())

    level: list[Key] = list(chunk_keys)
    depth = 0
    combine_tasks: dict[Key, Task] = {}
    while len(level) > 1 or depth == 0:
        nxt: list[Key] = []
        for j in range(0, len(level), fan_in):
            ckey: Key = (comb_name, depth, j // fan_in)
            group = level[j : j + fan_in]
            combine_tasks[ckey] = Task(ckey, combine_partials, *(TaskRef(g) for g in group))
            nxt.append(ckey)
        level = nxt
        depth += 1
    layers[comb_name] = MaterializedLayer(
        combine_tasks,
        annotations=validate_annotations({"qf_role": "combine", "qf_runtime": "any"}),
    )
    dependencies[comb_name] = {pass_name}
    graph = HighLevelGraph(layers, dependencies)
    return LoweredPass(
        graph=graph, chunk_keys=chunk_keys, output_key=level[0], weight_keys=keys, spec=spec
    )


def max_chunk_nbytes(ds: Dataset4D) -> int:
    """Bytes of the largest chunk as loaded (after transforms)."""
    rows = max(r1 - r0 for r0, r1 in ds.chunks)
    return int(rows * ds.shape[1] * ds.shape[2] * ds.shape[3] * ds.dtype.itemsize)


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
        }
    )
    graph = HighLevelGraph(
        {
            ds_name: MaterializedLayer({ds_name: DataNode(ds_name, ds)}),
            name: MaterializedLayer(tasks, annotations=annotations),
        },
        {ds_name: set(), name: {ds_name}},
    )
    return LoweredLoad(graph=graph, keys=keys)
