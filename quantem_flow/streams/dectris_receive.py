"""Receive a DECTRIS stream v2 series: every wait has a deadline, every gap is named.

:func:`receive_series` connects a ZeroMQ PULL socket to the detector (or
simulator) where the user says, waits for a start message, and yields each
image's frame in the order the detector sent them, then a
:class:`SeriesReport` saying what arrived: the images received, the image
numbers missing (a detector that dropped frames, a stream cut mid-scan),
whether the end message came, and why the series ended.  Nothing is silent:
a missing image is reported by number, and a series that stopped without
its end message is marked incomplete.  A message that breaks the protocol
raises :class:`~quantem_flow.errors.StreamProtocolError`; silence longer
than the deadline ends the series (incomplete, ``"timeout"``) or, before
the start message, raises :class:`~quantem_flow.errors.StreamTimeoutError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import ParameterError, StreamProtocolError, StreamTimeoutError
from .dectris_stream import EndMessage, PackedImage, StartMessage, decode_message

__all__ = ["Frame", "SeriesReport", "receive_series"]


@dataclasses.dataclass(frozen=True)
class Frame:
    """One received image: its number in the series and its frame."""

    image_id: int
    #: The frame, or its checked chunk not decoded (``receive_series(decode=False)``).
    data: np.ndarray | PackedImage
    #: The bitshuffle+LZ4 chunk as the detector sent it, when it did (kept as is).
    bslz4: bytes | None = None


@dataclasses.dataclass
class SeriesReport:
    """What a series delivered.

    Attributes
    ----------
    start
        The start message.
    received
        Images received.
    missing
        Image numbers never received, in order (the detector dropped them,
        or the stream stopped first).
    ended
        Whether the end message came.
    reason
        ``"end"``, ``"timeout"`` (silence past the deadline) or ``"stopped"``
        (the consumer stopped early).
    """

    start: StartMessage
    received: int = 0
    missing: list[int] = dataclasses.field(default_factory=list)
    ended: bool = False
    reason: str = ""

    @property
    def complete(self) -> bool:
        """Every image of the series arrived and the series ended."""
        return self.ended and not self.missing and self.received == self.start.number_of_images

    def describe(self) -> str:
        """One line: complete, or what is missing and why."""
        n = self.start.number_of_images
        if self.complete:
            return f"complete: {n} of {n} images"
        gaps = _ranges(self.missing)
        return (
            f"INCOMPLETE: {self.received} of {n} images received"
            + (f"; missing images {gaps}" if self.missing else "")
            + ("" if self.ended else f"; no end message ({self.reason})")
        )


def _ranges(ids: list[int], limit: int = 8) -> str:
    """``[3, 4, 5, 9]`` as ``"3-5, 9"`` (the first ``limit`` runs)."""
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    text = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs[:limit])
    return text + (f" and {len(runs) - limit} more runs" if len(runs) > limit else "")


def receive_series(
    endpoint: str,
    *,
    timeout_s: float = 10.0,
    start_timeout_s: float | None = None,
    high_water_mark: int = 4096,
    channel: str | None = None,
    report: list[SeriesReport] | None = None,
    decode: bool = True,
) -> Iterator[Frame]:
    """Yield the frames of one series from a DECTRIS stream v2 endpoint.

    Parameters
    ----------
    endpoint
        ``"tcp://host:port"`` of the detector's (or simulator's) PUSH socket.
    timeout_s
        Longest silence between messages once the series started.
    start_timeout_s
        Longest wait for the start message (default ``timeout_s``).
    high_water_mark
        Messages the socket queues before the sender must wait: the bound
        on what a slow consumer buffers.
    channel
        Which channel's frame to take (default the first the start message
        lists).
    report
        A list that receives the :class:`SeriesReport` when the series ends
        (also when the consumer stops early).
    decode
        ``False`` yields images sent bitshuffle+LZ4 as their checked chunks
        (:class:`~quantem_flow.streams.dectris_stream.PackedImage`), not decoded.

    Raises
    ------
    StreamTimeoutError
        No start message within ``start_timeout_s``.
    StreamProtocolError
        A message breaks the protocol, an image's shape differs from the
        start message's, images come from another series, or an image
        number repeats or lies outside the series.
    """
    import zmq

    if not timeout_s > 0:
        raise ParameterError(f"timeout_s must be > 0, got {timeout_s!r}")
    context: Any = zmq.Context.instance()
    socket = context.socket(zmq.PULL)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVHWM, int(high_water_mark))
    socket.connect(endpoint)
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)

    def receive(deadline_s: float) -> bytes | None:
        if not poller.poll(int(deadline_s * 1000)):
            return None
        return bytes(socket.recv(copy=True))

    state: SeriesReport | None = None
    try:
        first = receive(start_timeout_s if start_timeout_s is not None else timeout_s)
        if first is None:
            raise StreamTimeoutError(
                f"no DECTRIS stream start message from {endpoint} within "
                f"{start_timeout_s or timeout_s:g} s; is the detector armed and its stream "
                "enabled (SIMPLON stream/config: mode enabled, format cbor)?"
            )
        start = decode_message(first)
        if not isinstance(start, StartMessage):
            raise StreamProtocolError(
                f"DECTRIS stream v2: the series from {endpoint} must begin with a start message, "
                f"got an {type(start).__name__.removesuffix('Message').lower()} message (the "
                "client connected after the arm: re-arm the detector)"
            )
        state = SeriesReport(start=start)
        name = channel or (start.channels[0] if start.channels else None)
        seen = np.zeros(start.number_of_images, dtype=bool)
        while True:
            payload = receive(timeout_s)
            if payload is None:
                state.reason = "timeout"
                break
            message = decode_message(payload, decode=decode)
            if isinstance(message, EndMessage):
                state.ended = True
                state.reason = "end"
                break
            if isinstance(message, StartMessage):
                raise StreamProtocolError(
                    f"DECTRIS stream v2: a second start message (series {message.series_id}) "
                    f"came before series {start.series_id} ended"
                )
            if message.series_id != start.series_id:
                raise StreamProtocolError(
                    f"DECTRIS stream v2: image {message.image_id} belongs to series "
                    f"{message.series_id}, expected series {start.series_id}"
                )
            i = message.image_id
            if not 0 <= i < start.number_of_images or seen[i]:
                what = "repeats" if 0 <= i < start.number_of_images else "is outside"
                raise StreamProtocolError(
                    f"DECTRIS stream v2: image number {i} {what} the series of "
                    f"{start.number_of_images} images"
                )
            key = name if name is not None else next(iter(message.data))
            if key not in message.data:
                raise StreamProtocolError(
                    f"DECTRIS stream v2: image {i} has channels {sorted(message.data)}, not {key!r}"
                )
            frame = message.data[key]
            if frame.shape != start.image_shape:
                raise StreamProtocolError(
                    f"DECTRIS stream v2: image {i} is {frame.shape}, the start message said "
                    f"{start.image_shape}"
                )
            seen[i] = True
            state.received += 1
            yield Frame(image_id=i, data=frame, bslz4=message.bslz4.get(key))
        state.missing = [int(i) for i in np.flatnonzero(~seen)]
    except GeneratorExit:
        if state is not None:
            state.reason = "stopped"
        raise
    finally:
        socket.close(linger=0)
        if state is not None and report is not None:
            if not state.reason:
                state.reason = "stopped"
            report.append(state)
