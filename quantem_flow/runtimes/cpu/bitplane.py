"""Masked sums on the bit planes of stored bitshuffle + LZ4 frames, without decoding them.

Bitshuffle stores a block of ``m`` values as bit planes: plane ``p`` holds
bit ``p`` of every value (value ``e`` at byte ``e // 8``, bit ``e % 8``).
For a 0/1 mask ``M``, the masked sum of a block is therefore

    sum_e M_e x_e = sum_p w_p * popcount(plane_p AND M),

``w_p = 2**p`` (``-2**(b - 1)`` for the top plane of ``b``-bit signed
values): 64 values per ``popcnt``, 512 per ``vpopcntq`` of an AVX-512
register, planes that are all zero (the high bits of counted data) skipped,
and the bit transpose back to values (``bshuf_untrans_bit_elem``: two thirds
of the decoder's time on this project's VM, benchmarks/RESULTS.md "Bit-plane
sums") never done.  Every structured row of a
:class:`~quantem_flow.runtimes.cpu.structure.WeightPlan` (BF, ADF, annuli,
the support and moments of a centre of mass) is a dot product with a small
integer vector (:func:`~quantem_flow.runtimes.cpu.structure.structured_vectors`);
a vector ``v`` that is ``lo`` plus a non-negative ``u`` on its support
``S`` splits into 0/1 masks:

    v . x = lo * (S . x) + sum_j 2**j * (bit_j(u) . x).

A centre of mass's row moment on a 128-row detector is the support plus 7
bit masks; masks that are equal within a block (a moment's high row bits are
constant over the 32 rows of a 4096-value block) are counted once there,
and empty ones not at all.

The kernel decodes one LZ4 block at a time (``LZ4_decompress_safe``, which
never reads or writes outside the sizes it is given) into a scratch of one block
(8 KiB of 16-bit values)
that stays in L1, counts, and moves on: one compiled call per run of frames,
without the GIL.  It writes the same integers the cell kernels accumulate
into the same output columns, so
:func:`~quantem_flow.runtimes.cpu.structure.finish_moment_rows` finishes them
the same way and every value is the structured kernel's bit for bit
(tests/test_bitplane.py).  Frames stored unfiltered (their bytes are the
values) and frames never written (the fill value) are summed directly.

When it runs (:func:`bitplane_pass_for`): 8-, 16- or 32-bit integer frames,
every row a mask or a moment (no general rows), no sum or maximum pattern,
the setting ``bitplane_kernel`` on (the default), and at most
:data:`MAX_MASK_PLANES` masks x planes per block.  Otherwise the frames are
decoded and the usual kernels run; the variant record says why.  (A stream
that also gathers pixels, SSB's pass, decodes: it needs the values.)
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from ... import config
from ...representations.stored import StoredFrames, chunk_problem, lz4_block_decoder
from .structure import WeightPlan, finish_moment_rows, structured_vectors

__all__ = ["BITPLANE_KEY", "MAX_MASK_PLANES", "BitplanePass", "bitplane_pass_for", "warm_bitplane"]

#: The kernel's key in :mod:`.warmup` (one compiled specialisation serves every dtype).
BITPLANE_KEY = ("bitplane",)

#: At most this many (distinct masks of a block) x (bit planes of a value): beyond it,
#: decoding and the dot or cell kernels cost less (BF + ADF + CoM on 16-bit frames:
#: 15 x 16 = 240; measured 1.7-3.0x decode-then-kernel, benchmarks/RESULTS.md).
MAX_MASK_PLANES = 640


@intrinsic
def _popcount(typingctx: Any, x: Any) -> Any:  # pragma: no cover - compiled
    """``llvm.ctpop.i64``: ``popcnt``, and ``vpopcntq`` once the loop is vectorised."""
    sig = types.uint64(types.uint64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fn = builder.module.declare_intrinsic("llvm.ctpop", [ir.IntType(64)])
        return builder.call(fn, args)

    return sig, codegen


@dataclasses.dataclass(frozen=True)
class _BlockPlan:
    """The masks of one block layout (``block`` values per block), packed as the planes are.

    ``masks[u]``: the ``u``-th distinct nonempty mask of its block, one bit per
    value, ``words`` 64-bit words; ``block_ptr[b]:block_ptr[b + 1]`` the masks of
    block ``b``; ``con_ptr[u]:con_ptr[u + 1]`` the ``(vector, coefficient)`` pairs
    mask ``u``'s count adds to.
    """

    block: int
    masks: np.ndarray
    block_ptr: np.ndarray
    con_ptr: np.ndarray
    con_vector: np.ndarray
    con_coef: np.ndarray
    max_masks: int


class BitplanePass:
    """The structured rows of one plan as bit-plane counts (see the module docstring).

    Parameters
    ----------
    plan
        The weight plan (structured, no general rows).
    dtype
        8-, 16- or 32-bit integer frames.
    """

    def __init__(self, plan: WeightPlan, dtype: np.dtype[Any]) -> None:
        self.plan = plan
        self.dtype = np.dtype(dtype)
        k = plan.frame_shape[0] * plan.frame_shape[1]
        self.n_elem = k
        vectors: list[np.ndarray] = []
        keys: dict[bytes, int] = {}
        columns: list[tuple[int, int]] = []  # (output column, vector)
        for vec, column in structured_vectors(plan):
            key = vec.tobytes()
            if key not in keys:
                keys[key] = len(vectors)
                vectors.append(vec)
            columns.append((column, keys[key]))
        self.vectors = np.stack(vectors) if vectors else np.zeros((0, k), dtype=np.int64)
        self.columns = np.array([c for c, _ in columns], dtype=np.int64)
        self.sources = np.array([v for _, v in columns], dtype=np.int64)
        self.streams = _streams(self.vectors)
        bits = self.dtype.itemsize * 8
        self.plane_weights = np.array([1 << p for p in range(bits)], dtype=np.int64)
        if self.dtype.kind == "i":
            self.plane_weights[-1] = -(1 << (bits - 1))
        self._blocks: dict[int, _BlockPlan] = {}
        self._lock = threading.Lock()
        self._scratch = threading.local()

    #: See :data:`BITPLANE_KEY`.
    warmup_key = BITPLANE_KEY

    @property
    def n_vectors(self) -> int:
        """Distinct integer vectors (dot products per frame)."""
        return int(self.vectors.shape[0])

    def block_plan(self, block: int) -> _BlockPlan:
        """The masks for blocks of ``block`` values (built once per block size)."""
        with self._lock:
            found = self._blocks.get(block)
            if found is None:
                found = _block_plan(self.streams, self.n_elem, block)
                self._blocks[block] = found
            return found

    def describe(self, block: int) -> str:
        """One line for the variant record."""
        bp = self.block_plan(block)
        return (
            f"bit-plane counts on the stored bitshuffle chunks, not decoded: {self.n_vectors} "
            f"vectors as {len(self.streams)} masks, at most {bp.max_masks} distinct per block of "
            f"{block} values x {self.dtype.itemsize * 8} planes (all-zero planes skipped)"
        )

    def run(self, stored: StoredFrames, out: np.ndarray) -> None:
        """Write the plan's structured columns of ``out`` for the frames of ``stored``.

        ``out`` is float64 ``(n, >= plan.n_out)``; every structured column is
        written finished, as :func:`~quantem_flow.runtimes.cpu.structure.structured_pass`
        leaves it.

        Raises
        ------
        CorruptChunkError
            Naming the first frame whose chunk does not check out or decode.
        """
        n = stored.n_frames
        if n == 0:
            return
        if stored.dtype != self.dtype or stored.frame_elements != self.n_elem:
            raise ValueError(
                f"stored frames of {stored.dtype} {stored.frame_shape} fed to a bit-plane pass "
                f"for {self.dtype} frames of {self.plan.frame_shape}"
            )
        lz4 = lz4_block_decoder()
        if lz4 is None:  # pragma: no cover - checked by bitplane_pass_for
            raise RuntimeError("the bitshuffle library has no LZ4_decompress_safe")
        totals = np.zeros((n, self.n_vectors), dtype=np.int64)
        fill = int(stored.fill) * self.vectors.sum(axis=1)
        status = np.zeros(2, dtype=np.int64)
        itemsize = self.dtype.itemsize
        done = 0
        first = next(
            (f for f in range(n) if stored.starts[f] >= 0 and not stored.unfiltered[f]), None
        )
        block = 8 if first is None else self._checked_block(stored, first)
        while done < n:
            bp = self.block_plan(block)
            scratch = self._buffer(bp.block * itemsize + 8 * 8 * itemsize + 64)
            done = _stored_totals(
                lz4,
                stored.data,
                stored.starts,
                stored.sizes,
                stored.unfiltered,
                done,
                n,
                self.n_elem,
                itemsize,
                self.dtype.kind == "i",
                bp.block,
                self.plane_weights,
                bp.masks,
                bp.block_ptr,
                bp.con_ptr,
                bp.con_vector,
                bp.con_coef,
                self.vectors,
                fill,
                scratch,
                totals,
                status,
            )
            if status[0] == 1:
                raise stored.corrupt(done, _what(stored, done, self.n_elem, itemsize))
            if status[0] == 2:  # this frame's chunk has another block size: plan it, go on
                block = self._checked_block(stored, done)
                status[:] = 0
        # the integers the cell kernels leave in each structured column, then their finish
        rows = out[:n]
        rows[:, self.columns] = totals[:, self.sources]
        finish_moment_rows(rows, self.plan)

    def _checked_block(self, stored: StoredFrames, frame: int) -> int:
        """The block size of ``frame``'s chunk, checked whole before anything is planned for it.

        A block larger than the frame lays the frame out as one block of its
        values rounded down to 8 (as the bitshuffle format does), so it is
        planned at that size: a corrupt header cannot make the masks larger
        than the frame.  A chunk that does not check out raises
        :class:`~quantem_flow.errors.CorruptChunkError` naming the frame.
        """
        from ...representations.encoded import bitshuffle_chunk_problem

        itemsize = self.dtype.itemsize
        data = stored.chunk(frame)
        problem = bitshuffle_chunk_problem(data, self.n_elem, itemsize)
        if problem is not None:
            raise stored.corrupt(frame, problem)
        block = int.from_bytes(data[8:12].tobytes(), "big") // itemsize
        return _layout_block(block, self.n_elem)

    def _buffer(self, nbytes: int) -> np.ndarray:
        buf: np.ndarray | None = getattr(self._scratch, "buf", None)
        if buf is None or buf.shape[0] < nbytes:
            buf = np.zeros(max(nbytes, 1 << 14), dtype=np.uint8)
            self._scratch.buf = buf
        return buf


def _layout_block(block: int, n_elem: int) -> int:
    """The block size that lays out ``n_elem`` values as ``block`` does, at most the frame's."""
    whole = n_elem - n_elem % 8
    return max(8, min(block, whole)) if whole else 8


def _what(stored: StoredFrames, frame: int, n_elem: int, itemsize: int) -> str:
    """What is wrong with ``frame``'s chunk (the kernel stopped there)."""
    data = stored.chunk(frame)
    if stored.unfiltered[frame]:
        return f"it was stored unfiltered with {data.shape[0]} bytes, expected {n_elem * itemsize}"
    return chunk_problem(data, n_elem, stored.dtype)


def _streams(vectors: np.ndarray) -> list[tuple[np.ndarray, int, int]]:
    """``(mask, vector, coefficient)``: the 0/1 masks whose counts make up each vector.

    A 0/1 vector is its own mask.  Another is ``lo`` on its support ``S``
    (the smallest 0/1 vector of the set it lies within, else where it is not
    zero) plus ``u = v - lo >= 0`` there, one mask per bit of ``u``.
    """
    binary = [i for i, v in enumerate(vectors) if np.all((v == 0) | (v == 1))]
    out: list[tuple[np.ndarray, int, int]] = []
    for i, v in enumerate(vectors):
        if i in binary:
            out.append((v.astype(bool), i, 1))
            continue
        nonzero = v != 0
        within = [j for j in binary if not np.any(nonzero & (vectors[j] == 0))]
        support = (
            vectors[min(within, key=lambda j: int(vectors[j].sum()))].astype(bool)
            if within
            else nonzero
        )
        lo = int(v[support].min()) if support.any() else 0
        u = np.where(support, v - lo, 0)
        if lo:
            out.append((support, i, lo))
        for j in range(int(u.max()).bit_length() if u.size else 0):
            out.append((((u >> j) & 1).astype(bool), i, 1 << j))
    return out


def _block_plan(streams: list[tuple[np.ndarray, int, int]], n_elem: int, block: int) -> _BlockPlan:
    """Split every stream's mask into the blocks of one layout, merging equal masks per block.

    A frame of ``n_elem`` values is ``n_elem // block`` blocks of ``block``
    values, then one of the rest rounded down to 8, then ``n_elem % 8`` values
    stored verbatim (counted by the kernel from the vectors themselves).
    """
    full, last = divmod(n_elem, block)
    last -= last % 8
    spans = [(b * block, block) for b in range(full)] + ([(full * block, last)] if last else [])
    words = -(-max(block, 8) // 64)
    masks: list[np.ndarray] = []
    block_ptr = [0]
    con_ptr = [0]
    con_vector: list[int] = []
    con_coef: list[int] = []
    most = 0
    for e0, m in spans:
        distinct: dict[bytes, dict[int, int]] = {}
        packed_of: dict[bytes, np.ndarray] = {}
        for mask, vector, coef in streams:
            part = mask[e0 : e0 + m]
            if not part.any():
                continue
            packed = np.zeros(words * 8, dtype=np.uint8)
            packed[: -(-m // 8)] = np.packbits(part, bitorder="little")
            key = packed.tobytes()
            packed_of[key] = packed
            adds = distinct.setdefault(key, {})
            adds[vector] = adds.get(vector, 0) + coef
        for key, adds in distinct.items():
            masks.append(packed_of[key].view(np.uint64))
            for vector, coef in adds.items():
                if coef:
                    con_vector.append(vector)
                    con_coef.append(coef)
            con_ptr.append(len(con_vector))
        block_ptr.append(len(masks))
        most = max(most, len(distinct))
    return _BlockPlan(
        block=block,
        masks=np.stack(masks) if masks else np.zeros((0, words), dtype=np.uint64),
        block_ptr=np.array(block_ptr, dtype=np.int64),
        con_ptr=np.array(con_ptr, dtype=np.int64),
        con_vector=np.array(con_vector, dtype=np.int64),
        con_coef=np.array(con_coef, dtype=np.int64),
        max_masks=most,
    )


@numba.njit(cache=True, nogil=True, inline="always")
def _be32(buf, pos):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    return (
        (np.int64(buf[pos]) << 24)
        | (np.int64(buf[pos + 1]) << 16)
        | (np.int64(buf[pos + 2]) << 8)
        | np.int64(buf[pos + 3])
    )


@numba.njit(cache=True, nogil=True, inline="always")
def _value(buf, pos, itemsize, signed):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    """The little-endian integer of ``itemsize`` bytes at ``buf[pos]``."""
    v = np.int64(0)
    for t in range(itemsize):
        v |= np.int64(buf[pos + t]) << (8 * t)
    if signed and v >= (np.int64(1) << (8 * itemsize - 1)):
        v -= np.int64(1) << (8 * itemsize)
    return v


@numba.njit(cache=True, nogil=True)
def _stored_totals(  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    lz4,
    data,
    starts,
    sizes,
    unfiltered,
    first,
    stop,
    n_elem,
    itemsize,
    signed,
    block,
    plane_w,
    masks,
    block_ptr,
    con_ptr,
    con_vector,
    con_coef,
    vectors,
    fill,
    scratch,
    totals,
    status,
):
    """Each frame's vector totals from its stored chunk; returns where it stopped.

    Stops at ``stop``, or at a frame whose chunk is bad (``status[0] = 1``) or
    has a block size other than ``block`` (``status[0] = 2``, ``status[1]``
    that size); the caller names the frame, or plans the new size and goes on.
    """
    n_vec = vectors.shape[0]
    base = data.ctypes.data
    sp = scratch.ctypes.data
    planes_n = itemsize * 8
    full = n_elem // block
    last = n_elem % block
    last -= last % 8
    n_blocks = full + (1 if last > 0 else 0)
    tail = n_elem % 8
    counts = np.zeros(max(masks.shape[0], 1), dtype=np.int64)
    for f in range(first, stop):
        a = starts[f]
        size = sizes[f]
        if a < 0:
            for v in range(n_vec):
                totals[f, v] = fill[v]
            continue
        if unfiltered[f]:
            if size != n_elem * itemsize:
                status[0] = 1
                return f
            for e in range(n_elem):
                x = _value(data, a + e * itemsize, itemsize, signed)
                if x != 0:
                    for v in range(n_vec):
                        totals[f, v] += vectors[v, e] * x
            continue
        end = a + size
        if size < 12:
            status[0] = 1
            return f
        nbytes = np.int64(0)
        for t in range(8):
            nbytes = (nbytes << 8) | np.int64(data[a + t])
        block_bytes = _be32(data, a + 8)
        if nbytes != n_elem * itemsize or block_bytes == 0 or block_bytes % (itemsize * 8):
            status[0] = 1
            return f
        header_block = block_bytes // itemsize
        whole = n_elem - n_elem % 8
        if whole and header_block > whole:  # one block of the frame's values: the same layout
            header_block = whole
        if whole and header_block != block:
            status[0] = 2
            status[1] = header_block
            return f
        pos = a + 12
        for b in range(n_blocks):
            m = block if b < full else last
            if pos + 4 > end:
                status[0] = 1
                return f
            length = _be32(data, pos)
            pos += 4
            if length > end - pos or length > 0x7FFFFFFF:
                status[0] = 1
                return f
            got = lz4(base + pos, sp, np.int32(length), np.int32(m * itemsize))
            if got != m * itemsize:
                status[0] = 1
                return f
            pos += length
            plane_bytes = m // 8
            if plane_bytes % 8:
                # planes not a whole number of words apart: pad each to whole words
                stride = -(-plane_bytes // 8) * 8
                for p in range(planes_n - 1, -1, -1):
                    for t in range(stride - 1, -1, -1):
                        scratch[p * stride + t] = (
                            scratch[p * plane_bytes + t] if t < plane_bytes else 0
                        )
                plane_bytes = stride
            qs = plane_bytes // 8
            planes = scratch[: planes_n * plane_bytes].view(np.uint64)
            u0 = block_ptr[b]
            u1 = block_ptr[b + 1]
            for u in range(u0, u1):
                counts[u - u0] = 0
            for p in range(planes_n):
                row = planes[p * qs : (p + 1) * qs]
                acc = np.uint64(0)
                for q in range(qs):
                    acc |= row[q]
                if acc == 0:  # an all-zero plane: the high bits of counted data
                    continue
                for u in range(u0, u1):
                    mask = masks[u]
                    acc = np.uint64(0)
                    for q in range(qs):
                        acc += _popcount(row[q] & mask[q])  # type: ignore[call-arg]
                    counts[u - u0] += plane_w[p] * np.int64(acc)
            for u in range(u0, u1):
                count = counts[u - u0]
                for c in range(con_ptr[u], con_ptr[u + 1]):
                    totals[f, con_vector[c]] += con_coef[c] * count
        if pos + tail * itemsize != end:
            status[0] = 1
            return f
        for t in range(tail):
            x = _value(data, pos + t * itemsize, itemsize, signed)
            e = n_elem - tail + t
            for v in range(n_vec):
                totals[f, v] += vectors[v, e] * x
    return stop


_cache: dict[tuple[int, str], tuple[WeightPlan, BitplanePass | None, str]] = {}
_cache_lock = threading.Lock()
_ELEMENTS = ("uint8", "int8", "uint16", "int16", "uint32", "int32")


def bitplane_pass_for(
    plan: WeightPlan, dtype: np.dtype[Any], *, want_patterns: bool
) -> tuple[BitplanePass | None, str]:
    """The :class:`BitplanePass` for ``plan`` on stored ``dtype`` frames, or ``None`` and why not.

    Passes are cached per plan (plans are cached by content).
    """
    dt = np.dtype(dtype)
    if not config.get("bitplane_kernel"):
        return None, "bit-plane kernel off (setting bitplane_kernel)"
    if dt.name not in _ELEMENTS:
        return None, f"bit-plane kernel: {dt.name} frames (8/16/32-bit integers only)"
    if plan.general.size:
        return None, f"bit-plane kernel: {plan.general.size} general rows"
    if want_patterns:
        return None, "bit-plane kernel: a sum or maximum pattern is asked for"
    if lz4_block_decoder() is None:
        return None, "bit-plane kernel: the bitshuffle library has no LZ4_decompress_safe"
    key = (id(plan), dt.str)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] is plan:  # the plan itself: ids of dead plans are reused
            return hit[1], hit[2]
    bp: BitplanePass | None = BitplanePass(plan, dt)
    assert bp is not None
    block = 8192 // dt.itemsize  # the filter's default block; others are planned when met
    cost = bp.block_plan(block).max_masks * dt.itemsize * 8
    if cost > MAX_MASK_PLANES:
        why = (
            f"bit-plane kernel: {bp.block_plan(block).max_masks} masks x {dt.itemsize * 8} "
            f"planes per block = {cost}, over {MAX_MASK_PLANES}: decoded, then the usual kernels"
        )
        bp = None
    else:
        why = (
            f"{bp.describe(block)}; chosen: {cost} mask-planes per block, at most {MAX_MASK_PLANES}"
        )
    with _cache_lock:
        _cache[key] = (plan, bp, why)
        while len(_cache) > 32:
            _cache.pop(next(iter(_cache)))
    return bp, why


def warm_bitplane() -> None:
    """Compile (or load from Numba's cache) the kernel: one BF row on four small stored frames."""
    import struct

    from ...representations.encoded import _bitshuffle
    from .structure import analyse_weights

    shape = (8, 8)
    frame = np.arange(64, dtype=np.uint16)
    body = np.asarray(_bitshuffle().compress_lz4(frame, 64)).tobytes()
    chunk = np.frombuffer(struct.pack(">QI", frame.nbytes, 128) + body, dtype=np.uint8)
    stored = StoredFrames(
        data=np.concatenate([chunk] * 4),
        starts=np.arange(4, dtype=np.int64) * chunk.size,
        sizes=np.full(4, chunk.size, dtype=np.int64),
        unfiltered=np.zeros(4, dtype=bool),
        dtype=np.dtype(np.uint16),
        frame_shape=shape,
        fill=0,
        where="the bit-plane kernel's warm-up frames",
        numbers=np.arange(4, dtype=np.int64),
    )
    plan = analyse_weights(np.ones((1, 64)), frame_shape=shape, force=True)
    out = np.zeros((4, plan.n_out))
    BitplanePass(plan, np.dtype(np.uint16)).run(stored, out)
    if not np.all(out[:, 0] == frame.sum()):  # pragma: no cover - a broken build
        raise RuntimeError(f"the bit-plane kernel's warm-up summed {out[:, 0]}, not {frame.sum()}")
