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
from typing import Any

import numpy as np
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.task_spec import DataNode, Task, TaskRef

from ..dataset import Dataset4D
from .annotations import validate_annotations
from .tasks import PassSpec, combine_partials, run_chunk_pass

__all__ = ["LoweredPass", "lower_pass"]

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
    spec = PassSpec(dataset=ds, weights=w, want_sum=want_sum, want_max=want_max, runtime=runtime)
    spec_name = f"qf-spec-{token}"
    pass_name = f"qf-pass-{token}"
    comb_name = f"qf-combine-{token}"

    spec_layer = MaterializedLayer({spec_name: DataNode(spec_name, spec)})
    chunk_keys: list[Key] = []
    chunk_tasks: dict[Key, Task] = {}
    for i, (r0, r1) in enumerate(ds.chunks):
        key = (pass_name, i)
        chunk_keys.append(key)
        chunk_tasks[key] = Task(key, run_chunk_pass, TaskRef(spec_name), i, r0, r1)
    pass_annotations = validate_annotations(
        {
            "qf_runtime": runtime,
            "qf_representation": ds.representation,
            "qf_role": "pass",
            "qf_resident": "",
        }
    )
    layers: dict[str, Any] = {
        spec_name: spec_layer,
        pass_name: MaterializedLayer(chunk_tasks, annotations=pass_annotations),
    }
    dependencies: dict[str, set[str]] = {spec_name: set(), pass_name: {spec_name}}

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
