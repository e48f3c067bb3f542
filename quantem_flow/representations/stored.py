"""Frames as their file stores them: one bitshuffle + LZ4 chunk per frame, not yet decoded.

A Dectris acquisition, or an HDF5 dataset written with the bitshuffle
filter (32008) in chunks of one frame, stores each frame as a 12-byte header
(big-endian uint64 uncompressed bytes, uint32 block bytes), then per block
of ``block`` elements a big-endian uint32 length and the LZ4-compressed
block, whose bytes are the block's *bit planes* (plane ``p`` holds bit ``p``
of every element, element ``e`` at byte ``e // 8``, bit ``e % 8``), then the
``n % 8`` last elements verbatim.

:class:`StoredFrames` holds a run of such frames as read (the reader's span
of bytes and where each frame's chunk lies in it).  It is what a streamed
pass over such a file hashes (the content digest names the stored bytes:
docs/data-integrity.md) and what the CPU runtime's bit-plane kernel
(:mod:`quantem_flow.runtimes.cpu.bitplane`) computes masked sums on without
decoding; :meth:`StoredFrames.decode` gives the values for every other
kernel.  Each chunk is checked as every reader checks it before it is
decoded (:func:`~quantem_flow.representations.stored_kernels.checked_block`):
the bitshuffle library trusts the header and writes past its buffer when a
bit of it flips (docs/upstream-bitshuffle-crash.md).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from ..errors import CorruptChunkError

__all__ = [
    "DECODE_PIECE_BYTES",
    "STORED_CODEC",
    "StoredFrames",
    "chunk_problem",
    "concat_stored",
    "decode_lz4_into",
    "lz4_block_decoder",
]

#: The codec of :class:`StoredFrames` (the HDF5 bitshuffle filter's format with LZ4).
STORED_CODEC = "bitshuffle-lz4"

#: Decoded bytes per piece when stored frames are decoded for kernels that need the values
#: (the streamed pass's piece, docs/streamed-pass.md): decoded and run while in cache.
DECODE_PIECE_BYTES = 2 << 20


@dataclasses.dataclass(frozen=True, eq=False)
class StoredFrames:
    """Frames of a source as stored: one bitshuffle + LZ4 chunk each, in scan order.

    Attributes
    ----------
    data
        ``uint8`` bytes holding the chunks (and any bytes between them that
        the read spanned).
    starts
        ``int64`` per frame: where its chunk starts in ``data``; ``-1`` for a
        chunk never written (it reads as ``fill``).
    sizes
        ``int64`` per frame: its chunk's stored bytes (0 when never written).
    unfiltered
        ``bool`` per frame: the chunk was stored with the filter skipped
        (HDF5 filter mask bit 0): its bytes are the values themselves.
    dtype
        The values' dtype (native byte order, integers of 1, 2 or 4 bytes).
    frame_shape
        ``(k_r, k_c)``.
    fill
        The value of a frame never written.
    where
        The file and dataset, for messages.
    numbers
        ``int64`` per frame: its number in the source (for messages).
    """

    data: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray
    unfiltered: np.ndarray
    dtype: np.dtype[Any]
    frame_shape: tuple[int, int]
    fill: int
    where: str
    numbers: np.ndarray

    def __post_init__(self) -> None:
        # what the kernels and the decoder rely on: every chunk lies within ``data``
        n = self.starts.shape[0]
        if not (self.sizes.shape[0] == self.unfiltered.shape[0] == self.numbers.shape[0] == n):
            raise ValueError(
                f"stored frames: starts ({n}), sizes ({self.sizes.shape[0]}), unfiltered "
                f"({self.unfiltered.shape[0]}) and numbers ({self.numbers.shape[0]}) must be "
                "of one length"
            )
        written = self.starts >= 0
        if bool(np.any(self.sizes < 0)) or bool(
            np.any(self.starts[written] + self.sizes[written] > self.data.shape[0])
        ):
            raise ValueError(
                f"stored frames: a chunk lies outside the {self.data.shape[0]} bytes held "
                "(negative size, or start + size past the end)"
            )

    @property
    def n_frames(self) -> int:
        """Frames held."""
        return int(self.starts.shape[0])

    @property
    def frame_elements(self) -> int:
        """Values per frame."""
        return int(self.frame_shape[0] * self.frame_shape[1])

    @property
    def stored_bytes(self) -> int:
        """The chunks' bytes (what a pass over them reads from the file)."""
        return int(self.sizes.sum())

    def pieces(self, piece_bytes: int = DECODE_PIECE_BYTES) -> list[tuple[int, int]]:
        """``(start, stop)`` of runs of frames decoding to at most ``piece_bytes``.

        Each a multiple of 4 frames (the CPU kernels' frame group), at least 4.
        """
        frame = max(1, self.frame_elements * self.dtype.itemsize)
        step = max(4, piece_bytes // frame // 4 * 4)
        return [(a, min(self.n_frames, a + step)) for a in range(0, self.n_frames, step)]

    def frames(self, start: int, stop: int) -> StoredFrames:
        """Frames ``[start, stop)`` of this run (sharing its bytes)."""
        return dataclasses.replace(
            self,
            starts=self.starts[start:stop],
            sizes=self.sizes[start:stop],
            unfiltered=self.unfiltered[start:stop],
            numbers=self.numbers[start:stop],
        )

    def corrupt(self, frame: int, problem: str) -> CorruptChunkError:
        """The error naming frame ``frame`` (0-based in this run) and what is wrong with it."""
        at = int(self.starts[frame])
        return CorruptChunkError(
            f"the stored chunk of frame {int(self.numbers[frame])} of {self.where} is corrupt: "
            f"{problem} ({int(self.sizes[frame])} stored bytes{'' if at >= 0 else ', unwritten'})"
            ". It was not decoded; restore or re-acquire the file, or crop the scan to leave "
            "this frame out"
        )

    def chunk(self, frame: int) -> np.ndarray:
        """The stored bytes of frame ``frame``'s chunk (empty when never written)."""
        a = int(self.starts[frame])
        return self.data[a : a + int(self.sizes[frame])] if a >= 0 else self.data[:0]

    def decode(self, out: np.ndarray | None = None) -> np.ndarray:
        """The values, ``(n, k_r * k_c)`` of :attr:`dtype` (into ``out`` when given).

        Every chunk is checked before it is decoded; a bad one raises
        :class:`~quantem_flow.errors.CorruptChunkError` naming the frame.
        """
        n, k = self.n_frames, self.frame_elements
        if out is not None and (out.dtype != self.dtype or not out.flags.c_contiguous):
            raise ValueError(
                f"decode needs a C-contiguous {self.dtype} destination of {n} x {k} values, "
                f"got {out.dtype} (C-contiguous: {out.flags.c_contiguous})"
            )
        target = np.empty((n, k), dtype=self.dtype) if out is None else out.reshape(n, k)
        from .stored_kernels import decode_span

        into = decode_lz4_into()
        frames = target.view(np.uint8)
        plain = (self.starts >= 0) & ~self.unfiltered
        if into is not None and bool(plain.all()):
            bad = decode_span(into, self.data, self.starts, self.sizes, k, frames)
            if bad >= 0:
                raise self.corrupt(int(bad), chunk_problem(self.chunk(int(bad)), k, self.dtype))
            return target
        for f in range(n):
            target[f] = self._decode_one(f, k)
        return target

    def _decode_one(self, f: int, k: int) -> np.ndarray:
        if self.starts[f] < 0:
            return np.full(k, self.fill, dtype=self.dtype)
        data = self.chunk(f)
        if self.unfiltered[f]:
            if data.shape[0] != k * self.dtype.itemsize:
                raise self.corrupt(
                    f,
                    f"it was stored unfiltered with {data.shape[0]} bytes, expected "
                    f"{k * self.dtype.itemsize}",
                )
            return data.view(self.dtype)
        from .encoded import _bitshuffle, bitshuffle_chunk_problem

        problem = bitshuffle_chunk_problem(data, k, self.dtype.itemsize)
        if problem is not None:
            raise self.corrupt(f, problem)

        block = int.from_bytes(data[8:12].tobytes(), "big") // self.dtype.itemsize
        try:
            return np.asarray(_bitshuffle().decompress_lz4(data[12:], (k,), self.dtype, block))
        except Exception as exc:  # the codec's own errors (RuntimeError, ValueError)
            raise self.corrupt(f, f"{type(exc).__name__}: {exc}") from exc


def concat_stored(parts: list[StoredFrames]) -> StoredFrames:
    """Runs of stored frames one after the other, as one (their bytes copied into one array)."""
    if not parts:
        raise ValueError("concat_stored needs at least one run of stored frames")
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    for p in parts[1:]:
        if (p.dtype, p.frame_shape) != (first.dtype, first.frame_shape):
            raise ValueError(
                f"stored frames of {p.dtype} {p.frame_shape} cannot follow {first.dtype} "
                f"{first.frame_shape}"
            )
    shifts = np.cumsum([0] + [p.data.shape[0] for p in parts[:-1]])
    return dataclasses.replace(
        first,
        data=np.concatenate([p.data for p in parts]),
        starts=np.concatenate(
            [np.where(p.starts >= 0, p.starts + s, -1) for p, s in zip(parts, shifts, strict=True)]
        ),
        sizes=np.concatenate([p.sizes for p in parts]),
        unfiltered=np.concatenate([p.unfiltered for p in parts]),
        numbers=np.concatenate([p.numbers for p in parts]),
        where=first.where
        if len({p.where for p in parts}) == 1
        else "; ".join(dict.fromkeys(p.where for p in parts)),
    )


def chunk_problem(data: np.ndarray, k: int, dtype: np.dtype[Any]) -> str:
    """What is wrong with a chunk a decoder stopped on: its checks, else the codec's failure."""
    from .encoded import bitshuffle_chunk_problem

    found = bitshuffle_chunk_problem(data, k, dtype.itemsize)
    return found if found is not None else "an LZ4 block does not decode to its size"


_DECODERS: dict[str, Any] = {}
_DECODERS_LOCK = threading.Lock()


def _library_function(name: str, restype: Any, argtypes: list[Any]) -> Any:
    import ctypes

    from .encoded import _bitshuffle

    with _DECODERS_LOCK:
        if name not in _DECODERS:
            module = _bitshuffle()
            found = None
            try:
                found = getattr(ctypes.CDLL(module.ext.__file__), name)
                found.restype = restype
                found.argtypes = argtypes
            except (AttributeError, OSError):  # pragma: no cover - a build without the symbol
                found = None
            _DECODERS[name] = found
        return _DECODERS[name]


def decode_lz4_into() -> Any:
    """The bitshuffle library's ``bshuf_decompress_lz4`` through ``ctypes``, or ``None``.

    ``(in, out, n_elements, element_size, block_size) -> bytes consumed``
    (negative on error): decodes a bitshuffle + LZ4 stream straight into
    the destination frames, releasing the GIL.  Only called on streams whose
    headers and block lengths were checked first
    (:func:`~quantem_flow.representations.stored_kernels.checked_block`).
    """
    import ctypes

    return _library_function(
        "bshuf_decompress_lz4",
        ctypes.c_int64,
        [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_size_t] * 3,
    )


def lz4_block_decoder() -> Any:
    """``LZ4_decompress_safe`` of the LZ4 library inside ``bitshuffle``, or ``None``.

    ``(src, dst, compressed_bytes, dst_capacity) -> bytes written`` (negative
    on malformed input: the safe decoder never reads or writes outside the
    sizes given).  The bit-plane kernel decodes one block at a time with it.
    """
    import ctypes

    return _library_function(
        "LZ4_decompress_safe",
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int],
    )
