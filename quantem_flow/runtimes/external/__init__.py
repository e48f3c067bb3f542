"""External workers: the ``qf-worker/1`` protocol, its transports and the bridge runtime.

See ``docs/protocol.md`` (the wire protocol) and ``docs/external-workers.md``
(the bridge, crash handling and re-placement).
"""

from __future__ import annotations

from .protocol import PROTOCOL, FrameDecoder, HelloInfo, Message, decode, encode

__all__ = ["PROTOCOL", "FrameDecoder", "HelloInfo", "Message", "decode", "encode"]
