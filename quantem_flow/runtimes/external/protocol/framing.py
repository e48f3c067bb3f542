"""The frames of ``qf-worker/1``: the prefix, canonical JSON headers, buffers, decoding.

Pure: bytes in, :class:`Message` out and back, with every framing rule of
``docs/protocol.md`` checked (:mod:`.messages` checks what each message holds).
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from typing import Any, Final

import numpy as np

from ....errors import ProtocolError

__all__ = [
    "ACCUMULATIONS",
    "DTYPES",
    "ERROR_CODES",
    "MAGIC",
    "MAX_HEADER_BYTES",
    "MAX_INT",
    "MESSAGE_TYPES",
    "PREFIX_BYTES",
    "PROTOCOL",
    "REQUEST_TYPES",
    "STORAGE_SCHEMAS",
    "FrameDecoder",
    "Message",
    "canonical_json",
    "decode",
    "encode",
    "encode_pieces",
    "pad8",
]

#: The version this module speaks.
PROTOCOL: Final = "qf-worker/1"
#: First four bytes of every frame.
MAGIC: Final = b"QFW1"
#: Bytes of the fixed prefix (magic, header_length, body_length).
PREFIX_BYTES: Final = 16
#: Largest header a receiver accepts.
MAX_HEADER_BYTES: Final = 16 * 1024 * 1024
#: Largest magnitude of an integer in a header (JavaScript's safe integers).
MAX_INT: Final = 2**53 - 1
#: Bytes of a frame's body allocated when its header has been checked; the buffer then
#: doubles as bytes arrive (a peer that announces a body and sends none costs this much).
FIRST_BODY_ALLOCATION: Final = 1 << 20
#: Deepest nesting of arrays and objects a receiver accepts in a header (no message of
#: qf-worker/1 nests beyond 4; the Swift worker's parser has the same bound).
MAX_NESTING: Final = 256

_PREFIX = struct.Struct("<4sIQ")

#: Every message type of version 1.
MESSAGE_TYPES: Final = (
    "hello",
    "put",
    "put_weights",
    "run",
    "result",
    "release",
    "stats",
    "ping",
    "bye",
    "error",
)
#: Types the bridge sends (the worker answers each with one reply).
REQUEST_TYPES: Final = ("hello", "put", "put_weights", "run", "release", "stats", "ping", "bye")
#: Every error code of version 1.
ERROR_CODES: Final = (
    "version",
    "frame",
    "truncated",
    "too_large",
    "bad_request",
    "unknown_handle",
    "budget",
    "unsupported",
    "device",
    "internal",
)
#: Dtype names that may appear in headers (always little-endian in buffers).
DTYPES: Final = (
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "float32",
    "float64",
)
#: Storage schemas the protocol defines, by representation.
STORAGE_SCHEMAS: Final = {
    "dense": "dense-v1",
    "paired": "paired-csr-v1",
    "packed": "packed-blockwidth-v1",
}
#: Accumulation names a worker may report.
ACCUMULATIONS: Final = ("int64", "uint64", "u32x2", "float64", "float32")

_INDEX_DTYPES = ("uint16", "uint32")
_COUNT_DTYPES = ("uint8", "uint16", "uint32", "uint64")


def pad8(n: int) -> int:
    """Return ``n`` rounded up to a multiple of 8."""
    return (n + 7) & ~7


def _fail(
    message: str, *, code: str = "frame", message_type: str | None = None, handle: int | None = None
) -> ProtocolError:
    return ProtocolError(message, code=code, message_type=message_type, handle=handle)


# ---------------------------------------------------------------------------- canonical JSON

_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}
# Everything that is escaped: quote, backslash, controls below U+0020, non-ASCII.
# U+007F (DEL) is ASCII and written as is.
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f\u0080-\U0010ffff]')


def _escape_char(match: re.Match[str]) -> str:
    ch = match.group(0)
    known = _ESCAPES.get(ch)
    if known is not None:
        return known
    n = ord(ch)
    if n < 0x10000:
        return f"\\u{n:04x}"
    n -= 0x10000
    return f"\\u{0xD800 | (n >> 10):04x}\\u{0xDC00 | (n & 0x3FF):04x}"


def _write(value: Any, out: list[str], path: str) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int | np.integer):
        v = int(value)
        if not -MAX_INT <= v <= MAX_INT:
            raise _fail(
                f"header value at {path} is {v}, outside the integers a header may hold "
                f"[-(2**53 - 1), 2**53 - 1]; send large values in a buffer"
            )
        out.append(str(v))
    elif isinstance(value, str):
        out.append('"' + _NEEDS_ESCAPE.sub(_escape_char, value) + '"')
    elif isinstance(value, dict):
        keys = list(value)
        for k in keys:
            if not isinstance(k, str):
                raise _fail(f"header object key {k!r} at {path} is not a string")
        out.append("{")
        for i, k in enumerate(sorted(keys)):
            if i:
                out.append(",")
            out.append('"' + _NEEDS_ESCAPE.sub(_escape_char, k) + '":')
            _write(value[k], out, f"{path}.{k}")
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out, f"{path}[{i}]")
        out.append("]")
    elif isinstance(value, float | np.floating):
        raise _fail(
            f"header value at {path} is the float {value!r}; qf-worker/1 headers hold integers "
            "only: send real values in a buffer"
        )
    else:
        raise _fail(f"header value at {path} has type {type(value).__name__}, not JSON")


def canonical_json(obj: Any) -> bytes:
    r"""Return the canonical JSON bytes of ``obj`` (docs/protocol.md, "Canonical JSON").

    Keys sorted by code point, no whitespace, integers only (in
    ``[-(2**53 - 1), 2**53 - 1]``), strings escaping ``"``, ``\\``, the
    controls and every non-ASCII character (lowercase ``\\uXXXX``, surrogate
    pairs above U+FFFF).

    Parameters
    ----------
    obj
        ``dict``/``list``/``tuple``/``str``/``int``/``bool``/``None``, nested.

    Returns
    -------
    bytes
        ASCII bytes.

    Raises
    ------
    ProtocolError
        ``code="frame"`` for a float, an out-of-range integer, a non-string
        key or a non-JSON value.
    """
    out: list[str] = []
    _write(obj, out, "$")
    return "".join(out).encode("ascii")


def _parse_float(text: str) -> int:
    # Value semantics (what JavaScript's JSON.parse sees): 1.0 and 1e2 are integers.
    try:
        value = float(text)
    except ValueError as exc:  # pragma: no cover - json only passes valid literals
        raise _fail(f"header number {text!r} is not a number") from exc
    if not value.is_integer():
        raise _fail(
            f"header holds the non-integer number {text}; qf-worker/1 headers hold integers "
            "only (real values travel in buffers)"
        )
    return _parse_int(str(int(value)))


def _parse_int(text: str) -> int:
    value = int(text)
    if not -MAX_INT <= value <= MAX_INT:
        raise _fail(
            f"header holds the integer {text}, outside [-(2**53 - 1), 2**53 - 1]; large values "
            "travel in buffers"
        )
    return value


def _parse_constant(text: str) -> Any:
    raise _fail(f"header holds {text}, which is not JSON (numbers are integers only)")


_BRACKETS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _nesting(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text (strings skipped)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_NESTING:
        return 0  # cannot be deeper than the bound: the common case, no scan
    depth = deepest = 0
    for m in _BRACKETS.finditer(raw):
        token = m.group()
        if token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest


def _parse_header(raw: bytes | memoryview) -> dict[str, Any]:
    data = bytes(raw)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(f"header is not valid UTF-8 ({exc}); emit UTF-8 (ASCII) JSON") from exc
    depth = _nesting(data)
    if depth > MAX_NESTING:
        raise _fail(
            f"header nests arrays and objects {depth} deep, beyond the {MAX_NESTING} a receiver "
            "accepts; qf-worker/1 headers nest a few levels at most"
        )
    try:
        header = json.loads(
            text,
            parse_float=_parse_float,
            parse_int=_parse_int,
            parse_constant=_parse_constant,
        )
    except ProtocolError:
        raise
    except RecursionError as exc:  # a bound the scan above keeps us from, kept as a backstop
        raise _fail(f"header nests too deeply for the parser ({exc})") from exc
    except ValueError as exc:
        raise _fail(f"header is not valid JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise _fail(f"header must be a JSON object, got a {type(header).__name__}")
    kind = header.get("type")
    if not isinstance(kind, str):
        raise _fail(f"header member 'type' must be a string, got {kind!r}")
    lengths = header.get("buffers", [])
    if not isinstance(lengths, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in lengths
    ):
        raise _fail(
            f"header member 'buffers' must be a list of non-negative integers, got {lengths!r}",
            message_type=kind,
        )
    return header


# ---------------------------------------------------------------------------- messages


Buffer = bytes | bytearray | memoryview | np.ndarray


def _as_bytes_view(buf: Any) -> memoryview:
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            buf = np.ascontiguousarray(buf)
        if buf.dtype.byteorder == ">" or (buf.dtype.byteorder == "=" and not _LITTLE):
            buf = buf.astype(buf.dtype.newbyteorder("<"))
        return memoryview(buf.reshape(-1).view(np.uint8))
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


_LITTLE = np.little_endian


@dataclasses.dataclass
class Message:
    """One protocol message: a JSON header and the binary buffers it declares.

    Attributes
    ----------
    header
        The decoded header (a dict with ``"type"`` and ``"id"``).  On
        encoding, ``"buffers"`` is filled in from :attr:`buffers` when absent.
    buffers
        Bytes-like objects (``bytes``, ``bytearray``, ``memoryview``,
        C-contiguous arrays).  Decoded messages hold memoryviews into the
        frame.
    """

    header: dict[str, Any]
    buffers: list[Any] = dataclasses.field(default_factory=list)

    @property
    def type(self) -> str:
        """The message type."""
        return str(self.header.get("type"))

    @property
    def id(self) -> int | None:
        """The request id (``None`` for an unsolicited error)."""
        value = self.header.get("id")
        return value if isinstance(value, int) else None

    def buffer_views(self) -> list[memoryview]:
        """Return the buffers as flat byte memoryviews."""
        return [_as_bytes_view(b) for b in self.buffers]

    @property
    def nbytes(self) -> int:
        """Bytes of the encoded frame."""
        return sum(memoryview(p).nbytes for p in encode_pieces(self))


_ZEROS = bytes(8)


def encode_pieces(message: Message) -> list[bytes | memoryview]:
    """Encode ``message`` into frame pieces without copying its buffers.

    Parameters
    ----------
    message
        The header and buffers.  A ``"buffers"`` member in the header must
        list exactly the buffers' byte lengths; if absent and there are
        buffers it is added (an empty message carries no ``"buffers"``).

    Returns
    -------
    list of bytes-like
        The prefix with the padded header, then each buffer and its padding;
        their concatenation is the frame.

    Raises
    ------
    ProtocolError
        ``frame`` for a header that cannot be canonical JSON, ``bad_request``
        when ``"buffers"`` disagrees with the buffers.
    """
    views = message.buffer_views()
    lengths = [v.nbytes for v in views]
    header = message.header
    if "buffers" in header:
        if list(header["buffers"]) != lengths:
            raise _fail(
                f"header 'buffers' {header['buffers']!r} disagrees with the buffer lengths "
                f"{lengths}",
                code="bad_request",
                message_type=message.type,
            )
    elif views:
        header = {**header, "buffers": lengths}
    if not isinstance(header.get("type"), str):
        raise _fail(f"a message needs a string 'type', got {header.get('type')!r}")
    raw = canonical_json(header)
    if len(raw) > MAX_HEADER_BYTES:
        raise _fail(f"header of {len(raw)} bytes exceeds the limit of {MAX_HEADER_BYTES} bytes")
    body = sum(pad8(n) for n in lengths)
    head_end = pad8(PREFIX_BYTES + len(raw))
    first = _PREFIX.pack(MAGIC, len(raw), body) + raw + bytes(head_end - PREFIX_BYTES - len(raw))
    pieces: list[bytes | memoryview] = [first]
    for view in views:
        if view.nbytes:
            pieces.append(view)
        pad = pad8(view.nbytes) - view.nbytes
        if pad:
            pieces.append(_ZEROS[:pad])
    return pieces


def encode(message: Message) -> bytes:
    """Encode ``message`` into one frame (a copy; see :func:`encode_pieces`)."""
    return b"".join(encode_pieces(message))


def _check_prefix(
    prefix: bytes | bytearray | memoryview, *, max_header_bytes: int
) -> tuple[int, int]:
    magic, h, b = _PREFIX.unpack(bytes(prefix[:PREFIX_BYTES]))
    if magic != MAGIC:
        raise _fail(f"frame magic is {bytes(magic)!r}, expected {MAGIC!r}: not a qf-worker frame")
    if h > max_header_bytes:
        raise _fail(f"header_length {h} exceeds the limit of {max_header_bytes} bytes")
    return int(h), int(b)


def _check_magic_start(data: bytes | bytearray | memoryview) -> None:
    n = min(len(data), 4)
    if bytes(data[:n]) != MAGIC[:n]:
        raise _fail(
            f"frame magic starts {bytes(data[:n])!r}, expected {MAGIC!r}: not a qf-worker frame"
        )


def _header_and_layout(
    frame: memoryview, h: int, body_length: int
) -> tuple[dict[str, Any], list[int], int]:
    head_end = pad8(PREFIX_BYTES + h)
    header = _parse_header(frame[PREFIX_BYTES : PREFIX_BYTES + h])
    if any(frame[PREFIX_BYTES + h : head_end]):
        raise _fail("a padding byte after the header is not zero", message_type=header["type"])
    lengths = [int(n) for n in header.get("buffers", [])]
    expect = sum(pad8(n) for n in lengths)
    if body_length != expect:
        raise _fail(
            f"body_length is {body_length} but the header's buffers {lengths} need "
            f"sum(pad8(L)) = {expect} bytes",
            message_type=header["type"],
        )
    return header, lengths, head_end


def _split_body(
    frame: memoryview, header: dict[str, Any], lengths: list[int], head_end: int
) -> list[memoryview]:
    buffers: list[memoryview] = []
    pos = head_end
    for n in lengths:
        buffers.append(frame[pos : pos + n])
        if any(frame[pos + n : pos + pad8(n)]):
            raise _fail(
                f"a padding byte after buffer {len(buffers) - 1} is not zero",
                message_type=header["type"],
            )
        pos += pad8(n)
    return buffers


def decode(
    data: bytes | bytearray | memoryview,
    *,
    max_message_bytes: int | None = None,
    max_header_bytes: int = MAX_HEADER_BYTES,
) -> Message:
    """Decode exactly one frame.

    Checks in the order every implementation uses: magic, ``header_length``
    limit, total size against ``max_message_bytes``, the header (UTF-8,
    JSON, integers only, an object with a string ``type`` and a list of
    non-negative ``buffers``), header padding, ``body_length`` against the
    buffers, then the body's presence and its padding.

    Parameters
    ----------
    data
        The frame's bytes.
    max_message_bytes
        Refuse (``too_large``) a frame longer than this.
    max_header_bytes
        Refuse (``frame``) a longer header.

    Returns
    -------
    Message
        Buffers are memoryviews into ``data``.

    Raises
    ------
    ProtocolError
        ``frame``, ``truncated`` (the data end inside the frame) or
        ``too_large``; trailing bytes after the frame are ``frame``.
    """
    dec = FrameDecoder(max_message_bytes=max_message_bytes, max_header_bytes=max_header_bytes)
    messages = dec.feed(data)
    dec.close()
    if len(messages) != 1:
        raise _fail(f"expected exactly one frame, found {len(messages)}")
    return messages[0]


class FrameDecoder:
    """Incremental frame decoder for a byte stream (pipes, sockets).

    Feed it pieces of any size; it returns every completed message.  After
    any error it refuses further input (a byte stream cannot be
    resynchronised).  Each frame is copied into its own buffer, which is
    allocated as the body arrives (:data:`FIRST_BODY_ALLOCATION`, then
    doubling up to the announced size): a peer that announces a huge body
    and sends little makes the receiver hold only what it sent.

    Parameters
    ----------
    max_message_bytes
        Refuse a frame longer than this (``too_large``), before reading its
        body.
    max_header_bytes
        Refuse a longer header (``frame``).
    """

    def __init__(
        self, *, max_message_bytes: int | None = None, max_header_bytes: int = MAX_HEADER_BYTES
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self.max_header_bytes = max_header_bytes
        self._head = bytearray()
        self._need = PREFIX_BYTES
        self._frame: bytearray | None = None
        self._filled = 0
        self._total = 0
        self._h = 0
        self._body = 0
        self._magic_ok = False
        self._header: dict[str, Any] = {}
        self._lengths: list[int] = []
        self._failed: ProtocolError | None = None

    @property
    def in_frame(self) -> bool:
        """Whether bytes of an incomplete frame are pending."""
        return bool(self._head) or self._frame is not None

    @property
    def pending(self) -> int:
        """Bytes received of the incomplete frame."""
        return self._filled if self._frame is not None else len(self._head)

    def _raise(self, exc: ProtocolError) -> ProtocolError:
        self._failed = exc
        return exc

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message]:
        """Consume ``data``; return the messages it completes.

        Raises
        ------
        ProtocolError
            On the first malformed frame (and on every call after it).
        """
        if self._failed is not None:
            raise _fail(
                f"the stream already failed ({self._failed}); it cannot be resynchronised",
                code=self._failed.code or "frame",
            )
        mv = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
        out: list[Message] = []
        pos = 0
        end = mv.nbytes
        try:
            while pos < end:
                if self._frame is None:
                    # prefix, header and header padding: small, checked before any body
                    take = min(self._need - len(self._head), end - pos)
                    self._head += mv[pos : pos + take]
                    pos += take
                    if not self._magic_ok:
                        _check_magic_start(self._head)
                    if len(self._head) < self._need:
                        continue
                    if self._need == PREFIX_BYTES:
                        self._start_frame()
                        if len(self._head) < self._need:
                            continue
                    message = self._header_done()
                else:
                    take = min(self._total - self._filled, end - pos)
                    if self._filled + take > len(self._frame):
                        self._grow(self._filled + take)
                    self._frame[self._filled : self._filled + take] = mv[pos : pos + take]
                    self._filled += take
                    pos += take
                    message = self._body_done() if self._filled == self._total else None
                if message is not None:
                    out.append(message)
        except ProtocolError as exc:
            raise self._raise(exc) from None
        return out

    def _start_frame(self) -> None:
        h, b = _check_prefix(self._head, max_header_bytes=self.max_header_bytes)
        total = pad8(PREFIX_BYTES + h) + b
        if self.max_message_bytes is not None and total > self.max_message_bytes:
            raise _fail(
                f"a frame of {total} bytes exceeds max_message_bytes "
                f"{self.max_message_bytes}; split the payload into smaller chunks",
                code="too_large",
            )
        self._h, self._body, self._total = h, b, total
        self._need = pad8(PREFIX_BYTES + h)
        self._magic_ok = True  # the magic is known good

    def _header_done(self) -> Message | None:
        head = memoryview(self._head)
        self._header, self._lengths, head_end = _header_and_layout(head, self._h, self._body)
        if self._body == 0:
            message = Message(
                self._header, _split_body(head, self._header, self._lengths, head_end)
            )
            self._reset()
            return message
        # only now, with a header whose buffers agree with body_length, allocate the frame
        # The buffer grows as the body arrives (doubling, up to the announced size), so a
        # header that announces a huge body costs nothing until its bytes come.
        self._frame = bytearray(min(self._total, head_end + FIRST_BODY_ALLOCATION))
        self._frame[:head_end] = head
        self._filled = head_end
        return None

    def _grow(self, need: int) -> None:
        assert self._frame is not None
        bigger = bytearray(min(self._total, max(need, 2 * len(self._frame))))
        bigger[: self._filled] = memoryview(self._frame)[: self._filled]
        self._frame = bigger

    def _body_done(self) -> Message:
        assert self._frame is not None
        view = memoryview(self._frame)
        buffers = _split_body(view, self._header, self._lengths, pad8(PREFIX_BYTES + self._h))
        message = Message(self._header, buffers)
        self._reset()
        return message

    def _reset(self) -> None:
        self._head = bytearray()
        self._need = PREFIX_BYTES
        self._frame = None
        self._filled = 0
        self._total = 0
        self._magic_ok = False

    def close(self) -> None:
        """Signal the end of the stream.

        Raises
        ------
        ProtocolError
            ``truncated`` if the stream ended inside a frame.
        """
        if self._failed is not None:
            return
        if self.in_frame:
            got = self.pending
            want = self._total if self._total else PREFIX_BYTES
            exc = _fail(
                f"the stream ended inside a frame: {got} of {want} bytes received",
                code="truncated",
            )
            self._failed = exc
            raise exc
