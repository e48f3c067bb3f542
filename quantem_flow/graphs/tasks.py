"""The functions graph tasks run on workers.

They receive plain values (a pass specification, a chunk index, partials)
and return small values; the large chunk payload never leaves the task that
loaded it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from ..dataset import Dataset4D
from ..errors import ShapeError
from ..representations import Chunk
from ..runtimes import get_runtime
from ..runtimes.base import FramePassResult, is_gather_only
from ..runtimes.staging import staged
from .complement_query import Complement, plan_complement
from .digest import Units, chunk_digest, hashes_stored, payload_digests, stored_row_units
from .gathered import in_place_sink
from .radial_query import plan_radial
from .streamed import StreamedChunk, compile_timer_for, run_streamed_chunk
from .work_sharing import PassWork, SharedRows

_Item = TypeVar("_Item")

__all__ = [
    "ChunkPartial",
    "PassSpec",
    "combine_in_tree",
    "combine_partials",
    "load_resident_chunk",
    "reduce_in_tree",
    "resident_digest",
    "run_chunk_pass",
    "run_resident_kernels",
    "run_taken_rows",
    "running_on",
    "with_weights",
]


@dataclasses.dataclass
class PassSpec:
    """Everything a chunk task of one pass needs (shipped once per worker).

    Attributes
    ----------
    dataset
        The dataset (source description, view, chunking).
    weights
        ``(n_weights, k_r * k_c)`` float64 weight rows.
    want_sum, want_max
        Pattern reductions to accumulate.
    runtime
        Runtime name the kernels run on.
    gather
        Sorted unique flat pixel indices to extract per scan position, or
        ``None``.
    stream_piece_bytes
        Bytes a streamed chunk pass reads at a time (chosen on the client
        from ``stream_piece_mib``; 0 loads every chunk whole):
        :mod:`~quantem_flow.graphs.streamed`.
    map_piece_bytes
        Bytes a streamed chunk pass maps at a time where it reads through a map
        and its kernels carry the digest (``map_piece_mib`` on the client; 0: the
        same as ``stream_piece_bytes``).
    complement_queries
        Whether a query on resident chunks may read a wide 0/1 detector through its
        complement (chosen on the client from ``complement_queries``):
        :mod:`~quantem_flow.graphs.complement_query`.
    read_method
        How streamed pieces of contiguous frames are read (``read_method`` on the
        client): :mod:`~quantem_flow.io.read_method`.
    radial
        Per weight row, ``(centre row, centre col, scale row, scale col)`` when the
        row is a disk or annulus around that centre, else ``None``.
    radial_queries
        Whether a query on resident chunks may answer such rows from a radial index
        (``radial_queries`` on the client): :mod:`~quantem_flow.graphs.radial_query`.
    digest_in_kernel
        Whether a streamed chunk may let the runtime's kernels carry the content
        digest in their own sweep (``digest_in_kernel`` on the client):
        docs/digest-in-kernel.md.
    pass_name
        The pass's name (``qf-pass-<token>``): names its gathered-pixel array in a
        process that runs its tasks itself (:mod:`.gathered`), and its shared work.
    share_work
        Whether the pass's tasks in one process share their chunks and stream
        tails (``share_work`` on the client, where the results cannot depend on
        the split): :mod:`.work_sharing`.
    """

    dataset: Dataset4D
    weights: np.ndarray
    want_sum: bool
    want_max: bool
    runtime: str
    gather: np.ndarray | None = None
    stream_piece_bytes: int = 0
    map_piece_bytes: int = 0
    complement_queries: bool = True
    read_method: str = "auto"
    radial: tuple[tuple[float, float, float, float] | None, ...] = ()
    radial_queries: bool = True
    digest_in_kernel: bool = True
    pass_name: str = ""
    share_work: bool = False


def with_weights(spec: PassSpec, weights: np.ndarray) -> PassSpec:
    """``spec`` with its weight rows, which travel as a task of their own (:mod:`.held_weights`).

    Raises
    ------
    ShapeError
        When ``spec`` already has rows, or ``weights`` are not ``(n, k_r * k_c)``.
    """
    k = int(np.prod(spec.dataset.detector_shape))
    if spec.weights.shape[0] != 0 or weights.ndim != 2 or weights.shape[1] != k:
        raise ShapeError(
            f"a pass spec takes its weight rows once, as (n_weights, {k}); the spec has "
            f"{spec.weights.shape[0]} rows and was given an array of shape {weights.shape}"
        )
    return dataclasses.replace(spec, weights=weights)


@dataclasses.dataclass
class ChunkPartial:
    """The small result of one chunk (or of several, once combined)."""

    blocks: list[tuple[tuple[int, int], np.ndarray]]
    pattern_sum: np.ndarray | None
    pattern_max: np.ndarray | None
    records: list[dict[str, Any]]
    #: ``[((r0, r1), (n_pixels, rows, cols) values)]`` of the gathered pixels;
    #: only chunk partials carry them (the client collects them chunk by chunk)
    gathered: list[tuple[tuple[int, int], np.ndarray]] = dataclasses.field(default_factory=list)


#: Where a kernel runs when it runs outside a Dask task (the resident query handler).
_RUNNING_ON: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "qf_running_on", default=None
)


@contextlib.contextmanager
def running_on(where: dict[str, str]) -> Iterator[None]:
    """Name the worker for the records of kernels run in this block outside a Dask task."""
    token = _RUNNING_ON.set(dict(where))
    try:
        yield
    finally:
        _RUNNING_ON.reset(token)


def _in_process() -> dict[str, Any]:
    thread = threading.current_thread()
    if thread is threading.main_thread():
        return {"worker": "in-process (synchronous)", "worker_name": ""}
    return {"worker": f"in-process (thread {thread.name})", "worker_name": ""}


def _where() -> dict[str, Any]:
    named = _RUNNING_ON.get()
    if named is not None:
        return dict(named)
    if "distributed" not in sys.modules:  # not loaded: not on a Dask worker (and not imported)
        return _in_process()
    try:
        from distributed import get_worker

        w = get_worker()
        return {"worker": str(w.address), "worker_name": str(w.name)}
    except (ImportError, ValueError):
        return _in_process()


def _kernels(
    spec: PassSpec,
    chunk: Chunk,
    index: int,
    *,
    t0: float,
    t1: float,
    bytes_read: int,
    resident: bool,
    made: dict[str, Any] | None = None,
    units: Units | None = None,
    hash_s: float = 0.0,
    complement: bool = False,
    radial: bool = False,
) -> ChunkPartial:
    """Run every requested kernel on one chunk handle and package the partial.

    ``t1 - t0`` is the load (read, decode, put) and ``hash_s`` the content
    digest of it (``units``); JIT compilation during the kernels is timed
    apart (``compile_s``) and left out of ``kernel_s``.  ``complement``: a resident
    chunk may be queried through the complement of a detector covering most of the
    frame (:mod:`.complement_query`; exact, recorded under ``query``).
    """
    runtime = get_runtime(spec.runtime)
    if radial:
        answered = _radial(spec, runtime, chunk, index, t0=t0, made=made, units=units)
        if answered is not None:
            return answered
    plan: Complement | None = None
    if complement:
        planned = plan_complement(
            spec.weights,
            spec.dataset.dtype,
            want_sum=spec.want_sum,
            want_max=spec.want_max,
            gather=spec.gather,
            runtime=runtime,
            chunk=chunk,
        )
        if planned is not None:
            made = {**(made or {}), "query": planned.record()}
        if isinstance(planned, Complement):
            plan = planned
            t1 = time.perf_counter()  # the once-per-chunk totals count as preparing the chunk
    (r0, r1), (c0, c1) = chunk.scan_slice
    gathered: np.ndarray | None = None
    gather_only = is_gather_only(
        spec.gather, spec.weights, want_sum=spec.want_sum, want_max=spec.want_max
    )
    with compile_timer_for(runtime, gather_only=gather_only) as compiled:
        if spec.gather is not None:
            gathered = runtime.run_gather(chunk, spec.gather)
        if gather_only:
            # a gather-only pass (SSB alone): no frame pass over the chunk a second time
            out = FramePassResult(np.zeros(((r1 - r0) * (c1 - c0), 0)), None, None)
        else:
            weights = spec.weights if plan is None else plan.weights
            out = runtime.run_frame_pass(
                chunk, weights, want_sum=spec.want_sum, want_max=spec.want_max
            )
            if plan is not None:
                out = plan.restore(out)
    t2 = time.perf_counter()
    return _package(
        spec,
        runtime,
        index,
        (r0, r1),
        (r1 - r0, c1 - c0),
        out,
        gathered,
        timings={
            "read_s": max(t1 - t0 - hash_s, 0.0),
            "hash_s": hash_s,
            "compile_s": compiled.seconds,
            "kernel_s": max(t2 - t1 - compiled.seconds, 0.0),
        },
        compilations=compiled.compilations,
        bytes_read=bytes_read,
        resident=resident,
        residency=chunk.residency,
        made=made,
        units=units,
    )


def _radial(
    spec: PassSpec,
    runtime: Any,
    chunk: Chunk,
    index: int,
    *,
    t0: float,
    made: dict[str, Any] | None,
    units: Units | None,
) -> ChunkPartial | None:
    """A resident chunk's disk and annulus rows from its radial index (:mod:`.radial_query`)."""
    ds = spec.dataset
    if not spec.radial or not runtime.supports("gather", chunk.representation, ds.dtype):
        return None
    plan = plan_radial(
        spec.weights,
        spec.radial,
        ds.dtype,
        ds.detector_shape,
        want_sum=spec.want_sum,
        want_max=spec.want_max,
        gather=spec.gather,
    )
    if plan is None:
        return None
    t1 = time.perf_counter()
    (r0, r1), (c0, c1) = chunk.scan_slice
    with runtime.compile_timer() as compiled:
        answered = plan.run(runtime, chunk, (r1 - r0) * (c1 - c0), ds.dtype.itemsize)
    if answered is None:
        return None  # the index would outgrow a compact chunk: the kernels answer
    out, record = answered
    t2 = time.perf_counter()
    prepare = float(record["index_built_s"]) + float(record["totals_s"])
    return _package(
        spec,
        runtime,
        index,
        (r0, r1),
        (r1 - r0, c1 - c0),
        out,
        None,
        timings={
            "read_s": max(t1 - t0, 0.0) + prepare,  # building the index prepares the chunk
            "hash_s": 0.0,
            "compile_s": compiled.seconds,
            "kernel_s": max(t2 - t1 - prepare - compiled.seconds, 0.0),
        },
        compilations=compiled.compilations,
        bytes_read=0,
        resident=True,
        residency=chunk.residency,
        made={**(made or {}), "query": record},
        units=units,
    )


def _package(
    spec: PassSpec,
    runtime: Any,
    index: int,
    rows: tuple[int, int],
    shape: tuple[int, int],
    out: FramePassResult,
    gathered: np.ndarray | None,
    *,
    timings: dict[str, float],
    compilations: int,
    bytes_read: int,
    resident: bool,
    residency: str,
    made: dict[str, Any] | None,
    units: Units | None,
) -> ChunkPartial:
    """The chunk's partial and provenance record from what its kernels returned."""
    digest = None if units is None else chunk_digest(units, spec.dataset)
    record = {
        "chunk": index,
        "rows": [rows[0], rows[1]],
        "runtime": runtime.name,
        "runtime_detail": runtime.describe(),
        **_where(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "resident": resident,
        "residency": residency,
        "bytes_read": bytes_read,
        "read_s": timings["read_s"],
        "hash_s": timings["hash_s"],
        "compile_s": timings["compile_s"],
        "compilations": compilations,
        "kernel_s": timings["kernel_s"],
        "content_digest": digest,
        "digest_units": units,
        "representation": spec.dataset.representation,
        **({"frame_pass_variant": out.variant} if out.variant is not None else {}),
        **(made or {}),
    }
    # Contiguous, so the partial pickles its values out of band (no copy into the pickle, no
    # scan of it on the worker's event loop): kernels hand back column views of a wider array
    # (docs/architecture-notes.md, "The fixed cost of a pass through a cluster")
    blocks = [(rows, np.ascontiguousarray(out.per_frame).reshape(shape[0], shape[1], -1))]
    return ChunkPartial(
        blocks=blocks,
        pattern_sum=out.pattern_sum,
        pattern_max=out.pattern_max,
        records=[record],
        gathered=[]
        if gathered is None or spec.gather is None
        else [
            (
                rows,
                np.ascontiguousarray(gathered.T).reshape(len(spec.gather), shape[0], shape[1]),
            )
        ],
    )


def _source_bytes(ds: Dataset4D, r0: int, r1: int) -> int:
    return (r1 - r0) * ds.shape[1] * int(np.prod(ds.source.shape[2:])) * ds.source.dtype.itemsize


def _host_chunk(ds: Dataset4D, r0: int, r1: int, payload: Any) -> Chunk:
    return Chunk(
        representation=ds.representation,
        residency="host",
        scan_slice=((r0, r1), (0, ds.shape[1])),
        payload=payload,
        storage_schema=ds.storage_schema,
    )


def run_chunk_pass(
    spec: PassSpec, index: int, r0: int, r1: int, *, work: PassWork | None = None
) -> ChunkPartial:
    """Load one chunk, put it in the runtime, run the fused pass, release it; return the partial.

    ``work``: the pass's shared work in this process (:mod:`.work_sharing`): other
    threads may take the tail of the chunk's scan rows while it streams.
    """
    ds = spec.dataset
    if ds.representation != "dense":
        return _run_chunk_pass(spec, index, r0, r1, None)
    streamed = _run_streamed(spec, index, r0, r1, work)
    if not isinstance(streamed, str):
        return streamed
    made = {"streamed": {"used": False, "why": streamed}}
    # a staging buffer checked out for the task only (admission counts one per running task)
    with staged(ds.raw_block_shape((r0, r1)), ds.source.dtype) as buffer:
        return _run_chunk_pass(spec, index, r0, r1, buffer, made)


def _streamed_rows(
    spec: PassSpec,
    rows: tuple[int, int],
    work: PassWork | None = None,
    part: SharedRows | None = None,
) -> StreamedChunk | str:
    """Scan rows ``rows`` read and run piece by piece (:mod:`.streamed`), or why they were not."""
    into = None if spec.gather is None else in_place_sink(spec.pass_name, rows)
    return run_streamed_chunk(
        spec.dataset,
        get_runtime(spec.runtime),
        rows,
        spec.weights,
        want_sum=spec.want_sum,
        want_max=spec.want_max,
        gather=spec.gather,
        piece_bytes=spec.stream_piece_bytes,
        map_piece_bytes=spec.map_piece_bytes,
        read_method=spec.read_method,
        gather_into=into,
        digest_in_kernel=spec.digest_in_kernel,
        work=work,
        part=part,
    )


def run_taken_rows(spec: PassSpec, work: PassWork, part: SharedRows) -> None:
    """Run scan rows taken from another thread's stream and hand them back (work sharing).

    The owner waits for them: whatever happens, ``part`` is delivered or failed
    (the owner raises the error as its own).
    """

    def streamed() -> StreamedChunk:
        done = _streamed_rows(spec, (part.start, part.stop), work, part)
        if isinstance(done, str):
            raise RuntimeError(
                f"scan rows {part.start}:{part.stop} taken from a streamed chunk could not be "
                f"streamed: {done}"
            )
        return done

    try:
        part.run(streamed)
    finally:
        part.close()


def _run_streamed(
    spec: PassSpec, index: int, r0: int, r1: int, work: PassWork | None = None
) -> ChunkPartial | str:
    """The chunk read and run piece by piece (:mod:`.streamed`), or why it was not."""
    ds = spec.dataset
    runtime = get_runtime(spec.runtime)
    done = _streamed_rows(spec, (r0, r1), work)
    if isinstance(done, str):
        return done
    if spec.gather is not None:
        done.made.setdefault("streamed", {})["gathered"] = (
            "written into the pass's array in this process"
            if done.gathered is None
            else "returned with the chunk"
        )
    return _package(
        spec,
        runtime,
        index,
        (r0, r1),
        (r1 - r0, ds.shape[1]),
        done.result,
        done.gathered,
        timings={
            "read_s": done.read_s,
            "hash_s": done.hash_s,
            "compile_s": done.compile_s,
            "kernel_s": done.kernel_s,
        },
        compilations=done.compilations,
        bytes_read=_source_bytes(ds, r0, r1),
        resident=False,
        residency="host",
        made=done.made,
        units=done.units,
    )


def _run_chunk_pass(
    spec: PassSpec,
    index: int,
    r0: int,
    r1: int,
    buffer: np.ndarray | None,
    why: dict[str, Any] | None = None,
) -> ChunkPartial:
    t0 = time.perf_counter()
    ds = spec.dataset
    if hashes_stored(ds):
        payload, made, units, hash_s = load_stored_whole(ds, r0, r1, buffer=buffer)
    else:
        payload, made = ds.load_payload((r0, r1), buffer=buffer)
        th = time.perf_counter()
        units = payload_digests(ds.representation, payload, (r0, r1))
        hash_s = time.perf_counter() - th
    made = {**made, **(why or {})}
    runtime = get_runtime(spec.runtime)
    handle = runtime.put(_host_chunk(ds, r0, r1, payload))
    try:
        t1 = time.perf_counter()
        return _kernels(
            spec,
            handle,
            index,
            t0=t0,
            t1=t1,
            bytes_read=_source_bytes(ds, r0, r1),
            resident=False,
            made=made,
            units=units,
            hash_s=hash_s,
        )
    finally:
        runtime.release(handle)


def load_stored_whole(
    ds: Dataset4D, r0: int, r1: int, *, buffer: np.ndarray | None = None
) -> tuple[np.ndarray, dict[str, Any], Units, float]:
    """Rows ``r0:r1`` of a source storing one bitshuffle chunk per frame, loaded whole.

    The stored chunks are read once, hashed as stored (the digest every route
    of such a dataset gives: :func:`~quantem_flow.graphs.digest.hashes_stored`),
    and decoded from those same bytes, so the digest names the bytes the
    values came from.  Returns ``(payload, made, units, hash seconds)``.
    """
    stored = ds.stored_block((r0, r1))
    th = time.perf_counter()
    units = stored_row_units(stored, (r0, r1))
    hash_s = time.perf_counter() - th
    shape = ds.raw_block_shape((r0, r1))
    raw = (
        buffer
        if buffer is not None
        and buffer.shape == shape
        and buffer.dtype == ds.source.dtype
        and buffer.flags.c_contiguous
        else np.empty(shape, dtype=ds.source.dtype)
    )
    stored.decode(raw.reshape(stored.n_frames, -1))
    block = ds.transform_block(raw)  # in the staging buffer, as a dense read's payload is
    made = {
        "made": "stored chunks read, decoded whole",
        "payload_bytes": int(block.nbytes),
        "stored_bytes": stored.stored_bytes,
    }
    return block, made, units, hash_s


def load_host_payload(ds: Dataset4D, r0: int, r1: int) -> Any:
    """Load rows ``r0:r1`` of ``ds`` into a payload the caller owns (dense: a fresh array)."""
    if ds.representation == "dense":
        # decode straight into memory the chunk will own (one allocation, no staging copy)
        owned = np.empty(ds.raw_block_shape((r0, r1)), dtype=ds.source.dtype)
        block = ds.load_block((r0, r1), buffer=owned)
        if not (block.flags.owndata or np.shares_memory(block, owned)):
            block = np.array(block, copy=True)  # a read-only view (memory map, in-memory array)
        return block
    payload, _ = ds.load_payload((r0, r1))
    return payload


def load_resident_chunk(ds: Dataset4D, runtime_name: str, index: int, r0: int, r1: int) -> Chunk:
    """Load one chunk and put it in the runtime once; the handle is what Dask holds.

    Forgetting the handle releases it (the worker's data mapping calls the
    runtime's ``release``).  The runtime also gets the recipe to load the same
    payload again (``reload``), so an external worker whose native process
    died re-places the chunk itself (docs/external-workers.md).

    The content digest of the payload is computed here, once, and kept on
    the handle (:func:`resident_digest`): passes over the resident chunk
    record it without hashing again.
    """
    runtime = get_runtime(runtime_name)
    if hashes_stored(ds):
        payload, _, units, hash_s = load_stored_whole(ds, r0, r1)
    else:
        payload = load_host_payload(ds, r0, r1)
        th = time.perf_counter()
        units = payload_digests(ds.representation, payload, (r0, r1))
        hash_s = time.perf_counter() - th
    handle = runtime.put(
        _host_chunk(ds, r0, r1, payload),
        reload=functools.partial(load_host_payload, ds, r0, r1),
    )
    setattr(handle, _DIGEST_ATTR, (units, hash_s))  # an attribute Chunk does not declare
    return handle


#: Attribute of a resident chunk handle holding ``(units, hash seconds)`` of its load.
_DIGEST_ATTR = "qf_content_digest"


def resident_digest(chunk: Chunk) -> tuple[Units | None, float]:
    """Return the digest units computed when ``chunk`` was loaded (``None`` if unknown)."""
    found = getattr(chunk, _DIGEST_ATTR, None)
    if not isinstance(found, tuple) or len(found) != 2:
        return None, 0.0
    units, hash_s = found
    return ([(int(a), int(b), str(d)) for a, b, d in units], float(hash_s))


def run_resident_kernels(spec: PassSpec, chunk: Chunk, index: int) -> ChunkPartial:
    """Run every requested kernel on a resident chunk (nothing is read).

    The chunk's content digest is the one computed when it was loaded;
    ``hash_s`` is 0 here (nothing is hashed again).
    """
    t0 = time.perf_counter()
    units, _ = resident_digest(chunk)
    return _kernels(
        spec,
        chunk,
        index,
        t0=t0,
        t1=t0,
        bytes_read=0,
        resident=True,
        made={"payload_bytes": chunk.nbytes},
        units=units,
        complement=spec.complement_queries,
        radial=spec.radial_queries,
    )


def reduce_in_tree(
    items: Sequence[_Item], fan_in: int, merge: Callable[[Sequence[_Item], int, int], _Item]
) -> _Item:
    """Merge ``items`` ``fan_in`` at a time, level by level, down to one (at least one level).

    ``merge(group, depth, index)`` makes the ``index``-th merge of level ``depth``.
    The one grouping a pass's combine tasks (:func:`~quantem_flow.graphs.lowering.lower_pass`)
    and :func:`combine_in_tree` both follow, so their sums are added in the same order.
    """
    level = list(items)
    depth = 0
    while len(level) > 1 or depth == 0:
        level = [
            merge(level[j : j + fan_in], depth, j // fan_in) for j in range(0, len(level), fan_in)
        ]
        depth += 1
    return level[0]


def combine_in_tree(parts: Sequence[ChunkPartial], fan_in: int) -> ChunkPartial:
    """Merge partials as a pass's combine tasks do: ``fan_in`` at a time, level by level.

    With ``fan_in`` of 0 (a pass without combine tasks) the parts are merged in
    one run, as the client merges them.  Either way the sums are added in the
    same order as the graph adds them, so a route that runs the same task
    groups elsewhere gives the graph's bits on float data too.
    """
    if fan_in <= 0 or not parts:
        return combine_partials(*parts)
    return reduce_in_tree(parts, fan_in, lambda group, _depth, _index: combine_partials(*group))


def combine_partials(*parts: ChunkPartial) -> ChunkPartial:
    """Merge partials: concatenate blocks, add sums, take maxima."""
    blocks: list[tuple[tuple[int, int], np.ndarray]] = []
    records: list[dict[str, Any]] = []
    total: np.ndarray | None = None
    peak: np.ndarray | None = None
    for p in parts:
        blocks.extend(p.blocks)
        records.extend(p.records)
        if p.pattern_sum is not None:
            total = p.pattern_sum.copy() if total is None else total + p.pattern_sum
        if p.pattern_max is not None:
            peak = p.pattern_max.copy() if peak is None else np.maximum(peak, p.pattern_max)
    return ChunkPartial(blocks=blocks, pattern_sum=total, pattern_max=peak, records=records)
