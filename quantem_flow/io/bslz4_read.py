"""Dense bitshuffle (HDF5 filter 32008) reads: chunks read once, checked, decoded in threads.

The HDF5 bitshuffle filter trusts each chunk's header and crashes the
process on a corrupt one (docs/upstream-bitshuffle-crash.md), so a dense
read used to check every chunk (``read_direct_chunk``) and then let HDF5
read and decode it again through the filter, one chunk at a time.  This
module reads every stored chunk of a selection once and decodes it itself:

1. the dataset's chunk index (chunk coordinates, byte offset, size, filter
   mask of every stored chunk) is taken once per file version with
   ``H5Dchunk_iter`` and kept per process (:func:`chunk_index`);
2. the selection's chunks are split into as many contiguous groups as
   decode threads (config ``decode_threads``); each thread reads runs of
   chunks that lie back to back in the file with one ``os.preadv`` (no
   HDF5 call, no h5py lock), checks each chunk
   (:func:`~quantem_flow.representations.encoded.bitshuffle_chunk_problem`:
   header sizes and block lengths, everything the decoder trusts) and
   decodes it with the ``bitshuffle`` library (which runs without the GIL)
   straight into its place in the destination while the compressed bytes
   are in cache.

The result is bit-identical to ``h5py``'s read (tests/test_bslz4_read.py).
A corrupt chunk raises :class:`~quantem_flow.errors.CorruptChunkError`
naming the file, dataset, chunk (grid coordinates and element offset) and
its byte offset in the file; a chunk stored without the filter (filter
mask bit 0) is copied as it is, and a chunk never written reads as the
dataset's fill value, as HDF5 defines.

Byte offsets are used directly only when the file is opened with the
default ``sec2`` driver and the first stored chunk read through HDF5 is
byte-identical to the bytes at its offset; otherwise every chunk is read
with ``read_direct_chunk`` (under h5py's lock) and decoded the same way.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np

from .. import config
from ..errors import CorruptChunkError, FormatError
from ..representations.encoded import _bitshuffle
from ..representations.stored import StoredFrames, decode_lz4_into
from ..representations.stored_kernels import checked_block as _checked_block
from ..representations.stored_kernels import decode_span as _decode_span

__all__ = [
    "ChunkIndex",
    "chunk_index",
    "decodes_whole_frames",
    "read_bitshuffle",
    "read_selection",
    "read_stored",
    "stored_readable",
    "supports",
]

#: Compressed bytes one ``preadv`` reads at most (runs of adjacent chunks).
SPAN_BYTES = 4 << 20
#: Bytes between two stored chunks read and skipped rather than starting a new read (the
#: B-tree nodes HDF5 writes between runs of chunks: 3 KiB every ~57 chunks of a Dectris file).
GAP_BYTES = 64 << 10
#: Decoded bytes per call of the codec when a run of one-frame chunks is decoded as one stream.
GROUP_BYTES = 1 << 20
#: Chunk indexes kept per process (one per file version and dataset).
INDEX_CACHE = 16
_BSHUF_COMPRESSION = {2: "lz4", 3: "zstd"}


def supports(layout: dict[str, Any]) -> bool:
    """Whether :func:`read_bitshuffle` reads a dataset of this layout.

    Parameters
    ----------
    layout
        :func:`~quantem_flow.io.hdf5.dataset_filters` of the dataset.

    Returns
    -------
    bool
        True when the dataset is chunked and its only filter is bitshuffle
        (32008) with LZ4 or Zstandard compression.
    """
    filters = list(layout.get("filters", []))
    if not layout.get("chunks") or len(filters) != 1 or int(filters[0]["id"]) != 32008:
        return False
    values = [int(v) for v in filters[0].get("values", [])]
    return len(values) > 4 and values[4] in _BSHUF_COMPRESSION


def decodes_whole_frames(layout: dict[str, Any], shape: Sequence[int]) -> bool:
    """Whether :func:`read_bitshuffle` reads a dataset of ``shape`` one whole frame per chunk.

    Any block of frames of such a dataset decodes only its own chunks, so a
    chunk pass may read it in cache-sized pieces (docs/streamed-pass.md).
    """
    return supports(layout) and _one_frame_chunks(layout.get("chunks") or (), shape)


def _one_frame_chunks(chunks: Sequence[int], shape: Sequence[int]) -> bool:
    """Chunks of one whole frame each: 1 along every axis but the last two, which are whole."""
    return (
        len(chunks) == len(shape) >= 3
        and all(int(c) == 1 for c in chunks[:-2])
        and [int(c) for c in chunks[-2:]] == [int(n) for n in shape[-2:]]
    )


@dataclasses.dataclass(frozen=True)
class ChunkIndex:
    """Where every stored chunk of one dataset lies in its file.

    Attributes
    ----------
    path
        The file the byte offsets refer to.
    chunks
        Chunk shape (elements per axis).
    grid
        Chunks per axis.
    byte_offset, size, mask
        Per chunk, in C order of the chunk grid: byte offset in the file
        (-1 when the chunk was never written), stored bytes and filter mask.
    direct
        Whether the byte offsets may be read with ``os.preadv`` (checked
        against ``read_direct_chunk`` on the first stored chunk).
    stamp
        The file's ``(mtime_ns, size, inode)`` taken before the index was
        walked (empty if it could not be taken).
    """

    path: str
    chunks: tuple[int, ...]
    grid: tuple[int, ...]
    byte_offset: np.ndarray
    size: np.ndarray
    mask: np.ndarray
    direct: bool
    stamp: tuple[Any, ...] = ()


def _stamp(path: str) -> tuple[Any, ...]:
    """The file's ``(mtime_ns, size, inode)``, or ``()`` if it cannot be taken."""
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (st.st_mtime_ns, st.st_size, st.st_ino)


_cache: OrderedDict[tuple[Any, ...], ChunkIndex] = OrderedDict()
_cache_lock = threading.Lock()


def chunk_index(dset: Any) -> ChunkIndex:
    """Return the chunk index of an open chunked ``h5py.Dataset`` (cached per file version).

    Parameters
    ----------
    dset
        An open, chunked ``h5py.Dataset``.

    Returns
    -------
    ChunkIndex
        Byte offsets, sizes and filter masks of its stored chunks.

    Raises
    ------
    CorruptChunkError
        If HDF5 cannot walk the chunk index (a damaged file).
    """
    path = os.path.realpath(dset.file.filename)
    stamp = _stamp(path)
    key = (path, dset.name, *stamp)
    with _cache_lock:
        found = _cache.get(key)
        if found is not None:
            _cache.move_to_end(key)
            return found
    if dset.chunks is None:  # a contiguous dataset has no chunk index (a damaged layout)
        raise FormatError(
            f"dataset {dset.name!r} in {path!r} is stored contiguously, not in chunks; a "
            "bitshuffle/LZ4 (Dectris) dataset is chunked, so the file's layout is damaged or "
            "this is not the dataset to read as encoded chunks"
        )
    chunks = tuple(int(c) for c in dset.chunks)
    grid = tuple(-(-int(n) // c) for n, c in zip(dset.shape, chunks, strict=True))
    total = int(np.prod(grid, dtype=np.int64))
    byte_offset = np.full(total, -1, dtype=np.int64)
    size = np.zeros(total, dtype=np.int64)
    mask = np.zeros(total, dtype=np.uint32)
    strides = np.cumprod((1, *grid[::-1]))[:-1][::-1]

    def visit(info: Any) -> None:
        i = sum((o // c) * s for o, c, s in zip(info.chunk_offset, chunks, strides, strict=True))
        byte_offset[i] = info.byte_offset
        size[i] = info.size
        mask[i] = info.filter_mask

    try:
        if hasattr(dset.id, "chunk_iter"):
            dset.id.chunk_iter(visit)
        else:  # pragma: no cover - older HDF5
            for n in range(dset.id.get_num_chunks()):
                visit(dset.id.get_chunk_info(n))
    except (RuntimeError, OSError, ValueError, IndexError, OverflowError, TypeError) as exc:
        # IndexError: a chunk off the grid; OverflowError: an offset beyond 2**63
        raise CorruptChunkError(
            f"could not walk the chunk index of dataset {dset.name!r} in {path!r}: {exc}. The "
            "file may be truncated or its chunk index damaged; restore the file"
        ) from exc
    direct = _offsets_usable(dset, path, byte_offset, size, chunks, strides)
    index = ChunkIndex(path, chunks, grid, byte_offset, size, mask, direct, stamp)
    with _cache_lock:
        _cache[key] = index
        while len(_cache) > INDEX_CACHE:
            _cache.popitem(last=False)
    return index


def _offsets_usable(
    dset: Any,
    path: str,
    byte_offset: np.ndarray,
    size: np.ndarray,
    chunks: tuple[int, ...],
    strides: np.ndarray,
) -> bool:
    """Whether the first stored chunk's bytes at its offset equal what HDF5 returns for it."""
    if dset.file.driver != "sec2":
        return False
    stored = np.flatnonzero(byte_offset >= 0)
    if stored.size == 0:
        return True
    i = int(stored[0])
    coord = []
    rest = i
    for s, c in zip(strides, chunks, strict=True):
        coord.append((rest // int(s)) * c)
        rest %= int(s)
    try:
        _, expected = dset.id.read_direct_chunk(tuple(coord))
        with open(path, "rb", buffering=0) as fh:
            fh.seek(int(byte_offset[i]))
            got = fh.read(int(size[i]))
    except (RuntimeError, OSError, ValueError, OverflowError):
        return False
    return bytes(expected) == got


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What every read of one open dataset needs, found once (per-read cost: one ``stat``)."""

    path: str
    stamp: tuple[Any, ...]
    index: ChunkIndex
    comp: str
    fill: Any
    stored: np.dtype[Any]
    shape: tuple[int, ...]


_plans: weakref.WeakKeyDictionary[Any, _Plan] = weakref.WeakKeyDictionary()
_plans_lock = threading.Lock()


def _plan(dset: Any) -> _Plan:
    """The dataset's chunk index, codec, fill value and dtype, kept while its handle lives.

    A read of a few frames (a streamed pass's piece) used to spend ~0.3 ms
    finding these again (the file's real path, an h5py ``File`` object, two
    property lists); now each read only compares the file's ``stat`` with
    the one the plan was made from, and makes it again when the file changed.
    """
    try:
        with _plans_lock:
            found = _plans.get(dset.id)
    except TypeError:  # an id that cannot be hashed: no caching
        found = None
    if (
        found is not None
        and found.stamp
        and _stamp(found.path) == found.stamp
        and dset.id.valid  # a closed handle reads nothing (h5py then says why)
    ):
        return found
    index = chunk_index(dset)
    plan = _Plan(
        path=index.path,
        stamp=index.stamp,  # taken before the index was walked
        index=index,
        comp=_BSHUF_COMPRESSION[int(dict(enumerate(_filter_values(dset))).get(4, 2))],
        fill=fill_value(dset, index.path),
        stored=np.dtype(dset.dtype),
        shape=tuple(int(n) for n in dset.shape),
    )
    try:
        with _plans_lock:
            _plans[dset.id] = plan
    except TypeError:  # pragma: no cover - see above
        pass
    return plan


_scratch = threading.local()


def _span_buffer(nbytes: int) -> bytearray:
    """A reused per-thread buffer of at least ``nbytes`` (kept when at most ``SPAN_BYTES``).

    A new buffer per read meant fresh pages, zeroed by the kernel on first
    touch: ~0.4 ms per 1 MiB, more than reading the compressed bytes.
    """
    buf: bytearray | None = getattr(_scratch, "buf", None)
    if buf is not None and len(buf) >= nbytes:
        return buf
    buf = bytearray(max(nbytes, SPAN_BYTES // 4))
    if len(buf) <= SPAN_BYTES:
        _scratch.buf = buf
    return buf


_pool_lock = threading.Lock()
_pool: dict[int, concurrent.futures.ThreadPoolExecutor] = {}


def _executor(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    with _pool_lock:
        pool = _pool.get(threads)
        if pool is None:
            pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="qf-bslz4")
            _pool[threads] = pool
        return pool


def read_bitshuffle(
    dset: Any,
    bounds: Sequence[tuple[int, int]],
    out: np.ndarray,
    *,
    where: str,
    threads: int | None = None,
) -> np.ndarray:
    """Read the selection ``bounds`` of a bitshuffle dataset into ``out``, decoding in parallel.

    Parameters
    ----------
    dset
        An open ``h5py.Dataset`` for which :func:`supports` holds.
    bounds
        Half-open ``(start, stop)`` per dataset axis.
    out
        C-contiguous destination of shape ``stop - start`` per axis; its
        dtype must hold the dataset's values exactly (the dataset's dtype
        in native byte order, or a wider one).
    where
        The dataset and file, for messages.
    threads
        Decode threads (default config ``decode_threads``).

    Returns
    -------
    numpy.ndarray
        ``out``.

    Raises
    ------
    CorruptChunkError
        Naming the file and dataset, the chunk (grid coordinates and element
        offset), its byte offset in the file and what is wrong with it.
    ShapeError
        If ``out`` does not have the selection's shape.
    """
    from ..errors import ShapeError

    shape = tuple(int(b) - int(a) for a, b in bounds)
    if out.shape != shape or not out.flags.c_contiguous:
        raise ShapeError(
            f"read_bitshuffle needs a C-contiguous destination of shape {shape}, got "
            f"{out.shape} (C-contiguous: {out.flags.c_contiguous}); pass a matching array"
        )
    if out.size == 0:
        return out
    plan = _plan(dset)
    if len(bounds) != len(plan.shape) or any(
        not 0 <= int(a) <= int(b) <= n for (a, b), n in zip(bounds, plan.shape, strict=False)
    ):
        raise ShapeError(
            f"read_bitshuffle bounds {[(int(a), int(b)) for a, b in bounds]} do not lie within "
            f"the shape {plan.shape} of {where}; pass 0 <= start <= stop <= size per axis"
        )
    index = plan.index
    chunks = index.chunks
    ranges = [range(int(a) // c, -(-int(b) // c)) for (a, b), c in zip(bounds, chunks, strict=True)]
    # index numbers of the selection's chunks, in C order of the chunk grid
    linear = np.zeros(1, dtype=np.int64)
    for r, g in zip(ranges, index.grid, strict=True):
        linear = (linear[:, None] * g + np.arange(r.start, r.stop, dtype=np.int64)).ravel()
    n = max(1, min(int(threads or config.get("decode_threads")), len(linear)))
    if n == 1 and _lz4_frames(plan, bounds, linear, out):
        return out
    job = _Job(dset, plan, bounds, out, linear, where)
    if n == 1:
        job.run(0, len(linear))
        return out
    # contiguous groups of about equal compressed bytes, one per thread
    weights = np.maximum(index.size[linear], 1)
    edges = np.searchsorted(np.cumsum(weights), np.linspace(0, weights.sum(), n + 1)[1:-1])
    cuts = [0, *(int(e) + 1 for e in edges), len(linear)]
    groups = [(cuts[i], cuts[i + 1]) for i in range(n) if cuts[i] < cuts[i + 1]]
    if len(groups) == 1:
        job.run(*groups[0])
        return out
    futures = [_executor(n).submit(job.run, a, b) for a, b in groups]
    errors = []
    for fut in futures:  # wait for all: none writes into ``out`` after we return
        try:
            fut.result()
        except CorruptChunkError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
    return out


def _whole_frames(
    chunks: Sequence[int], bounds: Sequence[tuple[int, int]], shape: Sequence[int]
) -> bool:
    """One whole frame per chunk, frames selected whole: chunk k of the selection is frame k."""
    return _one_frame_chunks(chunks, shape) and all(
        (int(a), int(b)) == (0, int(n)) for (a, b), n in zip(bounds[-2:], shape[-2:], strict=True)
    )


def _lz4_frames(
    plan: _Plan, bounds: Sequence[tuple[int, int]], linear: np.ndarray, out: np.ndarray
) -> bool:
    """Read and decode one-frame LZ4 chunks with little Python per call (False: not done).

    The common case of a streamed pass's piece (tens of frames, every chunk
    stored and filtered): the runs of chunks found in one compiled call, one
    ``preadv`` and one :func:`_decode_span` per run. Anything else (a chunk
    never written or stored unfiltered, a short read, a chunk that does not
    check out) returns False, and :class:`_Job` reads the selection again,
    naming any problem.
    """
    _bitshuffle()  # the library's OpenMP set to one thread in this thread (as _Job.run does)
    into = decode_lz4_into()
    index = plan.index
    if (
        into is None
        or plan.comp != "lz4"
        or not index.direct
        or out.dtype != plan.stored
        or not _whole_frames(index.chunks, bounds, plan.shape)
    ):
        return False
    offsets = index.byte_offset[linear]
    sizes = index.size[linear]
    if int(offsets.min()) < 0 or bool((index.mask[linear] & 1).any()):
        return False
    n_elem = int(np.prod(index.chunks))
    frames = out.reshape(len(linear), n_elem).view(np.uint8)
    fd = os.open(index.path, os.O_RDONLY)
    try:
        a = 0
        for b in _run_ends(offsets, sizes, GAP_BYTES, SPAN_BYTES).tolist():
            first = int(offsets[a])
            nbytes = int(offsets[b - 1] + sizes[b - 1]) - first
            buf = _span_buffer(nbytes)
            if os.preadv(fd, [memoryview(buf)[:nbytes]], first) != nbytes:
                return False
            span = np.frombuffer(buf, dtype=np.uint8, count=nbytes)
            if _decode_span(into, span, offsets[a:b] - first, sizes[a:b], n_elem, frames[a:b]) >= 0:
                return False
            a = b
    finally:
        os.close(fd)
    return True


def stored_readable(dset: Any) -> bool:
    """Whether :func:`read_stored` reads this dataset's frames as they are stored.

    Bitshuffle + LZ4 in chunks of one whole frame, integer values of 1, 2 or
    4 bytes in the machine's byte order, in a file opened with the ``sec2``
    driver whose first stored chunk lies at the offset HDF5 gives (checked
    against ``read_direct_chunk``).  Asked without walking the chunk index
    (0.4 s for 65 536 chunks), so a client that only labels a digest does
    not pay for it.
    """
    shape = tuple(int(n) for n in dset.shape)
    dtype = np.dtype(dset.dtype)
    values = _filter_values(dset)
    from .hdf5 import dataset_filters

    if (
        not supports(dataset_filters(dset))
        or _BSHUF_COMPRESSION.get(int(dict(enumerate(values)).get(4, 2))) != "lz4"
        or not _one_frame_chunks(tuple(dset.chunks or ()), shape)
        or dtype.kind not in "iu"
        or dtype.itemsize not in (1, 2, 4)
        or not (dtype.isnative or dtype.itemsize == 1)
        or sys.byteorder != "little"
        or dset.file.driver != "sec2"
    ):
        return False
    try:
        if dset.id.get_num_chunks() == 0:
            return True
        info = dset.id.get_chunk_info(0)
        _, expected = dset.id.read_direct_chunk(tuple(info.chunk_offset))
        with open(os.path.realpath(dset.file.filename), "rb", buffering=0) as fh:
            fh.seek(int(info.byte_offset))
            got = fh.read(int(info.size))
    except (RuntimeError, OSError, ValueError, OverflowError):
        return False
    return bytes(expected) == got


def read_stored(
    dset: Any, start: int, stop: int, *, where: str, buffer: np.ndarray | None = None
) -> StoredFrames:
    """Frames ``[start, stop)`` of a dataset for which :func:`stored_readable` holds, undecoded.

    Each run of chunks stored back to back (or a few bytes apart) is read with
    one ``os.preadv`` into ``buffer`` (a ``uint8`` array, used when large
    enough) or a new array; nothing is decoded or checked here (the consumer
    checks each chunk before it decodes it).

    Raises
    ------
    ShapeError
        When the frames do not lie within the dataset.
    CorruptChunkError
        When the file ends before a chunk the index points to.
    """
    from ..errors import ShapeError

    plan = _plan(dset)
    index = plan.index
    if not index.direct:
        raise FormatError(
            f"the chunks of {where} cannot be read at the offsets HDF5 gives (another driver, "
            "or the first chunk differs there); open the file again, or read it decoded"
        )
    n_frames = int(np.prod(plan.shape[:-2]))
    if not 0 <= start <= stop <= n_frames:
        raise ShapeError(
            f"frames [{start}, {stop}) lie outside the {n_frames} frames of {where}; pass "
            f"0 <= start <= stop <= {n_frames}"
        )
    # one whole frame per chunk: chunk k of the grid in C order is frame k
    offsets = index.byte_offset[start:stop]
    sizes = index.size[start:stop]
    written = np.flatnonzero(offsets >= 0)
    starts = np.full(stop - start, -1, dtype=np.int64)
    data = np.zeros(0, dtype=np.uint8)
    if written.size:
        offs, sz = offsets[written], sizes[written]
        ends = _run_ends(offs, sz, GAP_BYTES, SPAN_BYTES).tolist()  # preadv reads < 2 GiB
        runs, a = [], 0
        for b in ends:
            runs.append((a, b, int(offs[a]), int(offs[b - 1] + sz[b - 1]) - int(offs[a])))
            a = b
        total = sum(r[3] for r in runs)
        data = (
            buffer[:total]
            if buffer is not None and buffer.dtype == np.uint8 and buffer.size >= total
            else np.empty(total, dtype=np.uint8)
        )
        fd = os.open(index.path, os.O_RDONLY)
        try:
            pos = 0
            for a, b, first, nbytes in runs:
                got = os.preadv(fd, [data[pos : pos + nbytes].data], first)
                if got != nbytes:
                    raise CorruptChunkError(
                        f"the file ends before the chunks of frames [{start + int(written[a])}, "
                        f"{start + int(written[b - 1]) + 1}) of {where} (read {got} of {nbytes} "
                        f"bytes at byte offset {first}); restore the file or crop the scan"
                    )
                starts[written[a:b]] = offs[a:b] - first + pos
                pos += nbytes
        finally:
            os.close(fd)
    return StoredFrames(
        data=data,
        starts=starts,
        sizes=np.where(starts >= 0, sizes, 0).astype(np.int64),
        unfiltered=(index.mask[start:stop] & 1).astype(bool),
        dtype=plan.stored.newbyteorder("="),
        frame_shape=(int(plan.shape[-2]), int(plan.shape[-1])),
        fill=int(plan.fill),
        where=where,
        numbers=np.arange(start, stop, dtype=np.int64),
    )


def fill_value(dset: Any, path: str) -> Any:
    """``dset.fillvalue``, or :class:`CorruptChunkError` naming the file and dataset.

    h5py raises its own ``RuntimeError``/``OSError`` ("Can't get fill value")
    for a damaged fill-value message.
    """
    try:
        return dset.fillvalue
    except (RuntimeError, OSError, ValueError, TypeError) as exc:
        raise CorruptChunkError(
            f"the fill value of dataset {dset.name!r} in {path!r} cannot be read ({exc}); its "
            "header is damaged. Restore the file, or rewrite the dataset"
        ) from exc


def _filter_values(dset: Any) -> list[int]:
    plist = dset.id.get_create_plist()
    for i in range(plist.get_nfilters()):
        fid, _flags, values, _name = plist.get_filter(i)
        if int(fid) == 32008:
            return [int(v) for v in values]
    return []


class _Job:
    """One selection's decode, run by several threads over disjoint chunk groups."""

    def __init__(
        self,
        dset: Any,
        plan: _Plan,
        bounds: Sequence[tuple[int, int]],
        out: np.ndarray,
        linear: np.ndarray,
        where: str,
    ) -> None:
        index = plan.index
        self.dset = dset
        self.index = index
        self.bounds = [(int(a), int(b)) for a, b in bounds]
        self.out = out
        self.linear = linear
        self.stored = plan.stored
        self.comp = plan.comp
        self.fill = plan.fill
        self.where = where
        self.n_elem = int(np.prod(index.chunks))
        c0 = index.chunks[0]
        # chunks split only along axis 0, all other axes whole: copy by flat frame ranges
        self.rows_only = all(
            (a, b) == (0, c) and c == n
            for (a, b), c, n in zip(self.bounds[1:], index.chunks[1:], plan.shape[1:], strict=True)
        )
        self.c0 = c0
        self.flat = out.reshape(out.shape[0], -1) if self.rows_only else out
        # chunks of one whole frame each (the Dectris layout, or (1, 1, k_r, k_c)), frames
        # read whole: the fast path. The selection's chunks in C order are then its frames
        # in C order, so chunk k of the selection is frame k of ``out``.
        self.fast = _whole_frames(index.chunks, self.bounds, plan.shape)
        if self.fast:
            self.frames = out.reshape(-1, self.n_elem)
        # per selected chunk, as Python ints (cheaper to index than NumPy scalars)
        self.offsets: list[int] = index.byte_offset[linear].tolist()
        self.sizes: list[int] = index.size[linear].tolist()
        self.masks: list[int] = index.mask[linear].tolist()

    @functools.cached_property
    def grids(self) -> np.ndarray:
        """Chunk-grid coordinates of the selection's chunks (one row each), for messages."""
        return np.stack(np.unravel_index(self.linear, self.index.grid), axis=1)

    @functools.cached_property
    def first_rows(self) -> list[int]:
        """First element along axis 0 of each selected chunk."""
        rows: list[int] = (self.grids[:, 0] * self.c0).tolist()
        return rows

    def run(self, start: int, stop: int) -> None:
        """Read, check and decode chunks ``start:stop`` of the selection into ``out``."""
        bitshuffle = _bitshuffle()  # its OpenMP set to one thread in this thread
        decode = bitshuffle.decompress_lz4 if self.comp == "lz4" else bitshuffle.decompress_zstd
        idx = self.index
        fd = os.open(idx.path, os.O_RDONLY) if idx.direct else -1
        try:
            i = start
            while i < stop:
                # a run of chunks stored back to back, read with one call
                j = i + 1
                offsets, sizes = self.offsets, self.sizes
                first = offsets[i]
                end = first + sizes[i]
                if fd >= 0 and first >= 0:
                    # chunks back to back, or apart by a few bytes of the file's chunk index
                    # (read and skipped: one call instead of two)
                    while (
                        j < stop
                        and end <= offsets[j] <= end + GAP_BYTES
                        and offsets[j] + sizes[j] - first <= SPAN_BYTES
                    ):
                        end = offsets[j] + sizes[j]
                        j += 1
                    buf = _span_buffer(end - first)
                    view = memoryview(buf)[: end - first]
                    got = os.preadv(fd, [view], first)
                    if got != end - first:
                        raise self._corrupt(
                            i, f"the file ends before the chunk (read {got} of {end - first} bytes)"
                        )
                    span = np.frombuffer(buf, dtype=np.uint8, count=end - first)
                if (
                    fd >= 0
                    and first >= 0
                    and self.fast
                    and self._fast_span(span, first, i, j, decode)
                ):
                    i = j
                    continue
                for k in range(i, j):
                    data: np.ndarray | None
                    if fd >= 0 and first >= 0:
                        a = offsets[k] - first
                        data = span[a : a + sizes[k]]
                    else:
                        data = self._direct(k)
                    self._place(k, self._decode(k, data, decode))
                i = j
        finally:
            if fd >= 0:
                os.close(fd)

    def _fast_span(self, span: np.ndarray, first: int, i: int, j: int, decode: Any) -> bool:
        """Decode chunks ``i:j`` of one frame each, filtered, from ``span`` (False: not all are).

        The chunks are checked in one compiled call (headers and block
        lengths; the first bad one is then named by :meth:`_decode`), then
        each is decoded straight into its frame of the destination.
        """
        if any(m & 1 for m in self.masks[i:j]):
            return False
        rel = np.asarray(self.offsets[i:j], dtype=np.int64) - first
        sizes = np.asarray(self.sizes[i:j], dtype=np.int64)
        into = decode_lz4_into() if self.comp == "lz4" else None
        frames = self.frames[i:j]
        if into is not None and frames.dtype == self.stored:
            # checked and decoded chunk by chunk in one compiled call without the GIL: no
            # Python between codec calls (benchmarks/RESULTS.md, "Bitshuffle frames streamed")
            bad = _decode_span(into, span, rel, sizes, self.n_elem, frames.view(np.uint8))
            if bad < 0:
                return True
            a = int(rel[bad])
            self._decode(i + int(bad), span[a : a + int(sizes[bad])], decode)  # raises
            raise self._corrupt(i + int(bad), "the codec stopped before the chunk's end")
        blocks = np.empty(j - i, dtype=np.int64)
        bad = _check_span(span, rel, sizes, self.n_elem, self.stored.itemsize, blocks)
        if bad >= 0:
            k = i + int(bad)
            a = int(rel[bad])
            self._decode(k, span[a : a + int(sizes[bad])], decode)  # raises, naming the chunk
            return False  # pragma: no cover - the check and the message agree
        flat, stored, n_elem = self.frames, self.stored, self.n_elem
        shape = (n_elem,)
        block0 = int(blocks[0])
        if n_elem % block0 == 0 and bool(np.all(blocks == block0)):
            # whole blocks only and one block size: the chunks' bodies (headers dropped) put
            # back to back are one bitshuffle stream of all their frames, decoded in few calls
            # (less Python and fewer GIL hand-offs per frame)
            body = _bodies(span, rel, sizes)
            ends = np.cumsum(sizes - 12)
            step = max(1, GROUP_BYTES // (n_elem * stored.itemsize))
            for g in range(0, j - i, step):
                h = min(j - i, g + step)
                a = int(ends[g - 1]) if g else 0
                r0 = i + g
                part = body[a : int(ends[h - 1])]
                target = flat[r0 : r0 + h - g]
                if into is not None and target.flags.c_contiguous and target.dtype == stored:
                    # decoded in place: no array allocated per group, no copy, GIL released
                    done = into(
                        part.ctypes.data,
                        target.ctypes.data,
                        (h - g) * n_elem,
                        stored.itemsize,
                        block0,
                    )
                    if done != part.size:
                        break  # name the chunk: decode the group one chunk at a time
                    continue
                try:
                    values = decode(part, ((h - g) * n_elem,), stored, block0)
                except Exception:  # name the chunk: decode the group one chunk at a time
                    break
                target[...] = values.reshape(h - g, n_elem)
            else:
                return True
        for k, a, n, b in zip(
            range(i, j), rel.tolist(), sizes.tolist(), blocks.tolist(), strict=True
        ):
            try:
                flat[k] = decode(span[a + 12 : a + n], shape, stored, b)
            except Exception as exc:  # the codec's own errors (RuntimeError, ValueError)
                raise self._corrupt(k, f"{type(exc).__name__}: {exc}") from exc
        return True

    def _direct(self, k: int) -> np.ndarray | None:
        """The stored bytes of chunk ``k`` through HDF5 (``None``: never written)."""
        if self.offsets[k] < 0:
            return None
        grid = tuple(int(g) for g in self.grids[k])
        offset = tuple(g * c for g, c in zip(grid, self.index.chunks, strict=True))
        try:
            _mask, data = self.dset.id.read_direct_chunk(offset)
        except (RuntimeError, OSError, ValueError) as exc:
            if "not allocated" in str(exc):
                return None
            raise self._corrupt(k, f"it could not be read ({exc})") from exc
        return np.frombuffer(data, dtype=np.uint8)

    def _decode(self, k: int, data: np.ndarray | None, decode: Any) -> np.ndarray:
        from ..representations.encoded import bitshuffle_chunk_problem

        n_elem, stored = self.n_elem, self.stored
        if data is None or self.offsets[k] < 0:
            return np.full(n_elem, self.fill, dtype=stored)
        if self.masks[k] & 1:  # the filter was skipped: stored raw
            if data.shape[0] != n_elem * stored.itemsize:
                raise self._corrupt(
                    k,
                    f"it was stored unfiltered with {data.shape[0]} bytes, expected "
                    f"{n_elem * stored.itemsize}",
                )
            return data.view(stored)
        problem = bitshuffle_chunk_problem(data, n_elem, stored.itemsize)
        if problem is not None:
            raise self._corrupt(k, problem)
        block = (int(data[8]) << 24 | int(data[9]) << 16 | int(data[10]) << 8 | int(data[11])) // (
            stored.itemsize
        )
        try:
            return np.asarray(decode(data[12:], (n_elem,), stored, block))
        except Exception as exc:  # the codec's own errors (RuntimeError, ValueError)
            raise self._corrupt(k, f"{type(exc).__name__}: {exc}") from exc

    def _place(self, k: int, values: np.ndarray) -> None:
        chunks = self.index.chunks
        if self.rows_only:
            a0 = self.first_rows[k]
            lo = max(a0, self.bounds[0][0])
            hi = min(a0 + self.c0, self.bounds[0][1])
            per = self.n_elem // self.c0
            flat = self.flat
            flat[lo - self.bounds[0][0] : hi - self.bounds[0][0]] = values.reshape(self.c0, per)[
                lo - a0 : hi - a0
            ]
            return
        grid = [int(g) for g in self.grids[k]]
        src = []
        dst = []
        for g, c, (a, b) in zip(grid, chunks, self.bounds, strict=True):
            lo, hi = max(g * c, a), min(g * c + c, b)
            src.append(slice(lo - g * c, hi - g * c))
            dst.append(slice(lo - a, hi - a))
        self.out[tuple(dst)] = values.reshape(chunks)[tuple(src)]

    def _corrupt(self, k: int, problem: str) -> CorruptChunkError:
        grid = tuple(int(g) for g in self.grids[k])
        offset = tuple(g * c for g, c in zip(grid, self.index.chunks, strict=True))
        byte = self.offsets[k]
        at = f" at byte offset {byte} of the file" if byte >= 0 else ""
        return CorruptChunkError(
            f"stored chunk {grid} (element offset {offset}) of {self.where}{at} is corrupt: "
            f"{problem}. It was not decoded; restore or re-acquire the file, or crop the scan "
            "to leave this chunk out"
        )


def read_selection(
    dset: Any,
    layout: dict[str, Any],
    selection: Any,
    *,
    where: str,
    out: np.ndarray | None = None,
) -> np.ndarray | None:
    """Read a basic selection of a bitshuffle dataset with :func:`read_bitshuffle`, if it applies.

    Parameters
    ----------
    dset
        An open ``h5py.Dataset``.
    layout
        :func:`~quantem_flow.io.hdf5.dataset_filters` of the dataset.
    selection
        A slice or tuple of slices (step 1) over the leading axes.
    where
        The dataset and file, for messages.
    out
        Optional C-contiguous destination of the selection's shape.

    Returns
    -------
    numpy.ndarray or None
        The values (``out`` when given, else a new array of the dataset's
        dtype in native byte order), or ``None`` when the dataset or the
        selection is not one this module reads (the caller reads through
        HDF5, checking the chunks first).
    """
    if not supports(layout):
        return None
    sel = selection if isinstance(selection, tuple) else (selection,)
    bounds = []
    for axis, n in enumerate(dset.shape):
        s = sel[axis] if axis < len(sel) else slice(None)
        if not isinstance(s, slice):
            return None
        start, stop, step = s.indices(int(n))
        if step != 1:
            return None
        bounds.append((start, max(start, stop)))
    if out is None:
        shape = tuple(b - a for a, b in bounds)
        out = np.empty(shape, dtype=np.dtype(dset.dtype).newbyteorder("="))
    return read_bitshuffle(dset, bounds, out, where=where)


@numba.njit(cache=True, nogil=True)
def _check_span(buf, rel, sizes, n_elem, itemsize, blocks):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    """Check the bitshuffle header and block lengths of each chunk in ``buf``; first bad or -1.

    The same checks as ``bitshuffle_chunk_problem``, for a run of chunks in
    one call; ``blocks`` receives each chunk's block size in elements.
    """
    for c in range(rel.shape[0]):
        block = _checked_block(buf, rel[c], sizes[c], n_elem, itemsize)
        if block < 0:
            return c
        blocks[c] = block
    return -1


@numba.njit(cache=True, nogil=True)
def _run_ends(offsets, sizes, gap, limit):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    """End (exclusive) of each run of chunks read with one call, as :meth:`_Job.run` cuts them.

    A run goes on while the next chunk starts at most ``gap`` bytes after
    the previous one ends and the run stays within ``limit`` bytes.
    """
    n = offsets.shape[0]
    ends = np.empty(n, dtype=np.int64)
    m = 0
    i = 0
    while i < n:
        first = offsets[i]
        end = first + sizes[i]
        j = i + 1
        while j < n and end <= offsets[j] <= end + gap and offsets[j] + sizes[j] - first <= limit:
            end = offsets[j] + sizes[j]
            j += 1
        ends[m] = j
        m += 1
        i = j
    return ends[:m]


@numba.njit(cache=True, nogil=True)
def _bodies(buf, rel, sizes):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    """The bodies of the chunks at ``rel`` (each without its 12-byte header), back to back."""
    total = 0
    for c in range(rel.shape[0]):
        total += sizes[c] - 12
    out = np.empty(total, dtype=np.uint8)
    pos = 0
    for c in range(rel.shape[0]):
        n = sizes[c] - 12
        out[pos : pos + n] = buf[rel[c] + 12 : rel[c] + 12 + n]
        pos += n
    return out
