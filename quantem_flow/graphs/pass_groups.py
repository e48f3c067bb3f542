"""Whole chunks of a pass over unpersisted data, grouped into fewer, larger tasks.

A chunk is the unit of reading, of the records in provenance, of the
dashboard's chunk map and of persisting (``chunk_mib``, 128 MiB).  It need not
be the unit of scheduling: every task costs the embedded cluster about 8 ms of
wall time (messages between the client, the scheduler and the worker, on the
same cores the kernels use), and a 2 GiB pass of 16 chunk tasks ran at 8.1 GB/s
through the default where the same pass in 4 tasks ran at 9.8 (in-process
threads: 10.9-11.4 either way; benchmarks/RESULTS.md, issue 24).  A streamed
chunk task holds one piece at a time whatever its chunk, so a task running
several chunks in turn holds no more than one running one, plus the small
results of the chunks it has run.

So a pass's chunks go to tasks in contiguous groups (:func:`group_chunks`):
at least ``pass_tasks_per_thread`` tasks per thread of the cluster (Dask
balances the tail), none covering more than ``pass_task_mib`` logical MiB,
and none whose results (per-frame values, gathered pixels) would exceed
:data:`GROUP_PARTIAL_BYTES` more than one chunk's do (an SSB gather keeps one
chunk per task).  Each task runs the usual chunk pass on each chunk
(:func:`run_chunk_group`) and returns one partial with every chunk's block,
record and gathered pixels: the values, the digest and the records are those
of one task per chunk.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .. import config
from ..errors import ParameterError
from .tasks import ChunkPartial, PassSpec, combine_partials, run_chunk_pass, run_taken_rows
from .work_sharing import LentChunk, PassWork, pass_work

__all__ = ["GROUP_PARTIAL_BYTES", "group_chunks", "run_chunk_group"]

#: Most bytes of results a group of several chunks may keep until its task ends.
GROUP_PARTIAL_BYTES = 64 * 2**20


def group_chunks(
    chunk_bytes: Sequence[int],
    partial_bytes: Sequence[int],
    *,
    threads: int,
    tasks_per_thread: int | None = None,
    task_mib: float | None = None,
) -> list[tuple[int, int]]:
    """Contiguous, half-open ranges ``[i0, i1)`` of chunk indices, one per task.

    Parameters
    ----------
    chunk_bytes
        Logical bytes of each chunk, in chunk order.
    partial_bytes
        Bytes of each chunk's results kept until its task returns (per-frame
        values, gathered pixels).
    threads
        Task threads of the place the pass runs (the cluster's workers, or
        this process).
    tasks_per_thread
        At least this many tasks per thread (while chunks last); default
        ``config.get("pass_tasks_per_thread")``.
    task_mib
        Most logical MiB a task of several chunks covers; default
        ``config.get("pass_task_mib")``.

    Returns
    -------
    list of (int, int)
        Ranges covering every chunk once, in order, of near-equal chunk counts;
        ``[(i, i + 1) ...]`` when no grouping is wanted.

    Raises
    ------
    ParameterError
        ``threads``, ``tasks_per_thread`` or ``task_mib`` below 1, or lengths that differ.
    """
    per_thread = int(
        config.get("pass_tasks_per_thread") if tasks_per_thread is None else tasks_per_thread
    )
    cap_mib = float(config.get("pass_task_mib") if task_mib is None else task_mib)
    if threads < 1 or per_thread < 1 or not cap_mib >= 1:
        raise ParameterError(
            f"chunk groups need threads >= 1, pass_tasks_per_thread >= 1 and pass_task_mib >= 1; "
            f"got threads={threads!r}, pass_tasks_per_thread={per_thread!r}, "
            f"pass_task_mib={cap_mib!r}; set them with qf.config.set(...)"
        )
    n = len(chunk_bytes)
    if len(partial_bytes) != n:
        raise ParameterError(
            f"group_chunks needs one partial size per chunk: {n} chunks, "
            f"{len(partial_bytes)} partial sizes"
        )
    if n == 0:
        return []
    cap = cap_mib * 2**20
    partial_cap = max(GROUP_PARTIAL_BYTES, max(partial_bytes))
    tasks = min(n, max(per_thread * threads, math.ceil(sum(chunk_bytes) / cap)))
    while True:
        spans = _even_spans(n, tasks)
        if tasks == n or all(
            sum(chunk_bytes[a:b]) <= cap and sum(partial_bytes[a:b]) <= partial_cap
            for a, b in spans
        ):
            return spans
        tasks += 1


def _even_spans(n: int, tasks: int) -> list[tuple[int, int]]:
    """``n`` indices in ``tasks`` contiguous runs whose lengths differ by at most one."""
    base, extra = divmod(n, tasks)
    spans: list[tuple[int, int]] = []
    start = 0
    for t in range(tasks):
        stop = start + base + (1 if t < extra else 0)
        spans.append((start, stop))
        start = stop
    return spans


def run_chunk_group(spec: PassSpec, chunks: tuple[tuple[int, int, int], ...]) -> ChunkPartial:
    """Run the pass on several chunks in turn and return one partial (a graph task).

    Parameters
    ----------
    spec
        The pass.
    chunks
        ``(chunk index, first scan row, stop scan row)`` of each chunk, in order.

    Returns
    -------
    ChunkPartial
        Every chunk's blocks and records, sums and maxima combined, and every
        chunk's gathered pixels (the client writes them where they belong).

    Raises
    ------
    ParameterError
        No chunk given.
    """
    if not chunks:
        raise ParameterError("run_chunk_group needs at least one (index, r0, r1) chunk, got none")
    if spec.share_work and spec.pass_name:
        parts = _shared_group(spec, chunks)
    else:
        parts = [run_chunk_pass(spec, i, r0, r1) for i, r0, r1 in chunks]
    merged = combine_partials(*parts)
    merged.gathered = [g for p in parts for g in p.gathered]
    return merged


def _shared_group(spec: PassSpec, chunks: tuple[tuple[int, int, int], ...]) -> list[ChunkPartial]:
    """The group's chunks, then help: other tasks' queued chunks, then their streams' tails.

    A chunk taken from another task's queue goes back to that task, and rows
    taken from a stream to the stream's owner (:mod:`.work_sharing`); this task
    then waits for the chunks others took from its queue, so it returns exactly
    its own chunks, in order.
    """
    parts: list[ChunkPartial] = []
    with pass_work(spec.pass_name) as work:
        mine = work.queue(chunks)
        for i, r0, r1 in mine:
            parts.append(run_chunk_pass(spec, i, r0, r1, work=work))
        while True:
            lent = work.take_chunk()
            if lent is not None:
                _run_lent(spec, work, lent)
                continue
            tail = work.take_rows()
            if tail is None:
                break
            run_taken_rows(spec, work, tail)
        # nothing left to take: the chunks others took from this task are running now
        parts.extend(lent.wait() for lent in reversed(mine.lent))
    return parts


def _run_lent(spec: PassSpec, work: PassWork, lent: LentChunk) -> None:
    """Run a chunk taken from another task's queue; deliver it (or its error) to that task."""

    def run() -> ChunkPartial:
        done = run_chunk_pass(spec, *lent.chunk, work=work)
        for record in done.records:
            record["taken_from_queue"] = (
                "run by another thread of this process for its task, once that thread's own "
                "chunks were done (graphs/work_sharing.py)"
            )
        return done

    lent.run(run)
