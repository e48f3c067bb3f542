"""The DECTRIS SIMPLON stream, format v2: CBOR messages, decoded and encoded.

Written from DECTRIS's published description of Stream V2 and of its CBOR
compression tag (the ``dectris/documentation`` repository: ``stream_v2`` and
``cbor/dectris-compression-tag.md``), RFC 8949 (CBOR) and RFC 8746 (typed
and multi-dimensional arrays):

* every message is one ZeroMQ message holding one CBOR map of text keys,
  whose ``type`` is ``"start"`` (once per series, at arm), ``"image"`` (once
  per exposure) or ``"end"`` (at disarm); the detector PUSHes, clients PULL;
* an image message's ``data`` maps channel names (``"threshold_1"``...) to
  a multi-dimensional array: tag 40 around ``[[rows, cols], typed array]``
  (row-major), the typed array an RFC 8746 tag (``uint8`` 64, ``uint16``
  little-endian 69, ``uint32`` LE 70, big-endian 65/66, ``float32`` LE 85)
  around a byte string;
* that byte string may be DECTRIS tag 56500 ``[algorithm, modifier, bytes]``:
  ``"bslz4"`` (bitshuffle + LZ4 in the HDF5 filter's framing; the modifier is
  the element size) or ``"lz4"`` (LZ4 blocks in the HDF5 LZ4 filter's
  framing: 8-byte big-endian original size, 4-byte block size, then per
  block a 4-byte compressed size and the block; a block whose compressed
  size equals its plain size is stored plain).

Compressed images are checked before any decoder trusts them, with the same
check files get (:func:`~quantem_flow.representations.encoded.bitshuffle_chunk_problem`
for bslz4, and every block length for lz4).  Anything that breaks the
protocol raises :class:`~quantem_flow.errors.StreamProtocolError` saying
what was expected and what came.  The encoder (:func:`encode_start`,
:func:`encode_image`, :func:`encode_end`) is what the simulator sends.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import StreamProtocolError

__all__ = [
    "COMPRESSION_TAG",
    "MULTI_DIM_TAG",
    "EndMessage",
    "ImageMessage",
    "StartMessage",
    "decode_message",
    "encode_end",
    "encode_image",
    "encode_start",
]

#: RFC 8746: a multi-dimensional array, ``[dimensions, elements]``, row-major.
MULTI_DIM_TAG = 40
#: DECTRIS: a compressed byte string, ``[algorithm, modifier, compressed bytes]``.
COMPRESSION_TAG = 56500
#: RFC 8746 typed-array tags this reader accepts, and their dtypes.
TYPED_ARRAY_TAGS: dict[int, str] = {
    64: "|u1",
    65: ">u2",
    66: ">u4",
    69: "<u2",
    70: "<u4",
    85: "<f4",
}
_TAG_OF_DTYPE = {np.dtype(v).str: k for k, v in TYPED_ARRAY_TAGS.items()}
_LZ4_HEADER = struct.Struct(">QI")
_BLOCK_SIZE = struct.Struct(">I")


@dataclasses.dataclass(frozen=True)
class StartMessage:
    """A series begins (arm): its configuration."""

    series_id: int
    series_unique_id: str
    number_of_images: int
    image_shape: tuple[int, int]
    channels: tuple[str, ...]
    fields: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ImageMessage:
    """One exposure: its number and each channel's frame."""

    series_id: int
    image_id: int
    data: dict[str, np.ndarray | PackedImage]
    fields: dict[str, Any]
    #: Per channel, the checked bitshuffle+LZ4 chunk as received (the HDF5 filter's
    #: chunk format), for channels sent ``bslz4`` in little-endian order: kept as is.
    bslz4: dict[str, bytes] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class EndMessage:
    """The series ended (disarm)."""

    series_id: int
    series_unique_id: str


def _protocol(what: str, where: str = "") -> StreamProtocolError:
    place = f" ({where})" if where else ""
    return StreamProtocolError(f"DECTRIS stream v2{place}: {what}")


def _lz4_hdf5_decode(payload: bytes, where: str) -> bytes:
    """Decode LZ4 blocks in the HDF5 LZ4 filter's framing, every length checked first."""
    import lz4.block

    if len(payload) < _LZ4_HEADER.size:
        raise _protocol(
            f"an lz4 image of {len(payload)} bytes is shorter than its 12-byte header", where
        )
    total, block = _LZ4_HEADER.unpack_from(payload)
    if block == 0 and total:
        raise _protocol("an lz4 image declares a block size of 0", where)
    out = bytearray()
    pos = _LZ4_HEADER.size
    while len(out) < total:
        if pos + 4 > len(payload):
            raise _protocol(
                f"an lz4 image ends at byte {len(payload)} inside a block header; it declares "
                f"{total} bytes and {len(out)} were decoded",
                where,
            )
        (size,) = _BLOCK_SIZE.unpack_from(payload, pos)
        pos += 4
        plain = min(block, total - len(out))
        if size == 0 or pos + size > len(payload):
            raise _protocol(
                f"an lz4 block at byte {pos - 4} declares {size} compressed bytes; "
                f"{len(payload) - pos} remain",
                where,
            )
        chunk = payload[pos : pos + size]
        pos += size
        if size == plain:
            out += chunk
            continue
        try:
            out += lz4.block.decompress(chunk, uncompressed_size=plain)
        except Exception as exc:  # lz4 raises its own LZ4BlockError
            raise _protocol(
                f"an lz4 block at byte {pos - size} does not decode ({exc})", where
            ) from exc
    if pos != len(payload):
        raise _protocol(f"an lz4 image has {len(payload) - pos} bytes after its last block", where)
    return bytes(out)


def _checked_bslz4(
    modifier: Any, payload: bytes | bytearray, n_elem: int, itemsize: int, where: str
) -> Any:
    """A bslz4 chunk as ``uint8``, after the checks the decoder needs (sizes, block lengths)."""
    from ..representations.encoded import bitshuffle_chunk_problem

    if modifier != itemsize:
        raise _protocol(
            f"bslz4 element size {modifier!r} does not match the array's {itemsize} bytes",
            where,
        )
    buf = np.frombuffer(payload, dtype=np.uint8)
    problem = bitshuffle_chunk_problem(buf, n_elem, itemsize)
    if problem is not None:
        raise _protocol(f"a bslz4 image is damaged: {problem}", where)
    return buf


@dataclasses.dataclass(frozen=True)
class PackedImage:
    """An image kept as its checked bitshuffle+LZ4 chunk, not decoded (``decode=False``).

    Attributes
    ----------
    shape
        ``(k_r, k_c)``.
    dtype
        The elements' dtype (native order).
    chunk
        The chunk in the HDF5 bitshuffle filter's format, as received.
    """

    shape: tuple[int, int]
    dtype: np.dtype[Any]
    chunk: bytes

    @property
    def nbytes(self) -> int:
        """Bytes of the decoded image."""
        return int(self.shape[0] * self.shape[1] * self.dtype.itemsize)

    def decode(self) -> np.ndarray:
        """The image (the chunk was checked when it was received)."""
        from ..representations.encoded import decode_bitshuffle_chunk

        buf = np.frombuffer(self.chunk, dtype=np.uint8)
        n = self.shape[0] * self.shape[1]
        return decode_bitshuffle_chunk(buf, n, self.dtype, check=False).reshape(self.shape)


def _decompress(value: Any, n_elem: int, itemsize: int, where: str) -> bytes:
    """The plain bytes of a tag-56500 item, checked before they are decoded."""
    if not (isinstance(value, (list, tuple)) and len(value) == 3):
        raise _protocol(
            f"tag {COMPRESSION_TAG} must hold [algorithm, modifier, bytes], got "
            f"{type(value).__name__} {str(value)[:80]}",
            where,
        )
    algorithm, modifier, payload = value
    if not isinstance(payload, (bytes, bytearray)):
        raise _protocol(f"tag {COMPRESSION_TAG}'s data must be a byte string", where)
    if algorithm == "bslz4":
        from ..representations.encoded import decode_bitshuffle_chunk

        buf = _checked_bslz4(modifier, payload, n_elem, itemsize, where)
        out = decode_bitshuffle_chunk(buf, n_elem, np.dtype(f"u{itemsize}"), check=False)
        return bytes(out.tobytes())
    if algorithm == "lz4":
        plain = _lz4_hdf5_decode(bytes(payload), where)
        if len(plain) != n_elem * itemsize:
            raise _protocol(
                f"an lz4 image decodes to {len(plain)} bytes, expected {n_elem * itemsize}",
                where,
            )
        return plain
    raise _protocol(f"compression {algorithm!r} is not one of the documented 'bslz4', 'lz4'", where)


def _array(
    item: Any, where: str, decode: bool = True
) -> tuple[np.ndarray | PackedImage, bytes | None]:
    """A tag-40 multi-dimensional array as a NumPy array (decompressed, native order).

    Also returns the bitshuffle+LZ4 chunk as received when the array came so
    compressed in little-endian order (checked), else ``None``.
    """
    import cbor2

    if not (isinstance(item, cbor2.CBORTag) and item.tag == MULTI_DIM_TAG):
        raise _protocol(
            f"a channel's data must be tag {MULTI_DIM_TAG} (a multi-dimensional array), got "
            f"{_describe(item)}",
            where,
        )
    if not (isinstance(item.value, (list, tuple)) and len(item.value) == 2):
        raise _protocol(f"tag {MULTI_DIM_TAG} must hold [dimensions, elements]", where)
    dims, typed = item.value
    if not (
        isinstance(dims, (list, tuple)) and len(dims) == 2 and all(isinstance(d, int) for d in dims)
    ):
        raise _protocol(f"an image must have 2 integer dimensions, got {dims!r}", where)
    if not (isinstance(typed, cbor2.CBORTag) and typed.tag in TYPED_ARRAY_TAGS):
        raise _protocol(
            f"the elements must be an RFC 8746 typed array with a tag in "
            f"{sorted(TYPED_ARRAY_TAGS)}, got {_describe(typed)}",
            where,
        )
    dtype = np.dtype(TYPED_ARRAY_TAGS[typed.tag])
    n_elem = int(dims[0]) * int(dims[1])
    raw = typed.value
    kept: bytes | None = None
    if isinstance(raw, cbor2.CBORTag) and raw.tag == COMPRESSION_TAG:
        if (
            isinstance(raw.value, (list, tuple))
            and len(raw.value) == 3
            and raw.value[0] == "bslz4"
            and dtype.byteorder in ("<", "|", "=")
        ):
            kept = bytes(raw.value[2])
            if not decode:
                _checked_bslz4(raw.value[1], kept, n_elem, dtype.itemsize, where)
                shape = (int(dims[0]), int(dims[1]))
                return PackedImage(shape, dtype.newbyteorder("="), kept), kept
        raw = _decompress(raw.value, n_elem, dtype.itemsize, where)
    if not isinstance(raw, (bytes, bytearray)):
        raise _protocol(f"a typed array must hold a byte string, got {_describe(raw)}", where)
    if len(raw) != n_elem * dtype.itemsize:
        raise _protocol(
            f"a {dims[0]} x {dims[1]} {dtype} image needs {n_elem * dtype.itemsize} bytes, got "
            f"{len(raw)}",
            where,
        )
    array = np.frombuffer(raw, dtype=dtype).reshape(int(dims[0]), int(dims[1]))
    return array.astype(dtype.newbyteorder("="), copy=False), kept


def _describe(value: Any) -> str:
    import cbor2

    if isinstance(value, cbor2.CBORTag):
        return f"tag {value.tag}"
    return type(value).__name__


def _int(message: Mapping[str, Any], key: str, kind: str) -> int:
    value = message.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _protocol(f"a {kind} message needs '{key}' as an unsigned integer, got {value!r}")
    return int(value)


def decode_message(
    payload: bytes, *, decode: bool = True
) -> StartMessage | ImageMessage | EndMessage:
    """Decode one stream message.

    Parameters
    ----------
    payload
        The message's bytes.
    decode
        Decode the images; ``False`` keeps each channel sent as little-endian
        bitshuffle+LZ4 as a :class:`PackedImage` (checked, not decoded).

    Raises
    ------
    StreamProtocolError
        For a payload that is not CBOR, not a map with a known ``type``, or
        whose fields or image data break the protocol.
    """
    import cbor2

    try:
        message = cbor2.loads(payload)
    except Exception as exc:  # cbor2 raises CBORDecodeError and a few builtins
        raise _protocol(
            f"a message of {len(payload)} bytes is not valid CBOR ({type(exc).__name__}: {exc})"
        ) from exc
    if not isinstance(message, dict):
        raise _protocol(f"a message must be a CBOR map, got {_describe(message)}")
    kind = message.get("type")
    if kind == "start":
        size = (_int(message, "image_size_y", "start"), _int(message, "image_size_x", "start"))
        channels = message.get("channels", [])
        if not (isinstance(channels, (list, tuple)) and all(isinstance(c, str) for c in channels)):
            raise _protocol(f"'channels' must be a list of names, got {channels!r}")
        return StartMessage(
            series_id=_int(message, "series_id", "start"),
            series_unique_id=str(message.get("series_unique_id", "")),
            number_of_images=_int(message, "number_of_images", "start"),
            image_shape=size,
            channels=tuple(channels),
            fields={k: v for k, v in message.items() if k != "type"},
        )
    if kind == "image":
        image_id = _int(message, "image_id", "image")
        data = message.get("data")
        if not isinstance(data, dict) or not data:
            raise _protocol(f"image {image_id} has no 'data' map of channels")
        where = f"image {image_id}"
        decoded = {
            str(name): _array(item, f"{where}, channel {name!r}", decode)
            for name, item in data.items()
        }
        return ImageMessage(
            series_id=_int(message, "series_id", "image"),
            image_id=image_id,
            data={name: array for name, (array, _) in decoded.items()},
            fields={k: v for k, v in message.items() if k not in ("type", "data")},
            bslz4={name: kept for name, (_, kept) in decoded.items() if kept is not None},
        )
    if kind == "end":
        return EndMessage(
            series_id=_int(message, "series_id", "end"),
            series_unique_id=str(message.get("series_unique_id", "")),
        )
    raise _protocol(f"'type' must be 'start', 'image' or 'end', got {kind!r}")


# -- encoding (what the simulator sends) ------------------------------------------------------
def _lz4_hdf5_encode(raw: bytes, block: int = 1 << 16) -> bytes:
    import lz4.block

    out = bytearray(_LZ4_HEADER.pack(len(raw), block))
    for start in range(0, len(raw), block):
        piece = raw[start : start + block]
        packed = lz4.block.compress(piece, store_size=False)
        if len(packed) >= len(piece):
            packed = piece  # stored plain: its size equals the block's
        out += _BLOCK_SIZE.pack(len(packed)) + packed
    return bytes(out)


def _encode_array(frame: np.ndarray, compression: str | None) -> Any:
    import cbor2

    dtype = np.dtype(frame.dtype).newbyteorder("<") if frame.dtype.itemsize > 1 else frame.dtype
    tag = _TAG_OF_DTYPE.get(np.dtype(dtype).str)
    if tag is None:
        raise StreamProtocolError(
            f"the stream carries uint8, uint16, uint32 or float32 frames, not {frame.dtype}"
        )
    raw = np.ascontiguousarray(frame, dtype=dtype).tobytes()
    body: Any = raw
    if compression == "bslz4":
        from ..representations.encoded import encode_frames

        flat = np.ascontiguousarray(frame, dtype=dtype).reshape(-1)
        chunk = encode_frames(flat, "bitshuffle-lz4")  # the HDF5 filter's chunk, 8 KiB blocks
        body = cbor2.CBORTag(COMPRESSION_TAG, ["bslz4", flat.dtype.itemsize, chunk])
    elif compression == "lz4":
        body = cbor2.CBORTag(COMPRESSION_TAG, ["lz4", 0, _lz4_hdf5_encode(raw)])
    elif compression is not None:
        raise StreamProtocolError(
            f"compression must be None, 'bslz4' or 'lz4', got {compression!r}"
        )
    return cbor2.CBORTag(MULTI_DIM_TAG, [list(frame.shape), cbor2.CBORTag(tag, body)])


def encode_start(
    *,
    series_id: int,
    series_unique_id: str,
    number_of_images: int,
    image_shape: Sequence[int],
    channels: Sequence[str] = ("threshold_1",),
    extra: Mapping[str, Any] | None = None,
) -> bytes:
    """A start message."""
    import cbor2

    message = {
        "type": "start",
        "series_id": int(series_id),
        "series_unique_id": series_unique_id,
        "number_of_images": int(number_of_images),
        "image_size_y": int(image_shape[0]),
        "image_size_x": int(image_shape[1]),
        "channels": list(channels),
        **dict(extra or {}),
    }
    return bytes(cbor2.dumps(message))


def encode_image(
    frame: np.ndarray,
    *,
    series_id: int,
    image_id: int,
    compression: str | None = "bslz4",
    channel: str = "threshold_1",
) -> bytes:
    """An image message carrying one channel's frame."""
    import cbor2

    message = {
        "type": "image",
        "series_id": int(series_id),
        "image_id": int(image_id),
        "data": {channel: _encode_array(frame, compression)},
    }
    return bytes(cbor2.dumps(message))


def encode_end(*, series_id: int, series_unique_id: str) -> bytes:
    """An end message."""
    import cbor2

    return bytes(
        cbor2.dumps(
            {"type": "end", "series_id": int(series_id), "series_unique_id": series_unique_id}
        )
    )
