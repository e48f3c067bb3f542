"""Streamed chunk passes: read a dense chunk in cache-sized pieces and run it piece by piece.

A chunk task used to read its whole chunk (128 MiB by default) into a
staging buffer, hash it, then run the kernels over it: three sweeps over a
block far larger than any cache, so the hash and the kernels read back from
main memory what the read had just written there.  A streamed pass reads
the chunk in pieces of ``stream_piece_mib`` (:mod:`quantem_flow.config`;
read on the client when the pass is lowered and shipped in its
:class:`~quantem_flow.graphs.tasks.PassSpec`; 2 MiB by default, 64 frames
of 128 x 128 u16) into one reused buffer; each piece is hashed and fed to
the runtime's kernels while it is in the core's cache.  Measured figures:
benchmarks/RESULTS.md, "Streamed chunk passes (issue 14)"; the design:
docs/streamed-pass.md.

A chunk is streamed when all of these hold (else it is loaded whole, as
before, and the chunk's record says why):

- the dataset is ``dense`` (other representations decode their own units);
- its source reads any scan block for the cost of its bytes
  (:attr:`~quantem_flow.io.base.Source.streams_blocks`: ``.npy``, raw and
  in-memory arrays; not chunked or compressed HDF5/Zarr, whose stored chunks
  would be decoded once per piece);
- the runtime runs its kernels on host frames in place
  (:meth:`~quantem_flow.runtimes.base.Runtime.frame_pass_stream`: the CPU
  runtime);
- the chunk holds at least two pieces.

Results, digests and records are those of the whole-chunk path: per-frame
values do not depend on the split (integer data bit for bit), the digest is
per scan row either way (:class:`~quantem_flow.graphs.digest.DenseRowDigests`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import config
from ..dataset import Dataset4D
from ..io.mapped import mapped_file
from ..io.read_method import SIZE_MARGIN, choose_read_method
from ..runtimes.base import (
    CompileTime,
    FramePassResult,
    FramePassStream,
    Runtime,
    is_gather_only,
)
from ..runtimes.staging import staged
from .digest import DenseRowDigests, Units, hashes_stored, stored_row_units
from .work_sharing import PassWork, SharedRows

__all__ = [
    "StreamedChunk",
    "largest_piece",
    "map_piece_bytes",
    "piece_bytes",
    "raw_frame_nbytes",
    "run_streamed_chunk",
    "stored_pieces",
    "stream_pieces",
    "why_not_streamed",
]

Piece = tuple[tuple[int, int], tuple[int, int]]


@dataclasses.dataclass
class StreamedChunk:
    """What a streamed chunk pass produced, with its timings (seconds)."""

    result: FramePassResult
    gathered: np.ndarray | None
    units: Units
    read_s: float
    hash_s: float
    kernel_s: float
    compile_s: float
    compilations: int
    made: dict[str, Any]


def _compiling() -> bool:
    """Whether a CPU kernel compiles in a background thread of this process now.

    Asked without importing the CPU runtime (and Numba) where nothing loaded it yet.
    """
    warmup = sys.modules.get("quantem_flow.runtimes.cpu.warmup")
    return bool(warmup is not None and warmup.any_warming())


def compile_timer_for(runtime: Runtime, *, gather_only: bool) -> Any:
    """The runtime's compile timer; a zero one for a gather-only pass whose gather compiles nothing.

    The default timer listens to Numba's events and so imports Numba (0.15-0.25 s in a
    fresh process), which SSB's gather pass does not otherwise need.
    """
    if gather_only and not runtime.gather_compiles:
        return contextlib.nullcontext(CompileTime())
    return runtime.compile_timer()


def piece_bytes() -> int:
    """Bytes per piece from ``stream_piece_mib`` (read on the client when a pass is lowered)."""
    return max(0, int(float(config.get("stream_piece_mib")) * (1 << 20)))


def map_piece_bytes() -> int:
    """Bytes per mapped piece from ``map_piece_mib`` (read on the client when a pass is lowered)."""
    return max(0, int(float(config.get("map_piece_mib")) * (1 << 20)))


def stream_pieces(
    rows: tuple[int, int], n_cols: int, frame_nbytes: int, target_bytes: int
) -> list[Piece]:
    """Cut scan rows ``rows`` x all ``n_cols`` columns into pieces of about ``target_bytes``.

    Whole scan rows when one fits (as many as fit, at least one), else
    column ranges of one row of a multiple of 4 frames (at least 4, the CPU
    kernels' frame group), in C order.
    """
    r0, r1 = rows
    row_bytes = n_cols * frame_nbytes
    if row_bytes <= target_bytes:
        k = max(1, target_bytes // max(row_bytes, 1))
        return [((a, min(a + k, r1)), (0, n_cols)) for a in range(r0, r1, k)]
    f = max(4, (target_bytes // max(frame_nbytes, 1)) // 4 * 4)
    return [
        ((a, a + 1), (c, min(c + f, n_cols))) for a in range(r0, r1) for c in range(0, n_cols, f)
    ]


def largest_piece(pieces: list[Piece]) -> int:
    """Frames in the largest of ``pieces`` (as :func:`stream_pieces` cuts them)."""
    return max((b - a) * (d - c) for (a, b), (c, d) in pieces)


def raw_frame_nbytes(ds: Dataset4D) -> int:
    """Bytes of one frame as the source stores it (before detector crops and binning)."""
    return int(np.prod(ds.source.shape[2:])) * int(ds.source.dtype.itemsize)


def why_not_streamed(ds: Dataset4D, rows: tuple[int, int], target: int) -> str | None:
    """Why a chunk of ``ds`` covering ``rows`` is loaded whole, or ``None`` if it can stream.

    ``target`` is the piece size in bytes; the runtime's part is asked by
    :func:`run_streamed_chunk`.
    """
    if target <= 0:
        return "streaming is off (stream_piece_mib = 0)"
    if ds.representation != "dense":
        return f"the {ds.representation} representation loads its own units"
    if not getattr(ds.source, "streams_blocks", False):
        return (
            f"the {ds.source.format} reader decodes stored units larger than a piece "
            "(streams_blocks is False)"
        )
    chunk = (rows[1] - rows[0]) * ds.shape[1] * raw_frame_nbytes(ds)
    if chunk < 2 * target:
        return f"the chunk ({chunk} bytes) is under two pieces of {target} bytes"
    return None


def _probe_sweep(
    stream: FramePassStream, dtype: np.dtype[Any], frame_nbytes: int
) -> Callable[[np.ndarray], None] | None:
    """The stream's kernels over a read-method probe's piece (its bytes), or ``None``.

    Where the frames are one run of stored bytes in native order (the only case a
    probe is made for), a piece's whole frames are those bytes viewed as ``dtype``;
    a piece's tail shorter than a frame is not swept.
    """
    if not stream.can_sweep:
        return None
    pixels = frame_nbytes // np.dtype(dtype).itemsize

    def sweep(piece: np.ndarray) -> None:
        n = piece.nbytes // frame_nbytes
        if n:
            stream.sweep(piece[: n * frame_nbytes].view(dtype).reshape(n, pixels))

    return sweep


def run_streamed_chunk(
    ds: Dataset4D,
    runtime: Runtime,
    rows: tuple[int, int],
    weights: np.ndarray,
    *,
    want_sum: bool,
    want_max: bool,
    gather: np.ndarray | None,
    piece_bytes: int,
    read_method: str = "auto",
    gather_into: np.ndarray | None = None,
    digest_in_kernel: bool = True,
    map_piece_bytes: int = 0,
    work: PassWork | None = None,
    part: SharedRows | None = None,
) -> StreamedChunk | str:
    """Read scan rows ``rows`` of ``ds`` piece by piece and run ``runtime``'s stream on them.

    ``read_method`` (the ``read_method`` setting) says how pieces of contiguous
    frames are read: ``pread`` into a reused buffer, or viewed in place through
    a map whose pages are dropped after each piece (:mod:`quantem_flow.io.read_method`);
    the chunk's record says which was used and why.

    ``gather_into`` (a ``(n_pixels, n_frames)`` host view, in-process runs)
    receives the gathered pixels where the runtime's stream writes them in
    place; :attr:`StreamedChunk.gathered` is then ``None``.

    ``digest_in_kernel`` (the setting of that name): the runtime's kernels may
    carry the content digest in their own sweep of each piece
    (:meth:`~quantem_flow.runtimes.base.FramePassStream.hash_rows`), else each
    piece is hashed in a sweep of its own first.  The same digest either way.
    Where they do and the pieces are read through a map, each piece is swept
    once and need not fit a cache: pieces of ``map_piece_bytes`` (when larger).

    ``work`` (the pass's shared work in this process, :mod:`.work_sharing`):
    other threads may take the scan rows this stream has not started; it then
    stops where they begin, waits for their results and joins them to its own.
    ``part``: these rows were taken from another thread's stream (they are
    streamed whatever their size; others may take from them in turn).

    Returns
    -------
    StreamedChunk or str
        The pass, or why it was not streamed (the caller loads the chunk
        whole then; nothing was read).
    """
    why = why_not_streamed(ds, rows, piece_bytes if part is None else 1)
    if why is not None:
        return why
    for operation in ("frame_pass",) + (("gather",) if gather is not None else ()):
        if not runtime.supports(operation, "dense", ds.dtype):
            # loaded whole: the runtime's put/run then refuses with its named error
            return f"the {runtime.name} runtime declares no {operation} on dense {ds.dtype}"
    n_cols = ds.shape[1]
    n_frames = (rows[1] - rows[0]) * n_cols
    t_prepare = time.perf_counter()
    stream = runtime.frame_pass_stream(
        weights,
        n_frames=n_frames,
        frame_shape=(int(ds.shape[2]), int(ds.shape[3])),
        dtype=ds.dtype,
        want_sum=want_sum,
        want_max=want_max,
        gather=gather,
        gather_into=gather_into,
    )
    if stream is None:
        return f"the {runtime.name} runtime runs its kernels on whole resident chunks"
    prepare_s = time.perf_counter() - t_prepare  # weight analysis, outputs: kernel time
    if hashes_stored(ds):
        return _run_stored_chunk(ds, runtime, stream, rows, piece_bytes, prepare_s)
    frame_nbytes = raw_frame_nbytes(ds)
    pieces = stream_pieces(rows, n_cols, frame_nbytes, piece_bytes)
    largest = largest_piece(pieces)
    digests = DenseRowDigests(n_cols)
    read_s = hash_s = 0.0
    kernel_s = prepare_s
    # the runtime's kernels may carry the digest in their own sweep (the same XXH3-128 per row)
    t_hash = time.perf_counter()
    in_kernel = (
        stream.hash_rows(row_frames=n_cols, frame_nbytes=frame_nbytes) if digest_in_kernel else None
    )
    hash_s += time.perf_counter() - t_hash
    t_choose = time.perf_counter()
    where = ds.block_bytes(rows)
    # a probe reads pieces of the whole dataset where it is one run of bytes (every chunk of
    # the file then gets the same answer), else of this chunk
    extent = ds.block_bytes((0, ds.shape[0]))
    region = (
        (extent[1], ds.shape[0] * n_cols * frame_nbytes)
        if extent is not None and where is not None and extent[0] == where[0]
        else (0 if where is None else where[1], n_frames * frame_nbytes)
    )
    choice = choose_read_method(
        read_method,
        None if where is None else where[0],
        region[0],
        region[1],
        int(largest * frame_nbytes),
        defer=_compiling(),  # a compiler in this process would slow the probe
        digest_sweep=in_kernel is None,
        # a piece swept once is mapped in pieces of map_piece_bytes (below): probed so too
        map_piece=map_piece_bytes if in_kernel is not None else 0,
        kernels=_probe_sweep(stream, ds.dtype, frame_nbytes) if where is not None else None,
        # what admission counted for this task's piece (lowering.streamed_piece_bytes)
        piece_cap=max(piece_bytes, map_piece_bytes),
    )
    read_s += time.perf_counter() - t_choose
    mapped = mapped_file(where[0]) if choice.method == "mmap" and where is not None else None
    target = piece_bytes
    piece_why = "cache-sized: the piece is swept more than once, or read into a buffer"
    if mapped is None and choice.method == "pread" and choice.piece_bytes > piece_bytes:
        target = choice.piece_bytes
        piece_why = (
            f"{choice.piece_bytes / (1 << 20):g} MiB, chosen by this worker's read probe: "
            f"the largest pread piece it read within {1 / SIZE_MARGIN:.2f}x of the fastest "
            f"with the pass's own sweep (stream_piece_mib: {piece_bytes / (1 << 20):g} MiB)"
        )
    if mapped is not None and in_kernel is not None and map_piece_bytes > piece_bytes:
        target = map_piece_bytes
        piece_why = (
            f"map_piece_mib ({map_piece_bytes / (1 << 20):g} MiB): read through a map and "
            "swept once (the kernel hashes each group of frames in cache), so the piece need "
            "not fit a cache; a larger piece spreads its fixed cost over more bytes"
        )
    if target != piece_bytes:  # cut again in the larger pieces
        pieces = stream_pieces(rows, n_cols, frame_nbytes, target)
        largest = largest_piece(pieces)
    shared = part
    if shared is None and work is not None:
        shared = work.running(
            rows[0], rows[1], row_bytes=n_cols * frame_nbytes, piece_bytes=largest * frame_nbytes
        )
    ran_pieces = 0
    with (
        # entered first: whatever fails after, nothing more is taken
        contextlib.closing(shared) if shared is not None else contextlib.nullcontext(),
        (
            contextlib.nullcontext(None)
            if mapped is not None
            else staged((largest * frame_nbytes // ds.source.dtype.itemsize,), ds.source.dtype)
        ) as flat,
        compile_timer_for(
            runtime,
            gather_only=is_gather_only(gather, weights, want_sum=want_sum, want_max=want_max),
        ) as compiled,
    ):
        if shared is not None:
            shared.open(splittable=stream.can_stop_early)
        for prows, pcols in pieces:
            if shared is not None:
                end = shared.begin(prows)
                if end is None:
                    break  # the rest was taken by other threads
                prows = (prows[0], end)
            shape = ds.raw_block_shape(prows, pcols)
            t0 = time.perf_counter()
            if mapped is not None:
                at = ds.block_bytes(prows, pcols)
                assert at is not None  # a piece of a contiguous chunk is contiguous
                offset, nbytes = at[1], math.prod(shape) * ds.dtype.itemsize
                what = f"scan rows {prows} columns {pcols}"
                block = mapped.piece(offset, nbytes, what=what).view(ds.dtype).reshape(shape)
            else:
                assert flat is not None
                block = ds.load_block(prows, pcols, buffer=flat[: math.prod(shape)].reshape(shape))
            t1 = time.perf_counter()
            if in_kernel is None:
                digests.update(prows, pcols, block)
            t2 = time.perf_counter()
            stream.feed(block.reshape(block.shape[0] * block.shape[1], -1))
            if mapped is not None:
                del block
                mapped.drop(offset, nbytes)
            read_s += t1 - t0
            hash_s += t2 - t1
            kernel_s += time.perf_counter() - t2
            ran_pieces += 1
        ran = rows if shared is None else (rows[0], shared.stop)
        if ran[1] < rows[1]:
            stream.stop_early((ran[1] - ran[0]) * n_cols)
        result, gathered = stream.finish()
    units = digests.units if in_kernel is None else _row_units(stream.row_digests(), ran)
    made = {
        "made": "dense read, streamed",
        "payload_bytes": int(n_frames * int(np.prod(ds.shape[2:])) * ds.dtype.itemsize),
        "streamed": {
            "pieces": ran_pieces,  # this thread's (rows other threads took: "shared")
            "piece_frames": int(largest),
            "piece_size": piece_why,
            "buffer_bytes": 0 if mapped is not None else int(largest * frame_nbytes),
            "read": choice.record(),
            "how": (
                (
                    "each piece viewed in place through a map of the file, hashed and fed to "
                    "the kernels (its page faults count in the first sweep's time: hash_s, or "
                    "kernel_s where the kernel carries the digest), then its pages dropped "
                    "from the process (madvise DONTNEED)"
                    if mapped is not None
                    else "read in pieces into one reused buffer; each piece hashed and fed to "
                    "the kernels while in cache"
                )
                + " (docs/streamed-pass.md)"
            ),
            "digest": (
                in_kernel
                if in_kernel is not None
                else "XXH3-128 per scan row, each piece hashed in a sweep of its own before "
                "the kernels" + ("" if digest_in_kernel else " (setting digest_in_kernel off)")
            ),
        },
    }
    done = StreamedChunk(
        result=result,
        gathered=gathered,
        units=units,
        read_s=read_s,
        hash_s=hash_s,
        kernel_s=max(kernel_s - compiled.seconds, 0.0),
        compile_s=compiled.seconds,
        compilations=compiled.compilations,
        made=made,
    )
    if shared is None or not shared.parts:
        return done
    # a later take ends where an earlier one began: the parts joined in row order
    return _joined(done, [(p, p.wait()) for p in sorted(shared.parts, key=lambda p: p.start)])


def _joined(own: StreamedChunk, taken: list[tuple[SharedRows, StreamedChunk]]) -> StreamedChunk:
    """A chunk's own rows and the rows other threads took from it, as one streamed chunk."""
    parts = [own, *(done for _, done in taken)]
    first = own.result
    total, peak = first.pattern_sum, first.pattern_max
    for p in parts[1:]:
        if total is not None and p.result.pattern_sum is not None:
            total = total + p.result.pattern_sum  # integer sums only (why_not_shared): exact
        if peak is not None and p.result.pattern_max is not None:
            peak = np.maximum(peak, p.result.pattern_max)
    gathered = (
        None
        if own.gathered is None
        else np.concatenate([p.gathered for p in parts if p.gathered is not None], axis=0)
    )
    streamed = dict(own.made.get("streamed", {}))
    streamed["shared"] = [_shared_record(part, done) for part, done in taken]
    return StreamedChunk(
        result=FramePassResult(
            np.concatenate([p.result.per_frame for p in parts], axis=0), total, peak, first.variant
        ),
        gathered=gathered,
        units=[u for p in parts for u in p.units],
        read_s=sum(p.read_s for p in parts),
        hash_s=sum(p.hash_s for p in parts),
        kernel_s=sum(p.kernel_s for p in parts),
        compile_s=sum(p.compile_s for p in parts),
        compilations=sum(p.compilations for p in parts),
        made={**own.made, "streamed": streamed},
    )


def _shared_record(part: SharedRows, done: StreamedChunk) -> dict[str, Any]:
    """What the chunk's record says of rows another thread ran (its own takers nested)."""
    inner = done.made.get("streamed", {})
    return {
        "rows": [done.units[0][0], done.units[-1][1]] if done.units else [part.start, part.start],
        "thread": part.ran_by,
        "pieces": inner.get("pieces"),
        "read_s": done.read_s,
        "hash_s": done.hash_s,
        "kernel_s": done.kernel_s,
        "why": "taken by a thread of this process whose own chunks were done "
        "(graphs/work_sharing.py)",
        **({"shared": inner["shared"]} if "shared" in inner else {}),
    }


def _row_units(digests: list[str], rows: tuple[int, int]) -> Units:
    """The units of scan rows ``rows`` from their digests, one per row in order."""
    r0, r1 = rows
    if len(digests) != r1 - r0:
        raise RuntimeError(
            f"the runtime's stream hashed {len(digests)} scan rows of a chunk of rows {rows} "
            f"({r1 - r0} rows); its row digests cannot name the chunk"
        )
    return [(r0 + i, r0 + i + 1, d) for i, d in enumerate(digests)]


def stored_pieces(
    rows: tuple[int, int], row_bytes: int, target_bytes: int
) -> list[tuple[int, int]]:
    """Whole scan rows per piece of stored frames: as many as decode to ``8 x target_bytes``.

    A piece's stored bytes (what is read and hashed at once) are a fraction
    of its decoded bytes; its frames are decoded, where they are, a
    ``target_bytes`` piece at a time, or counted a block at a time.
    """
    r0, r1 = rows
    k = max(1, (8 * target_bytes) // max(row_bytes, 1))
    return [(a, min(a + k, r1)) for a in range(r0, r1, k)]


def _run_stored_chunk(
    ds: Dataset4D,
    runtime: Runtime,
    stream: Any,
    rows: tuple[int, int],
    piece_bytes: int,
    prepare_s: float,
) -> StreamedChunk:
    """The stored route: read each piece's stored chunks, hash them, feed them undecoded.

    For a source that stores one bitshuffle + LZ4 chunk per frame
    (:func:`~quantem_flow.graphs.digest.hashes_stored`): the digest names the
    stored bytes, and a view that changes nothing hands them to the runtime's
    stream as they are (the CPU runtime counts masked sums on their bit planes,
    or decodes them a piece at a time); a cropped, binned or thresholded view
    decodes them here and transforms the values first.
    """
    n_cols = ds.shape[1]
    kr, kc = (int(n) for n in ds.source.shape[2:])
    frame_nbytes = raw_frame_nbytes(ds)
    pieces = stored_pieces(rows, n_cols * frame_nbytes, piece_bytes)
    plain = ds.is_plain_view
    units: Units = []
    read_s = hash_s = 0.0
    kernel_s = prepare_s
    stored_bytes = 0
    largest = 0
    # one reused buffer for the stored bytes (fresh pages cost ~0.4 ms per MiB to fault in):
    # the decoded size of the largest piece, which compressed chunks stay under (a piece that
    # does not fit, incompressible data with its headers, reads into a new array)
    rows_per = max(b - a for a, b in pieces)
    with (
        staged((rows_per * n_cols * frame_nbytes + (1 << 20),), np.dtype(np.uint8)) as buffer,
        runtime.compile_timer() as compiled,  # decoding stored chunks may compile
    ):
        for prows in pieces:
            t0 = time.perf_counter()
            stored = ds.stored_block(prows, buffer=buffer)
            t1 = time.perf_counter()
            units += stored_row_units(stored, prows)
            t2 = time.perf_counter()
            if plain:
                stream.feed_stored(stored)
            else:
                for a, b in stored.pieces(piece_bytes):
                    part = stored.frames(a, b).decode()
                    block = ds.transform_block(part.reshape(1, -1, kr, kc))
                    stream.feed(block.reshape(block.shape[1], -1))
            stored_bytes += stored.stored_bytes
            largest = max(largest, stored.data.shape[0])
            read_s += t1 - t0
            hash_s += t2 - t1
            kernel_s += time.perf_counter() - t2
        result, gathered = stream.finish()
    n_frames = (rows[1] - rows[0]) * n_cols
    made = {
        "made": "stored chunks read, streamed",
        "payload_bytes": int(n_frames * int(np.prod(ds.shape[2:])) * ds.dtype.itemsize),
        "streamed": {
            "pieces": len(pieces),
            "piece_frames": int((pieces[0][1] - pieces[0][0]) * n_cols),
            "buffer_bytes": int(largest),
            "stored_bytes": int(stored_bytes),
            "read": {
                "method": "pread",
                "why": (
                    f"the source stores each frame as one {ds.source.stored_frames_codec} "
                    "chunk: a piece's chunks are read as stored (runs of adjacent chunks in "
                    "one preadv), not decoded by the reader"
                ),
            },
            "how": (
                "each piece's stored chunks read, hashed as stored and "
                + (
                    "handed to the runtime undecoded (the CPU runtime counts mask and "
                    "moment rows on their bit planes, else decodes a cache-sized piece at a "
                    "time)"
                    if plain
                    else "decoded a cache-sized piece at a time, the view's detector "
                    "transforms applied, then fed to the kernels"
                )
                + " (docs/bitplane-kernel.md)"
            ),
        },
    }
    return StreamedChunk(
        result=result,
        gathered=gathered,
        units=units,
        read_s=read_s,
        hash_s=hash_s,
        kernel_s=max(kernel_s - compiled.seconds, 0.0),
        compile_s=compiled.seconds,
        compilations=compiled.compilations,
        made=made,
    )
