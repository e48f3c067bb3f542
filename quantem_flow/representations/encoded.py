"""The encoded representation: the compressed bytes of stored chunks, decoded inside the pass.

A chunk of an ``encoded`` dataset holds *pieces*: compressed byte strings,
each decoding to a fixed number of whole frames.  Read natively, the pieces
are the stored chunks of the file exactly as they lie on disk (the
bitshuffle + LZ4 chunks of a Dectris file read with ``read_direct_chunk``,
the chunk files of a Zarr v3 store); made from dense, they are encoded here
with a maintained codec library (``bitshuffle``, ``numcodecs``).  Nothing is
decoded when a chunk is loaded or made resident: kernels decode one piece
at a time into a small reusable buffer inside their pass (see
:mod:`quantem_flow.runtimes.cpu.encoded_kernels`).

Layout ``encoded-v1`` (:class:`EncodedPayload`):

- ``data``: every piece back to back (``uint8``); piece ``i`` is
  ``data[offsets[i]:offsets[i + 1]]``.  A piece of length 0 is a chunk
  absent from the store and decodes to ``fill_value`` (as HDF5 and Zarr
  define for chunks never written).
- ``piece_frames[i]``: frames piece ``i`` decodes to (a stored chunk may hold
  several frames; edge chunks are stored full size).
- ``runs``: ``(piece, first frame in the piece, frames)`` rows, in scan
  order; the payload's frames are these runs concatenated.  Leading frames
  of a piece (a ``frame_offset``, a column range) are skipped by ``first``.
- ``codec`` and ``codec_config``: how a piece decodes (below).
- ``post_ops``: detector crops and binning applied after decoding, in order.

Codecs:

``"bitshuffle-lz4"``, ``"bitshuffle-zstd"``
    The chunk format of the HDF5 bitshuffle filter (id 32008): a 12-byte
    header (uncompressed bytes as big-endian uint64, block size in bytes as
    big-endian uint32), then per block a big-endian uint32 length and the
    LZ4 (or Zstandard) compressed bit-shuffled block, then the trailing
    ``size % 8`` elements verbatim.  Decoded with the ``bitshuffle``
    library after the block lengths are checked against the piece length
    (the library trusts them).
``"numcodecs"``
    ``codec_config["pipeline"]``: ``numcodecs`` codec configurations in
    encoding order (for example ``[{"id": "blosc", ...}, {"id": "crc32c"}]``
    for a Zarr v3 store with a checksum), decoded in reverse order.

Bitshuffle + LZ4 and plain LZ4 carry no checksum: a flipped byte that still
forms a valid stream decodes to wrong values, which no decoder can see.
Stores written by ``quantem-flow convert`` add a CRC-32C to every chunk.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import struct
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

import numba
import numpy as np

from ..errors import CorruptChunkError, ParameterError, ShapeError
from .base import Representation

__all__ = [
    "CODECS",
    "ENCODED_SCHEMA",
    "Encoded",
    "EncodedPayload",
    "PieceCache",
    "bitshuffle_chunk_problem",
    "build_payload",
    "codec_config",
    "decode_bitshuffle_chunk",
    "decode_piece",
    "encode_frames",
    "numcodecs_pipeline",
]

#: Versioned layout name recorded in provenance.
ENCODED_SCHEMA = "encoded-v1"

#: Codecs :meth:`Encoded.from_dense` encodes with.
CODECS: tuple[str, ...] = ("bitshuffle-lz4", "bitshuffle-zstd", "zstd", "lz4")

#: Decoded bytes per piece :meth:`Encoded.from_dense` aims for (whole frames,
#: at least one): small enough for a cache-sized decode buffer, large enough
#: for the codec to find redundancy across small frames.
DEFAULT_PIECE_BYTES = 256 * 1024

_BITSHUFFLE_HEADER = struct.Struct(">QI")
_BITSHUFFLE_MULT = 8  # bitshuffle works in groups of 8 elements
_FROM_DENSE_OPTIONS = frozenset({"codec", "level", "frames_per_piece", "block_size"})


_OPENMP = threading.local()


def _bitshuffle() -> Any:
    """Import the ``bitshuffle`` library (untyped), its OpenMP set to one thread in this thread.

    The library parallelises each call over its blocks with OpenMP.  On a
    piece of one frame the fork and join cost far more than the work (on
    this project's 2-core machine a 32 KiB frame took 1-3 ms instead of
    37 us), and the engine already runs one chunk per worker thread, so
    every thread that decodes sets the library's OpenMP to one thread.
    """
    module = _OPENMP.__dict__.get("module")
    if module is not None:
        return module
    import importlib

    try:
        module = importlib.import_module("bitshuffle")
    except ImportError as exc:  # pragma: no cover - a dependency
        raise ImportError(
            "the bitshuffle codecs need the 'bitshuffle' package: pip install bitshuffle"
        ) from exc
    _OPENMP.module = module
    if not getattr(_OPENMP, "done", False):
        _OPENMP.done = True
        _one_openmp_thread(module)
    return module


def _one_openmp_thread(module: Any) -> None:
    """Call ``omp_set_num_threads(1)`` in the OpenMP runtime ``bitshuffle`` uses, if found."""
    import ctypes
    from pathlib import Path

    root = Path(module.__file__).resolve().parent
    candidates = sorted((root.parent / "bitshuffle.libs").glob("libgomp*.so*"))
    names = [str(p) for p in candidates] or ["libgomp.so.1"]
    for name in names:
        try:
            ctypes.CDLL(name).omp_set_num_threads(1)
            return
        except (OSError, AttributeError):  # not there: the library then runs as it does
            continue


def _default_block_elements(itemsize: int) -> int:
    """Block size (elements) the bitshuffle library picks by default (its 8 KiB target)."""
    size = (8192 // itemsize) // _BITSHUFFLE_MULT * _BITSHUFFLE_MULT
    return max(size, 128)


@dataclasses.dataclass(frozen=True, eq=False)
class EncodedPayload:
    """One chunk of compressed pieces (layout ``encoded-v1``, see the module docstring).

    Attributes
    ----------
    scan_shape
        ``(rows, cols)`` of scan positions the payload covers.
    frame_shape
        ``(k_r, k_c)`` of one decoded frame, before :attr:`post_ops`.
    value_dtype
        Dtype of the decoded values as stored (byte order included).
    codec
        ``"bitshuffle-lz4"``, ``"bitshuffle-zstd"`` or ``"numcodecs"``.
    codec_config
        JSON-ready codec parameters (block size, numcodecs pipeline, where
        the codec came from).
    data
        ``uint8``: the pieces back to back.
    offsets
        ``int64`` ``(n_pieces + 1,)``: piece ``i`` is ``data[offsets[i]:offsets[i+1]]``.
    piece_frames
        ``int64`` ``(n_pieces,)``: frames each piece decodes to.
    runs
        ``int64`` ``(n_runs, 3)``: ``(piece, first frame, frames)`` in scan order.
    post_ops
        Detector transforms
        (:class:`~quantem_flow.representations.detector_ops.DetectorOp`)
        applied after decoding, in order.
    origins
        Where the pieces came from (``"data file X, dataset /entry/data/data"``).
    piece_origin
        ``int64`` ``(n_pieces, 1 + d)``: index into :attr:`origins`, then the
        stored chunk's coordinates (in chunks) there.
    fill_value
        Value of the frames of an absent chunk (a piece of length 0).
    """

    scan_shape: tuple[int, int]
    frame_shape: tuple[int, int]
    value_dtype: np.dtype[Any]
    codec: str
    codec_config: dict[str, Any]
    data: np.ndarray
    offsets: np.ndarray
    piece_frames: np.ndarray
    runs: np.ndarray
    post_ops: tuple[Any, ...] = ()
    origins: tuple[str, ...] = ("in-memory (encoded from dense)",)
    piece_origin: np.ndarray | None = None
    fill_value: int | float = 0

    def __post_init__(self) -> None:
        n = int(self.piece_frames.shape[0])
        if self.offsets.shape != (n + 1,) or self.runs.ndim != 2 or self.runs.shape[1] != 3:
            raise ShapeError(
                f"encoded payload: offsets {self.offsets.shape} and runs {self.runs.shape} do not "
                f"fit {n} pieces; expected offsets (n + 1,) and runs (n_runs, 3)"
            )
        if self.codec not in ("bitshuffle-lz4", "bitshuffle-zstd", "numcodecs"):
            raise ParameterError(
                f"encoded payload codec {self.codec!r} is unknown; expected 'bitshuffle-lz4', "
                "'bitshuffle-zstd' or 'numcodecs'"
            )
        rows, cols = self.scan_shape
        total = int(self.runs[:, 2].sum()) if len(self.runs) else 0
        if total != rows * cols:
            raise ShapeError(
                f"encoded payload: runs cover {total} frames but the scan block {self.scan_shape} "
                f"has {rows * cols}"
            )
        if len(self.runs):
            p, first, count = self.runs[:, 0], self.runs[:, 1], self.runs[:, 2]
            if (
                p.min() < 0
                or p.max() >= n
                or first.min() < 0
                or count.min() < 1
                or np.any(first + count > self.piece_frames[p])
            ):
                raise ShapeError(
                    "encoded payload: a run reaches outside its piece; every run must be "
                    "(piece, first, frames) with first + frames <= frames of the piece"
                )
        if self.piece_origin is not None and self.piece_origin.shape[0] != n:
            raise ShapeError(
                f"encoded payload: piece_origin has {self.piece_origin.shape[0]} rows for {n} "
                "pieces; expected one row per piece"
            )

    # -- shape and type --------------------------------------------------------------
    @property
    def n_pieces(self) -> int:
        """Stored pieces held."""
        return int(self.piece_frames.shape[0])

    @property
    def n_frames(self) -> int:
        """Scan positions in the payload."""
        return self.scan_shape[0] * self.scan_shape[1]

    @property
    def out_frame_shape(self) -> tuple[int, int]:
        """``(k_r, k_c)`` of a frame after :attr:`post_ops`."""
        kr, kc = self.frame_shape
        for op in self.post_ops:
            if op.kind == "crop":
                r0, r1, c0, c1 = op.params
                kr, kc = r1 - r0, c1 - c0
            else:
                kr, kc = -(-kr // op.params[0]), -(-kc // op.params[1])
        return (kr, kc)

    @property
    def dtype(self) -> np.dtype[Any]:
        """Logical dtype of the frames after :attr:`post_ops` (native byte order)."""
        dt = self.value_dtype.newbyteorder("=")
        if any(op.kind == "bin" for op in self.post_ops):
            from .detector_ops import binned_dtype

            dt = binned_dtype(dt)
        return np.dtype(dt)

    @property
    def compressed_nbytes(self) -> int:
        """Bytes of the compressed pieces."""
        return int(self.data.nbytes)

    @property
    def nbytes(self) -> int:
        """Physical bytes held: the compressed pieces plus the index arrays."""
        index = self.offsets.nbytes + self.piece_frames.nbytes + self.runs.nbytes
        if self.piece_origin is not None:
            index += self.piece_origin.nbytes
        return int(self.data.nbytes + index)

    @property
    def decoded_nbytes(self) -> int:
        """Bytes of the frames decoded (before post_ops)."""
        return self.n_frames * self.frame_shape[0] * self.frame_shape[1] * self.value_dtype.itemsize

    # -- pieces -----------------------------------------------------------------------
    def piece(self, i: int) -> np.ndarray:
        """Return piece ``i`` (a ``uint8`` view, no copy)."""
        return self.data[int(self.offsets[i]) : int(self.offsets[i + 1])]

    @property
    def pieces(self) -> list[bytes]:
        """Every piece as ``bytes`` (copies; for inspection and tests)."""
        return [self.piece(i).tobytes() for i in range(self.n_pieces)]

    def piece_label(self, i: int) -> str:
        """Say where piece ``i`` came from (for error messages)."""
        if self.piece_origin is None:
            return f"piece {i} ({self.origins[0] if self.origins else 'unknown origin'})"
        row = [int(v) for v in self.piece_origin[i]]
        origin = self.origins[row[0]] if 0 <= row[0] < len(self.origins) else "unknown origin"
        coords = row[1:]
        where = str(coords[0]) if len(coords) == 1 else str(tuple(coords))
        return f"piece {i} = stored chunk {where} of {origin}"

    def describe(self) -> dict[str, Any]:
        """Return a JSON-ready description (codec, sizes, ops) for provenance."""
        return {
            "storage_schema": ENCODED_SCHEMA,
            "codec": self.codec,
            "codec_config": self.codec_config,
            "value_dtype": self.value_dtype.str,
            "n_pieces": self.n_pieces,
            "frames_per_piece": sorted({int(v) for v in self.piece_frames}),
            "compressed_bytes": self.compressed_nbytes,
            "decoded_bytes": self.decoded_nbytes,
            "post_ops": [op.to_dict() for op in self.post_ops],
            "origins": list(self.origins),
        }

    def with_post_ops(self, ops: Sequence[Any]) -> EncodedPayload:
        """Return the payload with ``ops`` appended to :attr:`post_ops` (nothing decoded)."""
        return dataclasses.replace(self, post_ops=(*self.post_ops, *ops))


# ------------------------------------------------------------------------------ building


def build_payload(
    *,
    scan_shape: tuple[int, int],
    frame_shape: tuple[int, int],
    value_dtype: np.dtype[Any],
    codec: str,
    codec_config: dict[str, Any],
    pieces: Sequence[bytes | np.ndarray],
    piece_frames: Sequence[int],
    runs: Sequence[tuple[int, int, int]],
    origins: Sequence[str],
    piece_origin: Sequence[Sequence[int]] | None = None,
    fill_value: int | float = 0,
) -> EncodedPayload:
    """Assemble an :class:`EncodedPayload` from separate pieces (one copy into one buffer)."""
    sizes = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    for i, p in enumerate(pieces):
        data[offsets[i] : offsets[i + 1]] = np.frombuffer(p, dtype=np.uint8)
    origin_arr = None
    if piece_origin is not None:
        width = max((len(r) for r in piece_origin), default=1)
        origin_arr = np.array(
            [list(r) for r in piece_origin] if piece_origin else np.zeros((0, width)),
            dtype=np.int64,
        ).reshape(len(pieces), width)
    return EncodedPayload(
        scan_shape=(int(scan_shape[0]), int(scan_shape[1])),
        frame_shape=(int(frame_shape[0]), int(frame_shape[1])),
        value_dtype=np.dtype(value_dtype),
        codec=codec,
        codec_config=dict(codec_config),
        data=data,
        offsets=offsets,
        piece_frames=np.asarray(list(piece_frames), dtype=np.int64).reshape(len(pieces)),
        runs=np.asarray(list(runs), dtype=np.int64).reshape(-1, 3),
        origins=tuple(origins),
        piece_origin=origin_arr,
        fill_value=fill_value,
    )


def codec_config(
    codec: str, dtype: np.dtype[Any], *, level: int | None = None, block_size: int = 0
) -> tuple[str, dict[str, Any]]:
    """Return the payload codec name and configuration :func:`encode_frames` uses."""
    if codec in ("bitshuffle-lz4", "bitshuffle-zstd"):
        if block_size < 0 or block_size % _BITSHUFFLE_MULT:
            raise ParameterError(
                f"block_size must be 0 (default) or a positive multiple of 8 elements, "
                f"got {block_size}"
            )
        config: dict[str, Any] = {
            "format": "HDF5 bitshuffle filter 32008 chunk (12-byte header)",
            "block_size": block_size or _default_block_elements(np.dtype(dtype).itemsize),
        }
        if codec == "bitshuffle-zstd":
            config["level"] = 3 if level is None else int(level)
        return codec, config
    return "numcodecs", {"pipeline": [_numcodecs_config(codec, level)]}


def encode_frames(
    frames: np.ndarray, codec: str, *, level: int | None = None, block_size: int = 0
) -> bytes:
    """Encode ``(n, k_r, k_c)`` frames as one piece.

    Parameters
    ----------
    frames
        The frames (made C-contiguous).
    codec
        One of :data:`CODECS`.
    level
        Compression level for ``zstd`` and ``bitshuffle-zstd`` (default 3);
        LZ4 codecs take none.
    block_size
        Bitshuffle block size in elements, a multiple of 8 (0: the library
        default, ~8 KiB).

    Returns
    -------
    bytes
        The piece, decoded by :func:`decode_piece` with the configuration
        :func:`codec_config` returns.
    """
    frames = np.ascontiguousarray(frames)
    name, config = codec_config(codec, frames.dtype, level=level, block_size=block_size)
    if name == "numcodecs":
        return bytes(numcodecs_pipeline(json.dumps(config["pipeline"]))[0].encode(frames))
    bitshuffle = _bitshuffle()

    elems = int(config["block_size"])
    flat = frames.reshape(-1)
    if codec == "bitshuffle-lz4":
        body = bitshuffle.compress_lz4(flat, elems)
    else:
        body = bitshuffle.compress_zstd(flat, elems, int(config["level"]))
    header = _BITSHUFFLE_HEADER.pack(flat.nbytes, elems * frames.dtype.itemsize)
    return header + np.asarray(body).tobytes()


def _numcodecs_config(codec: str, level: int | None) -> dict[str, Any]:
    if codec == "zstd":
        return {"id": "zstd", "level": 3 if level is None else int(level), "checksum": False}
    if codec == "lz4":
        return {"id": "lz4", "acceleration": 1}
    raise ParameterError(f"unknown codec {codec!r}; expected one of {list(CODECS)}")


@functools.lru_cache(maxsize=64)
def numcodecs_pipeline(pipeline_json: str) -> tuple[Any, ...]:
    """Return the numcodecs codec objects of a JSON list of configurations (cached)."""
    import numcodecs

    return tuple(numcodecs.get_codec(dict(cfg)) for cfg in json.loads(pipeline_json))


# ------------------------------------------------------------------------------ decoding


@numba.njit(cache=True, nogil=True)
def _bitshuffle_stream_end(buf, start, n_elem, block_elems, itemsize):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    """Walk the block lengths of a bitshuffle stream; return its end, or -1 if it overruns."""
    pos = start
    size = buf.shape[0]
    n_blocks = n_elem // block_elems
    last = n_elem % block_elems
    last -= last % 8
    total = n_blocks + (1 if last > 0 else 0)
    for _ in range(total):
        if pos + 4 > size:
            return -1
        length = (
            (np.int64(buf[pos]) << 24)
            | (np.int64(buf[pos + 1]) << 16)
            | (np.int64(buf[pos + 2]) << 8)
            | np.int64(buf[pos + 3])
        )
        pos += 4 + length
        if pos > size:
            return -1
    return pos + (n_elem % 8) * itemsize


def bitshuffle_chunk_problem(buf: np.ndarray, n_elem: int, itemsize: int) -> str | None:
    """Say what is wrong with a bitshuffle filter (32008) chunk, or ``None`` if it is sound.

    Checks everything a decoder trusts before it writes: the 12-byte header
    (uncompressed size, block size) against the ``n_elem`` elements of
    ``itemsize`` bytes the chunk must hold, and that the compressed block
    lengths run exactly to the end of the chunk.  The HDF5 bitshuffle filter
    trusts the header and writes past its buffer when a bit of it flips
    (docs/upstream-bitshuffle-crash.md); readers call this on every chunk
    before the filter decodes it.

    Parameters
    ----------
    buf
        The stored chunk, ``uint8``.
    n_elem, itemsize
        Elements the chunk decodes to, and their size in bytes.

    Returns
    -------
    str or None
        What is wrong, naming the byte offset within the chunk; ``None`` when
        the chunk may be decoded.
    """
    if buf.shape[0] < _BITSHUFFLE_HEADER.size:
        return f"{buf.shape[0]} bytes, shorter than the 12-byte bitshuffle header"
    nbytes, block_bytes = _BITSHUFFLE_HEADER.unpack_from(buf[: _BITSHUFFLE_HEADER.size].tobytes())
    if nbytes != n_elem * itemsize:
        return f"header says {nbytes} uncompressed bytes (bytes 0-7), expected {n_elem * itemsize}"
    if block_bytes == 0 or block_bytes % (itemsize * _BITSHUFFLE_MULT):
        return (
            f"header bytes 8-11 give a block size of {block_bytes} bytes, not a positive "
            f"multiple of 8 elements of {itemsize} bytes"
        )
    block_elems = block_bytes // itemsize
    end = _bitshuffle_stream_end(buf, _BITSHUFFLE_HEADER.size, n_elem, block_elems, itemsize)
    if end != buf.shape[0]:
        return (
            f"compressed block lengths run to byte {end} (-1: past the end) of a "
            f"{buf.shape[0]}-byte chunk"
        )
    return None


def decode_bitshuffle_chunk(
    buf: np.ndarray,
    n_elem: int,
    dtype: np.dtype[Any],
    *,
    compression: str = "lz4",
    check: bool = True,
) -> np.ndarray:
    """Decode one chunk of the HDF5 bitshuffle filter's format (``uint8`` bytes).

    Parameters
    ----------
    buf
        The chunk: 12-byte header, then the compressed blocks.
    n_elem
        Elements it holds.
    dtype
        Their dtype.
    compression
        ``"lz4"`` or ``"zstd"``.
    check
        Check the header and block lengths first (:func:`bitshuffle_chunk_problem`;
        ``False`` only for a chunk checked already).

    Raises
    ------
    ValueError
        Naming what is wrong with the chunk (callers say which chunk).
    """
    dt = np.dtype(dtype)
    if check:
        problem = bitshuffle_chunk_problem(buf, n_elem, dt.itemsize)
        if problem is not None:
            raise ValueError(problem)
    block_elems = int(_BITSHUFFLE_HEADER.unpack_from(buf[:12].tobytes())[1]) // dt.itemsize
    body = buf[_BITSHUFFLE_HEADER.size :]
    bitshuffle = _bitshuffle()
    if compression == "lz4":
        out = bitshuffle.decompress_lz4(body, (n_elem,), dt, block_elems)
    else:
        out = bitshuffle.decompress_zstd(body, (n_elem,), dt, block_elems)
    return np.asarray(out)


def _decode_bitshuffle(payload: EncodedPayload, buf: np.ndarray, n_elem: int) -> np.ndarray:
    compression = "lz4" if payload.codec == "bitshuffle-lz4" else "zstd"
    return decode_bitshuffle_chunk(buf, n_elem, payload.value_dtype, compression=compression)


def _decode_numcodecs(payload: EncodedPayload, buf: np.ndarray, n_elem: int) -> np.ndarray:
    pipeline = payload.codec_config.get("pipeline")
    if not isinstance(pipeline, list) or not pipeline:
        raise ValueError(f"codec_config has no numcodecs pipeline: {payload.codec_config!r}")
    codecs = numcodecs_pipeline(json.dumps(pipeline))
    data: Any = buf
    for i, codec in enumerate(reversed(codecs)):
        if i == 0 and codec.codec_id == "blosc" and len(buf) >= 16:
            cbytes = int.from_bytes(bytes(buf[12:16]), "little")
            if cbytes != len(buf):
                raise ValueError(f"blosc header says {cbytes} bytes, the piece has {len(buf)}")
        data = codec.decode(data)
    raw = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    expected = n_elem * payload.value_dtype.itemsize
    if raw.nbytes != expected:
        raise ValueError(f"decoded {raw.nbytes} bytes, expected {expected}")
    return raw.view(payload.value_dtype)


def decode_piece(payload: EncodedPayload, i: int, out: np.ndarray | None = None) -> np.ndarray:
    """Decode piece ``i`` of ``payload`` to ``(frames, k_r, k_c)`` frames.

    Parameters
    ----------
    payload
        The encoded chunk.
    i
        Piece index.
    out
        Optional C-contiguous destination of the decoded shape and the
        native-order :attr:`EncodedPayload.value_dtype`.

    Returns
    -------
    numpy.ndarray
        ``(piece_frames[i], k_r, k_c)`` in native byte order (``out`` if given).

    Raises
    ------
    CorruptChunkError
        If the piece does not decode to exactly the expected bytes; the
        message names the piece and the stored chunk it came from.
    """
    n = int(payload.piece_frames[i])
    kr, kc = payload.frame_shape
    n_elem = n * kr * kc
    native = payload.value_dtype.newbyteorder("=")
    buf = payload.piece(i)
    if buf.shape[0] == 0:  # an absent chunk: the fill value
        values = np.full((n, kr, kc), payload.fill_value, dtype=native)
    else:
        try:
            if payload.codec == "numcodecs":
                flat = _decode_numcodecs(payload, buf, n_elem)
            else:
                flat = _decode_bitshuffle(payload, buf, n_elem)
        except ImportError:
            raise
        except Exception as exc:  # codecs raise RuntimeError, ValueError...
            raise CorruptChunkError(
                f"could not decode {payload.piece_label(i)} (codec {payload.codec}, "
                f"{buf.shape[0]} compressed bytes, expected {n} frame(s) of {kr} x {kc} "
                f"{payload.value_dtype}): {type(exc).__name__}: {str(exc).rstrip('.')}. The "
                "stored chunk is corrupt or truncated; re-acquire or restore the file"
            ) from exc
        values = flat.reshape(n, kr, kc)
    if out is None:
        return values if values.dtype == native else values.astype(native)
    out[...] = values
    return out


class PieceCache:
    """Decoded pieces a pass will use again, while it walks the runs in order.

    Runs of a chunk stored as ``(a, b)`` scan tiles return to a piece once
    per scan row; a piece that a later run uses is kept decoded (up to
    ``budget_bytes``, least recently used dropped first), and a piece no
    later run uses is dropped at once.

    Parameters
    ----------
    payload
        The encoded chunk.
    budget_bytes
        Decoded bytes kept at most for later runs.
    """

    def __init__(self, payload: EncodedPayload, budget_bytes: int = 32 * 2**20):
        self._payload = payload
        self._budget = int(budget_bytes)
        self._held: dict[int, np.ndarray] = {}
        self._bytes = 0
        uses = np.bincount(payload.runs[:, 0], minlength=payload.n_pieces)
        self._left: list[int] = [int(v) for v in uses]

    def last_use(self, i: int) -> bool:
        """Whether the next run over piece ``i`` is its last, and it is not held decoded."""
        return self._left[i] == 1 and i not in self._held

    def get(self, i: int, out: np.ndarray | None = None) -> np.ndarray:
        """Return piece ``i`` decoded for its next run (into ``out`` when given and not held)."""
        self._left[i] -= 1
        hit = self._held.pop(i, None)
        if hit is not None:
            self._bytes -= hit.nbytes
        else:
            hit = decode_piece(self._payload, i, out=out)
        if self._left[i] > 0 and hit is not out:
            self._held[i] = hit  # most recent last
            self._bytes += hit.nbytes
            while len(self._held) > 1 and self._bytes > self._budget:
                old = self._held.pop(next(iter(self._held)))
                self._bytes -= old.nbytes
        return hit


# ------------------------------------------------------------------------------ representation


class Encoded(Representation):
    """Compressed pieces decoded piece by piece inside the kernel's pass."""

    name: ClassVar[str] = "encoded"
    schema: ClassVar[str] = ENCODED_SCHEMA
    native_detector_ops: ClassVar[bool] = True

    def from_dense(self, block: np.ndarray, **options: Any) -> EncodedPayload:
        """Encode a dense ``(rows, cols, k_r, k_c)`` block, losslessly.

        Parameters
        ----------
        block
            The frames.
        **options
            ``codec`` (one of :data:`CODECS`, default ``"bitshuffle-lz4"``),
            ``level`` (zstd codecs), ``frames_per_piece`` (default: whole
            frames filling ~256 KiB decoded, at least one) and
            ``block_size`` (bitshuffle, elements).

        Returns
        -------
        EncodedPayload
            The pieces; the frames are taken in scan order.
        """
        unknown = set(options) - _FROM_DENSE_OPTIONS
        if unknown:
            raise ParameterError(
                f"unknown encoded option(s) {sorted(unknown)}; expected any of "
                f"{sorted(_FROM_DENSE_OPTIONS)}"
            )
        codec = str(options.get("codec", "bitshuffle-lz4"))
        if codec not in CODECS:
            raise ParameterError(f"unknown codec {codec!r}; expected one of {list(CODECS)}")
        level = options.get("level")
        if level is not None and codec in ("lz4", "bitshuffle-lz4"):
            raise ParameterError(
                f"codec {codec!r} takes no level (LZ4 has one setting here); give level= only "
                "with 'zstd' or 'bitshuffle-zstd'"
            )
        block = np.asarray(block)
        if block.ndim != 4:
            raise ShapeError(f"expected a (rows, cols, k_r, k_c) block, got shape {block.shape}")
        if block.dtype.kind not in "uif":
            raise ParameterError(
                f"the encoded representation holds integer or real data, got {block.dtype}"
            )
        rows, cols, kr, kc = (int(v) for v in block.shape)
        n = rows * cols
        frame_bytes = max(kr * kc * block.dtype.itemsize, 1)
        fpp = options.get("frames_per_piece")
        per = max(1, DEFAULT_PIECE_BYTES // frame_bytes) if fpp is None else int(fpp)
        if per < 1:
            raise ParameterError(f"frames_per_piece must be >= 1, got {fpp!r}")
        frames = np.ascontiguousarray(block).reshape(n, kr, kc)
        block_size = int(options.get("block_size", 0))
        name, config = codec_config(codec, block.dtype, level=level, block_size=block_size)
        pieces: list[bytes] = []
        counts: list[int] = []
        for s in range(0, n, per):
            chunk = frames[s : s + per]
            pieces.append(encode_frames(chunk, codec, level=level, block_size=block_size))
            counts.append(int(chunk.shape[0]))
        config = {**config, "codec": codec, "made": "encoded from dense"}
        return build_payload(
            scan_shape=(rows, cols),
            frame_shape=(kr, kc),
            value_dtype=block.dtype,
            codec=name,
            codec_config=config,
            pieces=pieces,
            piece_frames=counts,
            runs=[(i, 0, c) for i, c in enumerate(counts)],
            origins=("in-memory (encoded from dense)",),
            piece_origin=[(0, i) for i in range(len(pieces))],
        )

    def to_dense(self, payload: Any) -> np.ndarray:
        """Decode every piece and apply the post_ops (explicit conversion only)."""
        p = _check_payload(payload)
        rows, cols = p.scan_shape
        kr, kc = p.out_frame_shape
        out = np.empty((p.n_frames, kr, kc), dtype=p.dtype)
        pos = 0
        cache = PieceCache(p)
        for piece, first, count in p.runs.tolist():
            frames = cache.get(piece)[first : first + count]
            for op in p.post_ops:
                frames = op.apply(frames)
            out[pos : pos + count] = frames
            pos += count
        return out.reshape(rows, cols, kr, kc)

    def apply_detector_ops(self, payload: Any, ops: tuple[Any, ...]) -> Any:
        """Attach detector crops and binning as post-decode transforms (nothing decoded now)."""
        p = _check_payload(payload)
        return p.with_post_ops(ops) if ops else p


def _check_payload(payload: Any) -> EncodedPayload:
    if not isinstance(payload, EncodedPayload):
        raise ParameterError(
            f"expected an EncodedPayload, got {type(payload).__name__}; make one with "
            "Encoded().from_dense(block) or a native read"
        )
    return payload
