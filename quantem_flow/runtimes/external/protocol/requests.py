"""Every ``qf-worker/1`` request and reply as a typed value (frozen dataclasses).

:func:`parse_request` checks a request (:func:`~.messages.validate_request`
and the buffer checks of its parser) and returns one of the request types;
:func:`parse_reply` does the same for replies.  Each value's ``message()``
builds the :class:`~.framing.Message` with the builders of :mod:`.messages`,
so the bytes on the wire are exactly those of the golden vectors
(tests/external/test_protocol_types.py re-encodes every vector).  Workers
written in Python answer typed requests (:mod:`..reference_worker`) instead
of reading header members by name, as distributed's message dataclasses do.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ....errors import ProtocolError
from .framing import PROTOCOL, Message, _fail
from .messages import (
    FramePassOutputs,
    HelloInfo,
    _bad,
    _int,
    _ints,
    _str,
    bye,
    error,
    gather_result,
    hello_request,
    parse_frame_pass_result,
    parse_gather_result,
    parse_hello_reply,
    parse_put,
    parse_put_weights,
    parse_run_gather,
    ping,
    put,
    put_result,
    put_weights,
    put_weights_result,
    release,
    release_result,
    run_frame_pass,
    run_gather,
    stats,
    stats_reply,
    validate_request,
)

__all__ = [
    "Bye",
    "ErrorReply",
    "GatherResult",
    "Hello",
    "Ping",
    "Put",
    "PutResult",
    "PutWeights",
    "PutWeightsResult",
    "Release",
    "ReleaseResult",
    "Reply",
    "Request",
    "RunFramePass",
    "RunGather",
    "Stats",
    "StatsReply",
    "parse_reply",
    "parse_request",
]


# -------------------------------------------------------------------------------- requests
@dataclasses.dataclass(frozen=True)
class Hello:
    """``hello``: the first request on every connection."""

    id: int
    client: str
    protocol: str = PROTOCOL

    def message(self) -> Message:
        """The request as it goes on the wire."""
        return hello_request(id=self.id, client=self.client, protocol=self.protocol)


@dataclasses.dataclass(frozen=True, eq=False)
class Put:
    """``put``: one chunk's payload under a new handle (the payload views the frame).

    ``dtype``, ``shape`` and ``nbytes`` (the values' dtype, the chunk's
    ``(rows, cols, k_r, k_c)`` and the bytes of its buffers) are filled in
    when a request is parsed; :meth:`message` derives them from the payload.
    """

    id: int
    handle: int
    representation: str
    payload: Any
    scan_slice: tuple[tuple[int, int], tuple[int, int]]
    dtype: str = ""
    shape: tuple[int, ...] = ()
    nbytes: int = 0

    def message(self) -> Message:
        """The request as it goes on the wire."""
        return put(
            id=self.id,
            handle=self.handle,
            representation=self.representation,
            payload=self.payload,
            scan_slice=self.scan_slice,
        )


@dataclasses.dataclass(frozen=True, eq=False)
class PutWeights:
    """``put_weights``: ``(m, K)`` float64 weight rows under a new handle."""

    id: int
    handle: int
    weights: np.ndarray

    def message(self) -> Message:
        """The request as it goes on the wire."""
        return put_weights(id=self.id, handle=self.handle, weights=self.weights)


@dataclasses.dataclass(frozen=True)
class RunFramePass:
    """``run`` of the fused frame pass of a chunk against a weight handle."""

    id: int
    chunk: int
    weights: int
    want_sum: bool
    want_max: bool

    def message(self) -> Message:
        """The request as it goes on the wire."""
        return run_frame_pass(
            id=self.id,
            chunk=self.chunk,
            weights=self.weights,
            want_sum=self.want_sum,
            want_max=self.want_max,
        )


@dataclasses.dataclass(frozen=True, eq=False)
class RunGather:
    """``run`` gathering the flat detector pixels ``indices`` of every frame of a chunk."""

    id: int
    chunk: int
    indices: np.ndarray

    def message(self) -> Message:
        """The request as it goes on the wire."""
        return run_gather(id=self.id, chunk=self.chunk, indices=self.indices)


@dataclasses.dataclass(frozen=True)
class Release:
    """``release``: forget these handles."""

    id: int
    handles: tuple[int, ...]

    def message(self) -> Message:
        """The request as it goes on the wire."""
        return release(id=self.id, handles=self.handles)


@dataclasses.dataclass(frozen=True)
class Stats:
    """``stats``: the worker's handles and resident bytes."""

    id: int

    def message(self) -> Message:
        """The request as it goes on the wire."""
        return stats(id=self.id)


@dataclasses.dataclass(frozen=True)
class Ping:
    """``ping``: answered by the same message."""

    id: int

    def message(self) -> Message:
        """The request as it goes on the wire."""
        return ping(id=self.id)


@dataclasses.dataclass(frozen=True)
class Bye:
    """``bye``: the worker forgets everything and closes (answered by the same message)."""

    id: int

    def message(self) -> Message:
        """The request as it goes on the wire."""
        return bye(id=self.id)


Request = Hello | Put | PutWeights | RunFramePass | RunGather | Release | Stats | Ping | Bye


def parse_request(message: Message) -> Request:
    """Check a request and return it typed.

    Raises
    ------
    ProtocolError
        ``bad_request`` for a missing or ill-typed member or wrong buffers,
        ``unsupported`` for an unknown type, operation or schema.
    """
    validate_request(message)
    h = message.header
    kind = message.type
    rid = int(h["id"])
    if kind == "hello":
        client = h.get("client")
        return Hello(
            id=rid, client=str(client) if client is not None else "", protocol=h["protocol"]
        )
    if kind == "put":
        representation, payload, scan_slice = parse_put(message)
        return Put(
            rid,
            int(h["handle"]),
            representation,
            payload,
            scan_slice,
            dtype=str(h["dtype"]),
            shape=tuple(int(n) for n in h["shape"]),
            nbytes=sum(v.nbytes for v in message.buffer_views()),
        )
    if kind == "put_weights":
        return PutWeights(rid, int(h["handle"]), parse_put_weights(message))
    if kind == "run":
        if h["operation"] == "gather":
            return RunGather(rid, int(h["chunk"]), parse_run_gather(message))
        options = h["options"]
        return RunFramePass(
            rid, int(h["chunk"]), int(h["weights"]), options["want_sum"], options["want_max"]
        )
    if kind == "release":
        return Release(rid, tuple(int(x) for x in h["handles"]))
    if kind == "stats":
        return Stats(rid)
    if kind == "ping":
        return Ping(rid)
    if kind == "bye":
        return Bye(rid)
    raise _fail(  # pragma: no cover - validate_request refused it
        f"message type {kind!r} is not a request", code="unsupported", message_type=kind
    )


# ---------------------------------------------------------------------------------- replies
@dataclasses.dataclass(frozen=True)
class PutResult:
    """The reply to ``put``: the handle and the bytes it holds."""

    id: int
    handle: int
    resident_bytes: int

    def message(self) -> Message:
        """The reply as it goes on the wire."""
        return put_result(id=self.id, handle=self.handle, resident_bytes=self.resident_bytes)


@dataclasses.dataclass(frozen=True)
class PutWeightsResult:
    """The reply to ``put_weights``: also whether every weight is an integer."""

    id: int
    handle: int
    resident_bytes: int
    integer_weights: bool

    def message(self) -> Message:
        """The reply as it goes on the wire."""
        return put_weights_result(
            id=self.id,
            handle=self.handle,
            resident_bytes=self.resident_bytes,
            integer_weights=self.integer_weights,
        )


@dataclasses.dataclass(frozen=True, eq=False)
class GatherResult:
    """The reply to a gather ``run``: ``(frames, pixels)`` values."""

    id: int
    values: np.ndarray

    def message(self) -> Message:
        """The reply as it goes on the wire."""
        return gather_result(id=self.id, values=self.values)


@dataclasses.dataclass(frozen=True)
class ReleaseResult:
    """The reply to ``release``: the handles forgotten and the bytes still held."""

    id: int
    released: tuple[int, ...]
    resident_bytes: int

    def message(self) -> Message:
        """The reply as it goes on the wire."""
        return release_result(
            id=self.id, released=self.released, resident_bytes=self.resident_bytes
        )


@dataclasses.dataclass(frozen=True)
class StatsReply:
    """The reply to ``stats``."""

    id: int
    handles: int
    resident_bytes: dict[str, int]
    memory_budget_bytes: int

    def message(self) -> Message:
        """The reply as it goes on the wire."""
        return stats_reply(
            id=self.id,
            handles=self.handles,
            resident_bytes=self.resident_bytes,
            memory_budget_bytes=self.memory_budget_bytes,
        )


@dataclasses.dataclass(frozen=True)
class ErrorReply:
    """An ``error`` reply (``id`` ``None``: unsolicited, before the worker closes)."""

    id: int | None
    code: str
    text: str
    handle: int | None = None

    def message(self) -> Message:
        """The reply as it goes on the wire."""
        return error(id=self.id, code=self.code, message=self.text, handle=self.handle)


Reply = (
    HelloInfo
    | PutResult
    | PutWeightsResult
    | FramePassOutputs
    | GatherResult
    | ReleaseResult
    | StatsReply
    | Ping
    | Bye
    | ErrorReply
)


def parse_reply(message: Message, request: Request, **expect: Any) -> Reply:
    """Check the reply to ``request`` and return it typed (an ``error`` as :class:`ErrorReply`).

    ``expect``: what the reply to a ``run`` must hold that the request does
    not say: ``n_frames``, ``dtype`` and, for a frame pass, ``n_weights`` and
    ``n_pixels`` (the bridge knows them from the chunk and weights it put).

    Raises
    ------
    ProtocolError
        ``bad_request`` for a reply whose members or buffers are not those of
        the reply to ``request``.
    """
    h = message.header
    kind = message.type
    if kind == "error":
        code = _str(h, "code", kind)
        handle = h.get("handle")
        return ErrorReply(
            h.get("id"),
            code,
            str(h.get("message", "")),
            int(handle) if handle is not None else None,
        )
    rid = _int(h, "id", kind)
    if isinstance(request, Hello):
        return parse_hello_reply(message)
    if isinstance(request, (Ping, Bye)):
        if kind != ("ping" if isinstance(request, Ping) else "bye"):
            raise _bad(f"the reply to {type(request).__name__.lower()} is {kind!r}", kind)
        return type(request)(rid)
    if isinstance(request, Stats):
        resident = h.get("resident_bytes")
        if not isinstance(resident, dict):
            raise _bad(f"stats: member 'resident_bytes' must be an object, got {resident!r}", kind)
        return StatsReply(
            rid,
            _int(h, "handles", kind),
            {str(k): int(v) for k, v in resident.items()},
            _int(h, "memory_budget_bytes", kind),
        )
    if isinstance(request, RunFramePass):
        return parse_frame_pass_result(
            message,
            n_frames=int(expect["n_frames"]),
            n_weights=int(expect["n_weights"]),
            n_pixels=int(expect["n_pixels"]),
            dtype=expect["dtype"],
            want_sum=request.want_sum,
            want_max=request.want_max,
        )
    if isinstance(request, RunGather):
        values = parse_gather_result(
            message,
            n_frames=int(expect["n_frames"]),
            n_indices=int(request.indices.size),
            dtype=expect["dtype"],
        )
        return GatherResult(rid, values)
    if isinstance(request, Release):
        return ReleaseResult(
            rid, tuple(_ints(h, "released", kind)), _int(h, "resident_bytes", kind)
        )
    if isinstance(request, PutWeights):
        integer = h.get("integer_weights")
        if not isinstance(integer, bool):
            raise _bad(f"result: member 'integer_weights' must be a boolean, got {integer!r}", kind)
        return PutWeightsResult(
            rid, _int(h, "handle", kind), _int(h, "resident_bytes", kind), integer
        )
    if isinstance(request, Put):
        return PutResult(rid, _int(h, "handle", kind), _int(h, "resident_bytes", kind))
    raise ProtocolError(f"no reply is defined for {request!r}")  # pragma: no cover
