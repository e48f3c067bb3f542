"""The packed representation: exact fixed-width bit-packed counts, one width per block.

Counts of a counting (or integrating, low-gain) detector rarely use all 16
bits of their dtype.  ``packed`` cuts every frame into blocks of
``block_values`` pixels and stores each block's values in just as many bits
as its largest value needs, so a block of zeros costs nothing but its
metadata and a block whose maximum is 3 costs 2 bits a pixel.  It is exact:
:meth:`Packed.to_dense` gives back every value and the dtype.

Admission: only integer data whose values are all in ``0 <= v < 2**16``
(any integer dtype, signed or unsigned; the dtype is kept).  Anything else
(negative values, values of 65536 or more, floats, booleans) raises
:class:`~quantem_flow.errors.ParameterError` naming what was found.

Layout (storage schema ``packed-blockwidth-v1``)
------------------------------------------------
A payload holds ``N = rows * cols`` frames of ``K = k_r * k_c`` values in
the order of ``dense.reshape(N, K)``: frames in scan order (row-major),
values row-major over the detector.

Blocks.  Each frame is cut into ``nb = ceil(K / B)`` blocks of
``B = block_values`` consecutive values (``B`` a multiple of 32).  Blocks
never straddle frames: the last block of each frame holds the remaining
``K - (nb - 1) * B`` values.  Block ``j`` of frame ``f`` is block number
``i = f * nb + j``; ``n_i`` is its number of values.

``widths[i]`` (``uint8``, 0..16)
    The bit length of block ``i``'s maximum value (``int(max).bit_length()``).
    0 means every value is 0; such a block stores no bits.
``offsets[i]`` (``int64``)
    Index in ``data`` of block ``i``'s first 32-bit word.  Blocks are stored
    in order, each starting on a word boundary: ``offsets[0] = 0`` and
    ``offsets[i + 1] = offsets[i] + ceil(n_i * widths[i] / 32)``.  A full
    block takes exactly ``B * widths[i] / 32`` words.
``data`` (``uint32``, little-endian ``<u4``)
    The blocks' words, then **one trailing zero word** of padding, so a
    decoder may always read the word pair ``(m, m + 1)`` where a value starts.
    Within block ``i`` of width ``w``, value ``t`` (0-based) occupies bits
    ``t * w`` to ``t * w + w - 1`` of the block's bit stream, least
    significant bit first, where stream bit ``b`` is bit ``b % 32`` of word
    ``offsets[i] + b // 32``.  A value may straddle two words.  Unused bits
    after a block's last value are zero.  (Since words are little-endian,
    read as bytes the stream bit ``b`` is bit ``b % 8`` of byte
    ``4 * offsets[i] + b // 8``.)

Decoding value ``t`` of block ``i``, in words::

    q = t * w
    x = data[o + q // 32] | (data[o + q // 32 + 1] << 32)   # 64-bit window
    v = (x >> (q % 32)) & (2**w - 1)                        # o = offsets[i]

Physical size (:attr:`PackedPayload.nbytes`): ``data`` plus ``widths`` (1
byte per block) plus ``offsets`` (8 bytes per block).

The block size
--------------
Small blocks follow the data's local dynamic range more closely (one hot
pixel widens only its own block), large blocks cost less metadata (9 bytes
a block: a width and an offset).  Measured on 64 frames of 256 x 256
uint16, dense bytes over packed bytes for ``B`` = 32 / 64 / 128 / 256 / 512:

====================================  =====  =====  =====  =====  =====
data                                  32     64     128    256    512
====================================  =====  =====  =====  =====  =====
counted, 0.1% of pixels hold 1-3      7.0    13.0   20.8   23.9   19.1
counted, 1% of pixels hold 1-3        5.9    8.2    8.6    7.9    7.6
Poisson, 0.5 counts a pixel           3.8    5.0    5.8    6.1    5.9
disk of 5 counts on 0.05 background   4.6    6.1    6.2    6.7    6.7
disk of 2000 on 20 background         1.9    2.1    2.0    2.0    2.0
integrating, 100 +- 10 counts         1.7    1.9    2.0    2.1    2.0
====================================  =====  =====  =====  =====  =====

128 is the default: within 13% of the best size on every row (64 loses
almost half on the sparsest data, 256 loses on the 1% counted data), and
decoding speed hardly depends on ``B`` in this range.

Packing and unpacking run in Numba, block by block, on one core (``nogil``,
so Dask's threads pack chunks in parallel).  Measured on this project's
2-core machine (shared, so +-30%) on 256 frames of 256 x 256 uint16, per
byte of dense input: packing (widths pass, then packing pass) 1.0-2.1 GB/s;
unpacking into a reused 4-frame buffer 1.7-3.7 GB/s (faster on sparser
data: a width-0 block is a fill).  Kernels decode a few frames at a time
(:func:`unpack_frames`) and never the whole payload.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numba
import numpy as np

from .. import config
from ..errors import ParameterError, ShapeError
from .base import Representation

__all__ = [
    "DEFAULT_BLOCK_VALUES",
    "MAX_WIDTH",
    "PACKED_SCHEMA",
    "Packed",
    "PackedPayload",
    "block_word_counts",
    "unpack_frames",
]

#: Versioned name of the layout described in the module docstring.
PACKED_SCHEMA = "packed-blockwidth-v1"
#: Values per block when ``block_values`` is not given (chosen by measurement).
DEFAULT_BLOCK_VALUES = 128
#: Largest bit width of a block: values are below ``2**MAX_WIDTH``.
MAX_WIDTH = 16


def _jit(fn: Any) -> Any:
    return numba.njit(cache=bool(config.get("numba_cache")), nogil=True)(fn)


# ----------------------------------------------------------------------------- Numba codec


# Loops index slices from 0 (``blk = row[s:e]``, ``for t in range(blk.shape[0])``): with
# a start of 0 Numba's negative-index wraparound check folds away and the loops
# vectorise (measured 2x on the widths pass).


@_jit
def _block_widths(frames, bv, widths):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    # Width of a block = bit length of the OR of its values = bit length of its
    # maximum (for non-negative values).  The OR also admits the data in the
    # same pass: negative when any value is negative (a uint64 value >= 2**63
    # reads as negative too), above 65535 when any value is too large.
    n, k = frames.shape
    nb = (k + bv - 1) // bv
    seen = np.int64(0)
    for f in range(n):
        row = frames[f]
        for j in range(nb):
            s = j * bv
            blk = row[s : min(s + bv, k)]
            acc = np.int64(0)
            for t in range(blk.shape[0]):
                acc |= np.int64(blk[t])
            seen |= acc
            w = 0
            while acc > 0 and w <= 16:
                acc >>= 1
                w += 1
            widths[f * nb + j] = w
    return seen >= 0 and seen <= 65535


@_jit
def _block_offsets(widths, k, bv, offsets):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    # Exclusive prefix sum of block sizes in 32-bit words; returns the total.
    nb = (k + bv - 1) // bv
    last = k - (nb - 1) * bv
    o = np.int64(0)
    for i in range(widths.shape[0]):
        cnt = last if i % nb == nb - 1 else bv
        offsets[i] = o
        o += (cnt * np.int64(widths[i]) + 31) >> 5
    return o


@_jit
def _pack_block(blk, w, data, o):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    # LSB-first into a 64-bit bit buffer, flushing whole 32-bit words.
    acc = np.uint64(0)
    nbits = np.int64(0)
    for t in range(blk.shape[0]):
        acc |= np.uint64(blk[t]) << np.uint64(nbits)
        nbits += w
        if nbits >= 32:
            data[o] = np.uint32(acc & np.uint64(0xFFFFFFFF))
            o += 1
            acc >>= np.uint64(32)
            nbits -= 32
    if nbits > 0:
        data[o] = np.uint32(acc & np.uint64(0xFFFFFFFF))


@_jit
def _pack(frames, bv, widths, offsets, data):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    n, k = frames.shape
    nb = (k + bv - 1) // bv
    for f in range(n):
        row = frames[f]
        for j in range(nb):
            i = f * nb + j
            w = np.int64(widths[i])
            if w:
                s = j * bv
                _pack_block(row[s : min(s + bv, k)], w, data, offsets[i])


@_jit
def _unpack_block(data, o, w, blk):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    # A 64-bit bit buffer refilled one word at a time: measured ~2x faster than
    # computing each value's word pair from its index.
    if w == 0:
        blk[:] = 0
        return
    mask = (np.uint64(1) << np.uint64(w)) - np.uint64(1)
    uw = np.uint64(w)
    acc = np.uint64(0)
    nbits = 0
    for t in range(blk.shape[0]):
        if nbits < w:
            acc |= np.uint64(data[o]) << np.uint64(nbits)
            o += 1
            nbits += 32
        blk[t] = acc & mask
        acc >>= uw
        nbits -= w


@_jit
def unpack_frames(data, widths, offsets, bv, f0, f1, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    """Decode frames ``f0:f1`` into the rows of ``out`` (``(>= f1 - f0, K)``, any dtype)."""
    k = out.shape[1]
    nb = (k + bv - 1) // bv
    for f in range(f0, f1):
        row = out[f - f0]
        for j in range(nb):
            i = f * nb + j
            s = j * bv
            _unpack_block(data, offsets[i], np.int64(widths[i]), row[s : min(s + bv, k)])


# ----------------------------------------------------------------------------- payload


def block_word_counts(widths: np.ndarray, frame_size: int, block_values: int) -> np.ndarray:
    """Return the 32-bit words each block takes (int64), from its width.

    Parameters
    ----------
    widths
        ``uint8`` widths, ``blocks_per_frame`` per frame.
    frame_size
        Values per frame ``K``.
    block_values
        Values per full block ``B``.

    Returns
    -------
    numpy.ndarray
        ``ceil(n_i * widths[i] / 32)`` for every block ``i``.
    """
    nb = -(-frame_size // block_values)
    counts = np.full(nb, block_values, dtype=np.int64)
    if nb:
        counts[-1] = frame_size - (nb - 1) * block_values
    n = np.resize(counts, widths.shape[0]) if nb else np.zeros(0, dtype=np.int64)
    result: np.ndarray = (n * widths.astype(np.int64) + 31) >> 5
    return result


@dataclasses.dataclass(frozen=True, eq=False)
class PackedPayload:
    """One chunk in the ``packed-blockwidth-v1`` layout (see the module docstring).

    Attributes
    ----------
    scan_shape
        ``(rows, cols)`` of scan positions.
    frame_shape
        ``(k_r, k_c)`` of one decoded frame.
    value_dtype
        Dtype of the decoded values (the dense block's, native byte order).
    block_values
        Values per full block ``B`` (a multiple of 32).
    widths
        ``uint8`` bit width of every block, ``ceil(K / B)`` per frame.
    offsets
        ``int64`` first 32-bit word of every block in :attr:`data`.
    data
        ``<u4`` packed words plus one trailing zero word.

    Raises
    ------
    ShapeError
        If the arrays do not describe a consistent layout.
    """

    scan_shape: tuple[int, int]
    frame_shape: tuple[int, int]
    value_dtype: np.dtype[Any]
    block_values: int
    widths: np.ndarray
    offsets: np.ndarray
    data: np.ndarray

    def __post_init__(self) -> None:
        problems = []
        if self.widths.dtype != np.uint8 or self.widths.ndim != 1:
            problems.append(
                f"widths must be 1-D uint8, got {self.widths.dtype} {self.widths.shape}"
            )
        if self.offsets.dtype != np.int64 or self.offsets.shape != self.widths.shape:
            problems.append(
                f"offsets must be int64 of shape {self.widths.shape}, got {self.offsets.dtype} "
                f"{self.offsets.shape}"
            )
        if self.data.dtype != np.dtype("<u4") or self.data.ndim != 1 or self.data.size < 1:
            problems.append(
                f"data must be 1-D little-endian uint32 with a padding word, got "
                f"{self.data.dtype} {self.data.shape}"
            )
        if self.block_values < 32 or self.block_values % 32:
            problems.append(f"block_values must be a multiple of 32, got {self.block_values}")
        n_blocks = self.n_frames * self.blocks_per_frame
        if not problems and self.widths.shape[0] != n_blocks:
            problems.append(
                f"{self.widths.shape[0]} blocks for {self.n_frames} frames of "
                f"{self.blocks_per_frame} blocks"
            )
        if not problems and n_blocks:
            if int(self.widths.max()) > MAX_WIDTH:
                problems.append(f"a block width is {int(self.widths.max())} > {MAX_WIDTH}")
            else:
                words = block_word_counts(self.widths, self.frame_size, self.block_values)
                ends = np.cumsum(words)
                if int(self.offsets[0]) != 0 or not np.array_equal(self.offsets[1:], ends[:-1]):
                    problems.append("offsets are not the running sum of the block sizes")
                elif int(ends[-1]) + 1 != self.data.size:
                    problems.append(
                        f"data holds {self.data.size} words, the blocks need {int(ends[-1])} + 1"
                    )
        if problems:
            raise ShapeError(
                "inconsistent packed payload: "
                + "; ".join(problems)
                + "; build payloads with Packed().from_dense"
            )

    @property
    def dtype(self) -> np.dtype[Any]:
        """Dtype of the decoded values."""
        return self.value_dtype

    @property
    def nbytes(self) -> int:
        """Physical bytes held: data, widths and offsets."""
        return int(self.data.nbytes + self.widths.nbytes + self.offsets.nbytes)

    @property
    def n_frames(self) -> int:
        """Frames (scan positions) held."""
        return int(self.scan_shape[0]) * int(self.scan_shape[1])

    @property
    def frame_size(self) -> int:
        """Values per frame ``K = k_r * k_c``."""
        return int(self.frame_shape[0]) * int(self.frame_shape[1])

    @property
    def blocks_per_frame(self) -> int:
        """``ceil(K / B)``."""
        return -(-self.frame_size // self.block_values)

    @property
    def logical_nbytes(self) -> int:
        """Bytes of the dense equivalent."""
        return self.n_frames * self.frame_size * self.value_dtype.itemsize


# ----------------------------------------------------------------------------- representation

_ADMITS = "packed holds integer counts 0 <= v < 65536 (up to 16 bits a value)"


def _check_block_values(value: Any) -> int:
    try:
        bv = int(value)
    except (TypeError, ValueError):
        bv = -1
    if bv != value or bv < 32 or bv % 32:
        raise ParameterError(
            f"block_values must be a positive multiple of 32 (values per block), got {value!r}; "
            f"the default is {DEFAULT_BLOCK_VALUES}"
        )
    return bv


def _refuse(frames: np.ndarray) -> ParameterError:
    """The admission error for integer data holding a value that does not fit."""
    lo, hi = int(frames.min()), int(frames.max())
    if lo < 0:
        return ParameterError(
            f"{_ADMITS}; the {frames.dtype} data hold negative values (minimum {lo}). Keep "
            "them dense, or subtract a recorded offset and clip explicitly before packing"
        )
    return ParameterError(
        f"{_ADMITS}; the {frames.dtype} data hold values up to {hi} (>= 65536). Keep them "
        "dense (or paired for sparse counts), or bin less before packing"
    )


class Packed(Representation):
    """Exact fixed-width bit-packed counts in blocks, one width per block."""

    name: ClassVar[str] = "packed"
    schema: ClassVar[str] = PACKED_SCHEMA

    def from_dense(self, block: np.ndarray, **options: Any) -> PackedPayload:
        """Pack a dense ``(rows, cols, k_r, k_c)`` block, exactly.

        Parameters
        ----------
        block
            Integer counts, every value in ``0 <= v < 65536``.
        **options
            ``block_values`` (int, a multiple of 32, default
            :data:`DEFAULT_BLOCK_VALUES`): values per block.

        Returns
        -------
        PackedPayload
            The packed chunk; its decoded dtype is the block's.

        Raises
        ------
        ParameterError
            If the block is not integer, holds a negative value or one of
            65536 or more, or an option is unknown or invalid.
        ShapeError
            If the block is not 4-D.
        """
        unknown = sorted(set(options) - {"block_values"})
        if unknown:
            raise ParameterError(
                f"unknown packed option(s) {unknown}; packed takes block_values= (a multiple "
                f"of 32, default {DEFAULT_BLOCK_VALUES})"
            )
        bv = _check_block_values(options.get("block_values", DEFAULT_BLOCK_VALUES))
        block = np.asarray(block)
        if block.ndim != 4:
            raise ShapeError(
                f"packed converts (rows, cols, k_r, k_c) blocks, got shape {block.shape}"
            )
        if block.dtype.kind not in "ui":
            raise ParameterError(
                f"{_ADMITS}; the data are {block.dtype}. Keep them dense, or convert counts "
                "to an integer dtype explicitly (and exactly) before packing"
            )
        value_dtype = block.dtype.newbyteorder("=")
        rows, cols, kr, kc = (int(v) for v in block.shape)
        n, k = rows * cols, kr * kc
        frames = np.ascontiguousarray(block, dtype=value_dtype).reshape(n, k)
        nb = -(-k // bv)
        widths = np.empty(n * nb, dtype=np.uint8)
        if not _block_widths(frames, bv, widths):
            raise _refuse(frames)
        offsets = np.empty(n * nb, dtype=np.int64)
        total = int(_block_offsets(widths, k, bv, offsets)) if n * nb else 0
        data = np.zeros(total + 1, dtype="<u4")  # zeroed: padding word and unused bits
        _pack(frames, bv, widths, offsets, data)
        return PackedPayload(
            scan_shape=(rows, cols),
            frame_shape=(kr, kc),
            value_dtype=value_dtype,
            block_values=bv,
            widths=widths,
            offsets=offsets,
            data=data,
        )

    def to_dense(self, payload: Any) -> np.ndarray:
        """Unpack every frame into a ``(rows, cols, k_r, k_c)`` array of the payload's dtype."""
        p = _as_payload(payload)
        out = np.empty((p.n_frames, p.frame_size), dtype=p.value_dtype)
        unpack_frames(p.data, p.widths, p.offsets, p.block_values, 0, p.n_frames, out)
        return out.reshape(*p.scan_shape, *p.frame_shape)


def _as_payload(payload: Any) -> PackedPayload:
    if not isinstance(payload, PackedPayload):
        raise ParameterError(
            f"expected a PackedPayload (from Packed().from_dense), got {type(payload).__name__}"
        )
    return payload
