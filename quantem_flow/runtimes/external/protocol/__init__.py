"""The ``qf-worker/1`` wire protocol: frames, canonical JSON and messages (no I/O).

Everything here is pure: bytes in, :class:`Message` out and back, with every
rule of ``docs/protocol.md`` checked.  A violation raises
:class:`~quantem_flow.errors.ProtocolError` whose ``code`` is the protocol's
error code (``frame``, ``truncated``, ``too_large``, ``bad_request``,
``version``, ``unsupported``).  Transports (:mod:`..transport`) move the
frames; the session (:mod:`..session`) pairs requests with replies.

A frame is ``"QFW1"``, ``header_length`` (u32 LE), ``body_length`` (u64 LE),
the canonical-JSON header, zero padding to 8 bytes, then each buffer padded
with zeros to 8 bytes.  Buffers are bytes-like objects; encoding returns the
pieces without copying the buffers (:func:`encode_pieces`), decoding returns
memoryviews into one allocation per frame.

The package: :mod:`.framing` (the prefix, canonical JSON, buffers, the
incremental decoder) and :mod:`.messages` (every request and reply, built
and checked).  Every public name of the former single module is here.
"""

from __future__ import annotations

from .framing import (
    ACCUMULATIONS,
    DTYPES,
    ERROR_CODES,
    FIRST_BODY_ALLOCATION,
    MAGIC,
    MAX_HEADER_BYTES,
    MAX_INT,
    MESSAGE_TYPES,
    PREFIX_BYTES,
    PROTOCOL,
    REQUEST_TYPES,
    STORAGE_SCHEMAS,
    FrameDecoder,
    Message,
    canonical_json,
    decode,
    encode,
    encode_pieces,
    pad8,
)
from .messages import (
    FramePassOutputs,
    HelloInfo,
    bye,
    error,
    frame_pass_result,
    gather_result,
    hello_reply,
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
    "ACCUMULATIONS",
    "DTYPES",
    "ERROR_CODES",
    "FIRST_BODY_ALLOCATION",
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
