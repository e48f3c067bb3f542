"""Kernel tasks of queries on resident chunks: one task per worker holding chunks.

A query on a persisted dataset (an ADF ring whose inner radius changes at
every query) costs the kernels plus the scheduling of its tasks.  On a busy
machine each task adds latency (messages between the client, the scheduler
and the workers), so the lowering groups a worker's resident chunks into one
task (:func:`~quantem_flow.graphs.lowering.resident_groups`), which runs the
usual kernels on each chunk in turn (:func:`run_resident_group`) and returns
one combined partial: the values, the per-chunk records and the placement
(pinned to the holder, nothing moves) are those of one task per chunk.

Measured, and left out: a "support box" path (``c * frame total + the box
where the weights differ``, exact for integer data) read about a tenth of
each frame for a ring but was no faster than the full structured kernel on
this machine, where reading a strided box costs about as much memory
traffic as the frame (benchmarks/RESULTS.md, "Persisted ring query (issue 14)").
"""

from __future__ import annotations

from ..errors import ParameterError
from ..representations import Chunk
from .tasks import ChunkPartial, PassSpec, combine_partials, run_resident_kernels

__all__ = ["run_resident_group"]


def run_resident_group(spec: PassSpec, indices: tuple[int, ...], *chunks: Chunk) -> ChunkPartial:
    """Run every requested kernel on several resident chunks of one worker, combined.

    Parameters
    ----------
    spec
        The pass.
    indices
        The chunk index of each chunk, in the same order.
    *chunks
        The resident chunks (all held by the worker running the task).

    Returns
    -------
    ChunkPartial
        :func:`~quantem_flow.graphs.tasks.combine_partials` of
        :func:`~quantem_flow.graphs.tasks.run_resident_kernels` on each chunk:
        the same blocks and per-chunk records as one task per chunk.

    Raises
    ------
    ParameterError
        ``indices`` and ``chunks`` differ in length.
    """
    if len(indices) != len(chunks):
        raise ParameterError(
            f"run_resident_group needs one chunk index per chunk, got {len(indices)} indices "
            f"for {len(chunks)} chunks; pass the indices of the chunks given"
        )
    return combine_partials(
        *(run_resident_kernels(spec, chunk, i) for i, chunk in zip(indices, chunks, strict=True))
    )
