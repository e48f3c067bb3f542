"""The ``qf-worker/1`` wire protocol: frames, canonical JSON and messages (no I/O).

Everything here is pure: bytes in, :class:`Message` out and back, with every
rule of ``docs/protocol.md`` checked.  A violation raises
:class:`~quantem_flow.errors.ProtocolError` whose ``code`` is the protocol's
error code (``frame``, ``truncated``, ``too_large``, ``bad_request``,
``version``, ``unsupported``).  Transports (:mod:`.transport`) move the
frames; the session (:mod:`.session`) pairs requests with replies.

A frame is ``"QFW1"``, ``header_length`` (u32 LE), ``body_length`` (u64 LE),
the canonical-JSON header, zero padding to 8 bytes, then each buffer padded
with zeros to 8 bytes.  Buffers are bytes-like objects; encoding returns the
pieces without copying the buffers (:func:`encode_pieces`), decoding returns
memoryviews into one allocation per frame.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from collections.abc import Iterable, Sequence
from typing import Any, Final

import numpy as np

from ...errors import ProtocolError

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
    "FramePassOutputs",
    "HelloInfo",
    "Message",
    "bye",
    "canonical_json",
    "decode",
    "encode",
    "encode_pieces",
    "error",
    "frame_pass_result",
    "gather_result",
    "hello_reply",
    "hello_request",
    "pad8",
    "parse_frame_pass_result",
    "parse_gather_result",
    "parse_hello_reply",
    "parse_put",
    "parse_put_weights",
    "parse_run_gather",
    "ping",
    "put",
    "put_result",
    "put_weights",
    "put_weights_result",
    "release",
    "release_result",
    "run_frame_pass",
    "run_gather",
    "stats",
    "stats_reply",
    "validate_request",
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


# ---------------------------------------------------------------------------- helpers


def _bad(message: str, kind: str, *, handle: int | None = None) -> ProtocolError:
    return _fail(message, code="bad_request", message_type=kind, handle=handle)


def _int(header: dict[str, Any], key: str, kind: str, *, minimum: int = 0) -> int:
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise _bad(f"{kind}: member {key!r} must be an integer >= {minimum}, got {value!r}", kind)
    return value


def _str(header: dict[str, Any], key: str, kind: str, choices: Sequence[str] | None = None) -> str:
    value = header.get(key)
    if not isinstance(value, str) or (choices is not None and value not in choices):
        expect = f"one of {list(choices)}" if choices is not None else "a string"
        raise _bad(f"{kind}: member {key!r} must be {expect}, got {value!r}", kind)
    return str(value)


def _ints(header: dict[str, Any], key: str, kind: str, *, length: int | None = None) -> list[int]:
    value = header.get(key)
    if (
        not isinstance(value, list)
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        or (length is not None and len(value) != length)
    ):
        n = f"{length} " if length is not None else ""
        raise _bad(
            f"{kind}: member {key!r} must be a list of {n}non-negative integers, got {value!r}",
            kind,
        )
    return [int(v) for v in value]


def _bool(header: dict[str, Any], key: str, kind: str) -> bool:
    value = header.get(key)
    if not isinstance(value, bool):
        raise _bad(f"{kind}: member {key!r} must be true or false, got {value!r}", kind)
    return value


def _nbuf(message: Message, n: int) -> list[memoryview]:
    views = message.buffer_views()
    if len(views) != n:
        raise _bad(
            f"{message.type}: expected {n} buffer(s), got {len(views)}",
            message.type,
            handle=_handle_of(message),
        )
    return views


def _handle_of(message: Message) -> int | None:
    for key in ("handle", "chunk"):
        value = message.header.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _array(view: memoryview, dtype: str, shape: Sequence[int], what: str, kind: str) -> np.ndarray:
    dt = np.dtype(dtype).newbyteorder("<")
    count = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if view.nbytes != count * dt.itemsize:
        raise _bad(
            f"{kind}: buffer {what} has {view.nbytes} bytes, expected {count} {dtype} values "
            f"= {count * dt.itemsize} bytes for shape {list(shape)}",
            kind,
        )
    arr = np.frombuffer(view, dtype=dt) if view.nbytes else np.zeros(0, dtype=dt)
    if not _LITTLE:  # pragma: no cover - big-endian hosts
        arr = arr.astype(dt.newbyteorder("="))
    return arr.reshape(tuple(shape))


def _dtype_name(dtype: Any, what: str) -> str:
    name = str(np.dtype(dtype).name)
    if name not in DTYPES:
        raise _bad(f"{what}: dtype {name} is not one of {list(DTYPES)}", "put")
    return name


def _req(kind: str, id: int, **members: Any) -> dict[str, Any]:
    if not isinstance(id, int) or isinstance(id, bool) or not 0 <= id <= MAX_INT:
        raise _bad(f"{kind}: id must be an integer in [0, 2**53 - 1], got {id!r}", kind)
    return {"type": kind, "id": id, **members}


# ---------------------------------------------------------------------------- hello


def hello_request(*, id: int = 0, client: str, protocol: str = PROTOCOL) -> Message:
    """Return the bridge's ``hello`` (the first message on every connection)."""
    return Message(_req("hello", id, protocol=protocol, client=client))


@dataclasses.dataclass(frozen=True)
class HelloInfo:
    """What a worker says about itself in its ``hello`` reply.

    Attributes
    ----------
    runtime
        The runtime name the worker implements (``"webgpu"``...).
    implementation
        Name, version and host of the worker program.
    device
        Device description (strings and integers).
    limits
        ``max_message_bytes``, ``max_buffer_bytes``, ``max_weights``,
        ``max_frame_pixels``.
    memory_budget_bytes
        Payload bytes the worker admits in total.
    kernels
        ``(operation, representation, dtype)`` triples.
    storage_schemas
        Storage schemas accepted by ``put``.
    accumulation
        ``{"integer": ..., "real": ...}``.
    """

    runtime: str
    implementation: str
    device: dict[str, Any]
    limits: dict[str, int]
    memory_budget_bytes: int
    kernels: tuple[tuple[str, str, str], ...]
    storage_schemas: tuple[str, ...]
    accumulation: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (provenance)."""
        out = dataclasses.asdict(self)
        out["kernels"] = [list(k) for k in self.kernels]
        out["storage_schemas"] = list(self.storage_schemas)
        return out


_LIMITS = ("max_message_bytes", "max_buffer_bytes", "max_weights", "max_frame_pixels")


def hello_reply(
    *,
    id: int,
    runtime: str,
    implementation: str,
    device: dict[str, Any],
    limits: dict[str, int],
    memory_budget_bytes: int,
    kernels: Iterable[Sequence[str]],
    storage_schemas: Iterable[str],
    accumulation: dict[str, str],
) -> Message:
    """Return a worker's ``hello`` reply (see :class:`HelloInfo` for the members)."""
    msg = Message(
        _req(
            "hello",
            id,
            protocol=PROTOCOL,
            runtime=runtime,
            implementation=implementation,
            device=dict(device),
            limits=dict(limits),
            memory_budget_bytes=int(memory_budget_bytes),
            kernels=[list(k) for k in kernels],
            storage_schemas=list(storage_schemas),
            accumulation=dict(accumulation),
        )
    )
    parse_hello_reply(msg)
    return msg


def parse_hello_reply(message: Message) -> HelloInfo:
    """Validate a ``hello`` reply and return its contents.

    Raises
    ------
    ProtocolError
        ``version`` if the worker speaks another protocol, ``bad_request``
        for a missing or ill-typed member.
    """
    h = message.header
    kind = "hello"
    if message.type != "hello":
        raise _bad(f"expected a hello reply, got {message.type!r}", kind)
    if h.get("protocol") != PROTOCOL:
        raise _fail(
            f"the worker speaks {h.get('protocol')!r}, this bridge speaks {PROTOCOL!r}; "
            "update one side",
            code="version",
            message_type=kind,
        )
    device = h.get("device")
    if not isinstance(device, dict):
        raise _bad(f"hello: member 'device' must be an object, got {device!r}", kind)
    limits = h.get("limits")
    if not isinstance(limits, dict):
        raise _bad(f"hello: member 'limits' must be an object, got {limits!r}", kind)
    lim = {k: _int(limits, k, "hello.limits") for k in _LIMITS}
    kernels = h.get("kernels")
    if not isinstance(kernels, list) or not all(
        isinstance(k, list) and len(k) == 3 and all(isinstance(s, str) for s in k) for k in kernels
    ):
        raise _bad(
            f"hello: member 'kernels' must be a list of [operation, representation, dtype], "
            f"got {kernels!r}",
            kind,
        )
    schemas = h.get("storage_schemas")
    if not isinstance(schemas, list) or not all(isinstance(s, str) for s in schemas):
        raise _bad(
            f"hello: member 'storage_schemas' must be a list of strings, got {schemas!r}", kind
        )
    acc = h.get("accumulation")
    if (
        not isinstance(acc, dict)
        or acc.get("integer") not in ACCUMULATIONS
        or acc.get("real") not in ACCUMULATIONS
    ):
        raise _bad(
            f"hello: member 'accumulation' must be {{'integer': ..., 'real': ...}} with values in "
            f"{list(ACCUMULATIONS)}, got {acc!r}",
            kind,
        )
    return HelloInfo(
        runtime=_str(h, "runtime", kind),
        implementation=_str(h, "implementation", kind),
        device=dict(device),
        limits=lim,
        memory_budget_bytes=_int(h, "memory_budget_bytes", kind),
        kernels=tuple((str(a), str(b), str(c)) for a, b, c in kernels),
        storage_schemas=tuple(schemas),
        accumulation={"integer": str(acc["integer"]), "real": str(acc["real"])},
    )


# ---------------------------------------------------------------------------- put


def _scan_slice_member(scan_slice: Any) -> list[list[int]]:
    (r0, r1), (c0, c1) = scan_slice
    return [[int(r0), int(r1)], [int(c0), int(c1)]]


def put(
    *,
    id: int,
    handle: int,
    representation: str,
    payload: Any,
    scan_slice: Any,
) -> Message:
    """Return a ``put`` request carrying one chunk's payload, without copying it.

    Parameters
    ----------
    id, handle
        Request id and the new handle.
    representation
        ``"dense"`` (an array ``(rows, cols, k_r, k_c)``), ``"paired"`` (a
        :class:`~quantem_flow.representations.paired.PairedPayload`) or
        ``"packed"`` (a :class:`~quantem_flow.representations.packed.PackedPayload`).
    payload
        The payload object.
    scan_slice
        ``((r0, r1), (c0, c1))`` of the chunk.

    Raises
    ------
    ProtocolError
        ``unsupported`` for a representation or dtype without a storage
        schema here (encoded, uint64 counts), ``bad_request`` for an
        inconsistent payload.
    """
    kind = "put"
    common = {"handle": handle, "representation": representation, "scan_slice": None}
    common["scan_slice"] = _scan_slice_member(scan_slice)
    if representation == "dense":
        arr = np.asarray(payload)
        if arr.ndim != 4:
            raise _bad(
                f"put: a dense payload is (rows, cols, k_r, k_c), got shape {arr.shape}", kind
            )
        header = _req(
            kind,
            id,
            **common,
            storage_schema=STORAGE_SCHEMAS["dense"],
            dtype=_dtype_name(arr.dtype, "put dense"),
            shape=[int(s) for s in arr.shape],
        )
        return Message(header, [arr])
    if representation == "paired":
        p = payload
        if p.pending_threshold is not None:
            raise _bad("put: a paired payload with a pending threshold cannot be stored", kind)
        count_dtype = np.dtype(p.counts.dtype).name
        if count_dtype not in _COUNT_DTYPES:
            raise _fail(
                f"put: paired counts of dtype {count_dtype} have no qf-worker/1 layout (counts "
                f"are one of {list(_COUNT_DTYPES)}); keep this chunk on a host runtime",
                code="unsupported",
                message_type=kind,
                handle=handle,
            )
        header = _req(
            kind,
            id,
            **common,
            storage_schema=STORAGE_SCHEMAS["paired"],
            dtype=_dtype_name(p.value_dtype, "put paired"),
            shape=[*p.scan_shape, *p.frame_shape],
            index_dtype=np.dtype(p.indices.dtype).name,
            count_dtype=count_dtype,
        )
        return Message(header, [p.indptr, p.indices, p.counts])
    if representation == "packed":
        p = payload
        header = _req(
            kind,
            id,
            **common,
            storage_schema=STORAGE_SCHEMAS["packed"],
            dtype=_dtype_name(p.value_dtype, "put packed"),
            shape=[*p.scan_shape, *p.frame_shape],
            block_values=int(p.block_values),
        )
        return Message(header, [p.widths, p.offsets, p.data])
    raise _fail(
        f"put: the {representation!r} representation has no qf-worker/1 storage schema "
        f"(schemas: {STORAGE_SCHEMAS}); convert it or keep it on a host runtime",
        code="unsupported",
        message_type=kind,
        handle=handle,
    )


def _validate_put_header(h: dict[str, Any]) -> tuple[str, str, list[int], list[list[int]]]:
    kind = "put"
    handle = h.get("handle") if isinstance(h.get("handle"), int) else None
    _int(h, "handle", kind)
    rep = h.get("representation")
    schema = h.get("storage_schema")
    if rep not in STORAGE_SCHEMAS or schema != STORAGE_SCHEMAS[str(rep)]:
        raise _fail(
            f"put: representation {rep!r} with storage_schema {schema!r} is not offered; "
            f"offered: {STORAGE_SCHEMAS}",
            code="unsupported",
            message_type=kind,
            handle=handle,
        )
    dtype = _str(h, "dtype", kind, DTYPES)
    shape = _ints(h, "shape", kind, length=4)
    sl = h.get("scan_slice")
    if (
        not isinstance(sl, list)
        or len(sl) != 2
        or not all(
            isinstance(p, list)
            and len(p) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in p)
            and p[0] <= p[1]
            for p in sl
        )
    ):
        raise _bad(f"put: scan_slice must be [[r0, r1], [c0, c1]] with r0 <= r1, got {sl!r}", kind)
    if [sl[0][1] - sl[0][0], sl[1][1] - sl[1][0]] != shape[:2]:
        raise _bad(
            f"put: scan_slice {sl} covers {sl[0][1] - sl[0][0]} x {sl[1][1] - sl[1][0]} scan "
            f"positions but shape is {shape}",
            kind,
            handle=handle,
        )
    return str(rep), dtype, shape, sl


def parse_put(message: Message) -> tuple[str, Any, tuple[tuple[int, int], tuple[int, int]]]:
    """Validate a ``put`` request and rebuild its payload (views into the frame).

    Returns
    -------
    tuple
        ``(representation, payload, scan_slice)``; the payload is a dense
        array, a ``PairedPayload`` or a ``PackedPayload``.

    Raises
    ------
    ProtocolError
        ``bad_request`` for wrong members or buffer sizes, ``unsupported``
        for a schema not offered.
    """
    h = message.header
    rep, dtype, shape, sl = _validate_put_header(h)
    scan_slice = ((sl[0][0], sl[0][1]), (sl[1][0], sl[1][1]))
    handle = int(h["handle"])
    kind = "put"
    rows, cols, kr, kc = shape
    n, k = rows * cols, kr * kc
    try:
        if rep == "dense":
            (frames,) = _nbuf(message, 1)
            return rep, _array(frames, dtype, shape, "frames", kind), scan_slice
        if rep == "paired":
            from ...representations.paired import PairedPayload

            index_dtype = _str(h, "index_dtype", kind, _INDEX_DTYPES)
            count_dtype = _str(h, "count_dtype", kind, _COUNT_DTYPES)
            if np.dtype(dtype).kind not in "ui":
                raise _bad(f"put: paired data must have an integer dtype, got {dtype}", kind)
            b_indptr, b_indices, b_counts = _nbuf(message, 3)
            indptr = _array(b_indptr, "int64", [n + 1], "indptr", kind)
            m = b_indices.nbytes // np.dtype(index_dtype).itemsize
            indices = _array(b_indices, index_dtype, [m], "indices", kind)
            counts = _array(b_counts, count_dtype, [m], "counts", kind)
            if m and int(indices.max()) >= k:
                raise _bad(f"put: a paired index is {int(indices.max())} >= {k} pixels", kind)
            if np.any(np.diff(indptr) < 0):
                raise _bad("put: paired indptr must be non-decreasing", kind)
            paired = PairedPayload(
                scan_shape=(rows, cols),
                frame_shape=(kr, kc),
                indptr=indptr,
                indices=indices,
                counts=counts,
                value_dtype=np.dtype(dtype),
            )
            return rep, paired, scan_slice
        from ...representations.packed import PackedPayload

        bv = _int(h, "block_values", kind, minimum=32)
        if bv % 32:
            raise _bad(f"put: block_values must be a multiple of 32, got {bv}", kind)
        if np.dtype(dtype).kind not in "ui":
            raise _bad(f"put: packed data must have an integer dtype, got {dtype}", kind)
        b_widths, b_offsets, b_data = _nbuf(message, 3)
        nb = n * (-(-k // bv))
        widths = _array(b_widths, "uint8", [nb], "widths", kind)
        offsets = _array(b_offsets, "int64", [nb], "offsets", kind)
        if b_data.nbytes % 4 or b_data.nbytes < 4:
            raise _bad(
                f"put: packed data must be whole uint32 words plus a trailing zero word, got "
                f"{b_data.nbytes} bytes",
                kind,
            )
        data = _array(b_data, "uint32", [b_data.nbytes // 4], "data", kind)
        payload = PackedPayload(
            scan_shape=(rows, cols),
            frame_shape=(kr, kc),
            value_dtype=np.dtype(dtype),
            block_values=bv,
            widths=widths,
            offsets=offsets,
            data=data,
        )
        return rep, payload, scan_slice
    except ProtocolError as exc:
        exc.handle = handle
        raise
    except ValueError as exc:  # ShapeError from the payload classes
        raise _bad(f"put: inconsistent {rep} payload: {exc}", kind, handle=handle) from exc


def put_result(*, id: int, handle: int, resident_bytes: int) -> Message:
    """Return the reply to ``put``."""
    return Message(_req("result", id, handle=handle, resident_bytes=int(resident_bytes)))


# ---------------------------------------------------------------------------- weights


def put_weights(*, id: int, handle: int, weights: np.ndarray) -> Message:
    """Return a ``put_weights`` request for ``(m, K)`` float64 weight rows."""
    w = np.asarray(weights)
    if w.ndim != 2 or w.dtype != np.float64:
        raise _bad(
            f"put_weights: weights must be (m, K) float64, got {w.dtype} {w.shape}", "put_weights"
        )
    header = _req(
        "put_weights", id, handle=handle, shape=[int(s) for s in w.shape], dtype="float64"
    )
    return Message(header, [w])


def parse_put_weights(message: Message) -> np.ndarray:
    """Validate a ``put_weights`` request and return the ``(m, K)`` float64 rows."""
    h = message.header
    kind = "put_weights"
    _int(h, "handle", kind)
    _str(h, "dtype", kind, ("float64",))
    shape = _ints(h, "shape", kind, length=2)
    (buf,) = _nbuf(message, 1)
    return _array(buf, "float64", shape, "weights", kind)


def put_weights_result(
    *, id: int, handle: int, resident_bytes: int, integer_weights: bool
) -> Message:
    """Return the reply to ``put_weights``."""
    return Message(
        _req(
            "result",
            id,
            handle=handle,
            resident_bytes=int(resident_bytes),
            integer_weights=bool(integer_weights),
        )
    )


# ---------------------------------------------------------------------------- run


def run_frame_pass(*, id: int, chunk: int, weights: int, want_sum: bool, want_max: bool) -> Message:
    """Return a ``run`` request of the fused frame pass."""
    return Message(
        _req(
            "run",
            id,
            operation="frame_pass",
            chunk=chunk,
            weights=weights,
            options={"want_sum": bool(want_sum), "want_max": bool(want_max)},
        )
    )


def run_gather(*, id: int, chunk: int, indices: np.ndarray) -> Message:
    """Return a ``run`` request gathering flat detector pixels ``indices``."""
    idx = np.ascontiguousarray(indices, dtype=np.int64)
    return Message(_req("run", id, operation="gather", chunk=chunk), [idx.reshape(-1)])


def parse_run_gather(message: Message) -> np.ndarray:
    """Return the int64 indices of a ``run`` gather request."""
    (buf,) = _nbuf(message, 1)
    if buf.nbytes % 8:
        raise _bad(f"run gather: indices buffer of {buf.nbytes} bytes is not int64", "run")
    idx = _array(buf, "int64", [buf.nbytes // 8], "indices", "run")
    if idx.size and int(idx.min()) < 0:
        raise _bad("run gather: indices must be non-negative", "run")
    return idx


def _pattern_sum_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """int64 for integer data (uint64 for uint64 data), float64 for real data."""
    if dtype.kind in "uib":
        return np.dtype(np.uint64 if dtype == np.uint64 else np.int64)
    return np.dtype(np.float64)


def _output(name: str, arr: np.ndarray) -> dict[str, Any]:
    return {"name": name, "dtype": np.dtype(arr.dtype).name, "shape": [int(s) for s in arr.shape]}


def frame_pass_result(
    *,
    id: int,
    per_frame: np.ndarray,
    pattern_sum: np.ndarray | None,
    pattern_max: np.ndarray | None,
    accumulation: str,
) -> Message:
    """Return the reply to a frame-pass ``run`` (one buffer per output)."""
    arrays = [("per_frame", per_frame)]
    if pattern_sum is not None:
        arrays.append(("pattern_sum", pattern_sum))
    if pattern_max is not None:
        arrays.append(("pattern_max", pattern_max))
    return Message(
        _req(
            "result",
            id,
            outputs=[_output(n, a) for n, a in arrays],
            accumulation=accumulation,
        ),
        [np.ascontiguousarray(a) for _, a in arrays],
    )


def gather_result(*, id: int, values: np.ndarray) -> Message:
    """Return the reply to a gather ``run``."""
    return Message(_req("result", id, outputs=[_output("values", values)]), [values])


def _outputs(message: Message, kind: str) -> dict[str, np.ndarray]:
    outs = message.header.get("outputs")
    if not isinstance(outs, list) or not all(isinstance(o, dict) for o in outs):
        raise _bad(f"{kind} result: 'outputs' must be a list of objects, got {outs!r}", kind)
    views = _nbuf(message, len(outs))
    arrays: dict[str, np.ndarray] = {}
    for out, view in zip(outs, views, strict=True):
        name = _str(out, "name", kind)
        arrays[name] = _array(
            view, _str(out, "dtype", kind, DTYPES), _ints(out, "shape", kind), name, kind
        )
    return arrays


@dataclasses.dataclass
class FramePassOutputs:
    """A frame-pass reply: the arrays of a ``FramePassResult`` plus the accumulation used."""

    per_frame: np.ndarray
    pattern_sum: np.ndarray | None
    pattern_max: np.ndarray | None
    accumulation: str


def parse_frame_pass_result(
    message: Message,
    *,
    n_frames: int,
    n_weights: int,
    n_pixels: int,
    dtype: Any,
    want_sum: bool,
    want_max: bool,
) -> FramePassOutputs:
    """Validate a frame-pass reply against what was asked and return its arrays.

    Raises
    ------
    ProtocolError
        ``bad_request`` when an output is missing, extra, or of the wrong
        dtype or shape.
    """
    kind = "run"
    arrays = _outputs(message, kind)
    expect: dict[str, tuple[np.dtype[Any], tuple[int, ...]]] = {
        "per_frame": (np.dtype(np.float64), (n_frames, n_weights))
    }
    data_dtype = np.dtype(dtype)
    if want_sum:
        sum_dt = _pattern_sum_dtype(data_dtype)
        expect["pattern_sum"] = (sum_dt, (n_pixels,))
    if want_max:
        expect["pattern_max"] = (data_dtype, (n_pixels,))
    if set(arrays) != set(expect):
        raise _bad(
            f"frame_pass result: outputs {sorted(arrays)} but {sorted(expect)} were asked for",
            kind,
        )
    for name, (dt, shape) in expect.items():
        got = arrays[name]
        if got.dtype != dt or got.shape != shape:
            raise _bad(
                f"frame_pass result: {name} is {got.dtype} {got.shape}, expected {dt} {shape}",
                kind,
            )
    acc = _str(message.header, "accumulation", kind, ACCUMULATIONS)
    return FramePassOutputs(
        per_frame=arrays["per_frame"],
        pattern_sum=arrays.get("pattern_sum"),
        pattern_max=arrays.get("pattern_max"),
        accumulation=acc,
    )


def parse_gather_result(
    message: Message, *, n_frames: int, n_indices: int, dtype: Any
) -> np.ndarray:
    """Validate a gather reply and return ``values (n_frames, n_indices)``."""
    arrays = _outputs(message, "run")
    values = arrays.get("values")
    dt = np.dtype(dtype)
    if (
        set(arrays) != {"values"}
        or values is None
        or values.dtype != dt
        or values.shape
        != (
            n_frames,
            n_indices,
        )
    ):
        raise _bad(
            f"gather result: expected one output 'values' {dt} {(n_frames, n_indices)}, got "
            f"{[(k, str(v.dtype), v.shape) for k, v in arrays.items()]}",
            "run",
        )
    return values


# ---------------------------------------------------------------------------- the rest


def release(*, id: int, handles: Iterable[int]) -> Message:
    """Return a ``release`` request."""
    return Message(_req("release", id, handles=[int(h) for h in handles]))


def release_result(*, id: int, released: Iterable[int], resident_bytes: int) -> Message:
    """Return the reply to ``release``."""
    return Message(
        _req("result", id, released=[int(h) for h in released], resident_bytes=int(resident_bytes))
    )


def stats(*, id: int) -> Message:
    """Return a ``stats`` request."""
    return Message(_req("stats", id))


def stats_reply(
    *, id: int, handles: int, resident_bytes: dict[str, int], memory_budget_bytes: int
) -> Message:
    """Return the reply to ``stats``."""
    return Message(
        _req(
            "stats",
            id,
            handles=int(handles),
            resident_bytes={k: int(v) for k, v in resident_bytes.items()},
            memory_budget_bytes=int(memory_budget_bytes),
        )
    )


def ping(*, id: int) -> Message:
    """Return a ``ping`` (the reply is the same message)."""
    return Message(_req("ping", id))


def bye(*, id: int) -> Message:
    """Return a ``bye`` (the reply is the same message)."""
    return Message(_req("bye", id))


def error(*, id: int | None, code: str, message: str, handle: int | None = None) -> Message:
    """Return an ``error`` reply (``id=None`` for an unsolicited one before closing)."""
    if code not in ERROR_CODES:
        raise _bad(f"error: code {code!r} is not one of {list(ERROR_CODES)}", "error")
    header: dict[str, Any] = {"type": "error", "id": id, "code": code, "message": message}
    if handle is not None:
        header["handle"] = int(handle)
    return Message(header)


def validate_request(message: Message) -> None:
    """Check a request's members (the worker's first step on every message).

    Raises
    ------
    ProtocolError
        ``bad_request`` for a missing or ill-typed member (or a wrong buffer
        count), ``unsupported`` for an unknown message type or operation.
    """
    h = message.header
    kind = message.type
    if kind not in REQUEST_TYPES:
        raise _fail(
            f"message type {kind!r} is not a request this worker answers; requests: "
            f"{list(REQUEST_TYPES)}",
            code="unsupported",
            message_type=kind,
        )
    _int(h, "id", kind)
    if kind == "hello":
        _str(h, "protocol", kind)
    elif kind == "put":
        _validate_put_header(h)
    elif kind == "put_weights":
        _int(h, "handle", kind)
        _ints(h, "shape", kind, length=2)
        _str(h, "dtype", kind, ("float64",))
        _nbuf(message, 1)
    elif kind == "run":
        op = _str(h, "operation", kind)
        _int(h, "chunk", kind)
        if op == "frame_pass":
            _int(h, "weights", kind)
            options = h.get("options")
            if not isinstance(options, dict):
                raise _bad(f"run: member 'options' must be an object, got {options!r}", kind)
            _bool(options, "want_sum", kind)
            _bool(options, "want_max", kind)
            _nbuf(message, 0)
        elif op == "gather":
            _nbuf(message, 1)
        else:
            raise _fail(
                f"run: operation {op!r} is not offered; operations: ['frame_pass', 'gather']",
                code="unsupported",
                message_type=kind,
                handle=_handle_of(message),
            )
    elif kind == "release":
        _ints(h, "handles", kind)
