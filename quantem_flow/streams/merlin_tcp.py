"""Quantum Detectors Merlin over TCP: the acquisition header, then framed frames.

The Merlin readout sends each message on its data socket as ``MPX,`` then
10 decimal digits, a comma, and the payload; the digits count the bytes
after them, the comma included (the payload's length + 1).  An earlier
version of this module counted the payload alone: LiberTEM-live's receiver,
which runs against real Merlins, then stopped one byte short at the second
message (it found a newline where ``MPX,`` belonged), and so would a Merlin's own
framing against this receiver.  The
first payload is the acquisition header (the text of a ``.hdr`` file,
``HDR,`` ... ``End``); each following payload is one frame exactly as a
``.mib`` file stores it: its ``MQ1`` header, then the pixels (processed
``U08``/``U16``/``U32`` big-endian, or raw ``R64`` counters), so the frame
is parsed and decoded by the ``.mib`` reader's own functions
(:mod:`quantem_flow.io.merlin`).  A 10-digit length of anything but digits, a payload that is not a
header or a frame, or a frame whose shape changes mid-acquisition raises
:class:`~quantem_flow.errors.StreamProtocolError`.

:func:`receive_merlin` connects where the user says and yields frames with a
deadline on every read; :class:`MerlinSimulator` serves frames on a loopback
listening socket (processed mode, 8/16/32-bit) for tests and for users
without a detector.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError, ParameterError, StreamProtocolError, StreamTimeoutError
from .dectris_receive import Frame
from .replay import frame_supply

__all__ = ["MerlinSimulator", "encode_mpx", "mq1_header", "receive_merlin"]

_PREFIX = 15  # "MPX," + 10 digits + ","
_DEPTH_OF_DTYPE = {"u1": "U08", "u2": "U16", "u4": "U32"}


def encode_mpx(payload: bytes) -> bytes:
    """One message of the Merlin data socket (the length counts the comma before the payload)."""
    return b"MPX," + f"{len(payload) + 1:010d}".encode() + b"," + payload


def mq1_header(
    sequence: int, frame_shape: tuple[int, int], dtype: Any, *, quad: bool = False
) -> bytes:
    """An ``MQ1`` processed-mode frame header, padded to 384 (one chip) or 768 (quad) bytes."""
    depth = _DEPTH_OF_DTYPE[np.dtype(dtype).str[1:]]
    size = 768 if quad else 384
    chips, layout = (4, "   2x2") if quad else (1, "   1x1")
    rows, cols = frame_shape
    fields = [
        "MQ1", f"{sequence:06d}", f"{size:05d}", f"{chips:02d}", f"{cols:04d}", f"{rows:04d}",
        depth, layout, "01" if not quad else "0F", "2026-12-05 00:00:00.000000",
        "0.001000", "0", "0", "0", "1.0E+1", "0.0E+0", "0.0E+0", "0.0E+0", "0.0E+0",
        "0.0E+0", "0.0E+0", "0.0E+0", "3RX", "12",
    ]  # fmt: skip
    text = ",".join(fields).encode("ascii")
    return text + b" " * (size - len(text))


class _QuietError(StreamTimeoutError):
    """Silence (or a close) between messages: the readout stopped sending."""


def _recv_into(sock: socket.socket, view: memoryview, deadline_s: float, what: str) -> None:
    """Fill ``view`` from the socket, with a deadline on the silence.

    Nothing is allocated per message: a 131 KB buffer made fresh for each
    frame cost page faults.
    """
    n = len(view)
    got = 0
    sock.settimeout(deadline_s)
    while got < n:
        try:
            k = sock.recv_into(view[got:], min(n - got, 1 << 20))
        except TimeoutError:
            if not got and what == "reading a message prefix":
                raise _QuietError(f"the Merlin stream sent nothing for {deadline_s:g} s") from None
            raise StreamTimeoutError(
                f"the Merlin stream sent nothing for {deadline_s:g} s while {what} "
                f"({got} of {n} bytes)"
            ) from None
        if not k:
            if not got and what == "reading a message prefix":
                raise _QuietError("the Merlin stream closed between messages")
            raise StreamProtocolError(
                f"Merlin TCP: the stream closed while {what} ({got} of {n} bytes)"
            )
        got += k


class _Messages:
    """Reads MPX messages into one reused buffer (each valid until the next)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._prefix = bytearray(_PREFIX)
        self._buffer = bytearray(1 << 16)

    def next(self, deadline_s: float) -> memoryview:
        _recv_into(self._sock, memoryview(self._prefix), deadline_s, "reading a message prefix")
        prefix = bytes(self._prefix)
        digits = prefix[4:14]
        if prefix[:4] != b"MPX," or prefix[14:15] != b"," or not digits.isdigit():
            raise StreamProtocolError(
                f"Merlin TCP: expected a message prefix 'MPX,<10 digits>,', got {prefix!r}"
            )
        n = int(digits) - 1  # the count includes the comma already read
        if n < 0:
            raise StreamProtocolError(
                f"Merlin TCP: a message prefix counts {int(digits)} bytes; it counts the comma "
                "after it, so at least 1"
            )
        if n > len(self._buffer):
            self._buffer = bytearray(n)
        view = memoryview(self._buffer)[:n]
        _recv_into(self._sock, view, deadline_s, "reading a message")
        return view


def _same_layout(head: bytes, first: list[bytes]) -> int | None:
    """The frame's sequence number when its layout fields equal the first frame's, else None.

    The MQ1 fields after the sequence number (data offset, chips, width,
    height, depth, sensor layout) say how to read the pixels; when they equal
    the first frame's, that frame's full parse holds (a full parse each frame
    cost a third of the receiver's time at 10 kHz).
    """
    parts = head.split(b",", 8)
    if len(parts) < 9 or parts[0] != b"MQ1" or parts[2:8] != first:
        return None
    try:
        return int(parts[1])
    except ValueError:
        return None


def receive_merlin(
    host: str,
    port: int,
    *,
    timeout_s: float = 10.0,
    connect_timeout_s: float = 10.0,
    header: list[dict[str, str]] | None = None,
    status: list[dict[str, Any]] | None = None,
) -> Iterator[Frame]:
    """Yield the frames of a Merlin acquisition from its TCP data socket.

    Parameters
    ----------
    host, port
        The Merlin readout's data socket (connected to, never bound).
    timeout_s
        Longest silence between bytes once connected; a silence at a message
        boundary after frames ends the acquisition (the readout stopped).
    connect_timeout_s
        Longest wait to connect.
    header
        A list that receives the acquisition header's fields.
    status
        A list that receives, when the acquisition ends, ``expected`` (the
        header's "Frames in Acquisition"), ``received`` and ``ended``:
        ``"complete"``, or ``"timeout"``/``"closed"`` when the readout went
        quiet first (the acquisition is then incomplete, and says so).

    Raises
    ------
    StreamTimeoutError
        No connection, or silence inside a message.
    StreamProtocolError
        A malformed prefix, a first message that is not the acquisition
        header, or a frame that is not an ``MQ1`` frame of the first frame's
        layout.
    """
    from ..io.merlin import (
        MIB_DTYPES,
        RAW_DEPTHS,
        decode_raw_frames,
        parse_hdr_text,
        parse_mib_header,
        raw_frame_layout,
        raw_payload_bytes,
    )

    try:
        sock = socket.create_connection((host, int(port)), timeout=connect_timeout_s)
    except OSError as exc:
        raise StreamTimeoutError(
            f"could not connect to the Merlin data socket {host}:{port} ({exc}); is the "
            "readout running and listening there?"
        ) from exc
    where = Path(f"merlin://{host}:{port}")
    try:
        messages = _Messages(sock)
        first = bytes(messages.next(timeout_s))
        if not first.startswith(b"HDR,"):
            raise StreamProtocolError(
                f"Merlin TCP: the first message must be the acquisition header ('HDR,'), got "
                f"{first[:16]!r}"
            )
        fields = parse_hdr_text(first.decode("ascii", errors="replace"))
        if header is not None:
            header.append(fields)
        layout: tuple[Any, ...] | None = None
        head: dict[str, Any] | None = None
        layout_fields: list[bytes] = []
        declared = fields.get("Frames in Acquisition (Number)", "").split()
        expected = int(declared[0]) if declared and declared[0].isdigit() else None
        i = 0
        ended = "complete"
        while expected is None or i < expected:
            try:
                payload = messages.next(timeout_s)
            except _QuietError as exc:
                if expected is None and i > 0:
                    break  # no count declared: quiet after frames is the end
                ended = "closed" if "closed" in str(exc) else "timeout"
                break
            start = bytes(payload[:64])
            sequence = None if head is None else _same_layout(start, layout_fields)
            if sequence is None:
                try:
                    head = parse_mib_header(bytes(payload[:1024]), where)
                except FormatError as exc:
                    raise StreamProtocolError(f"Merlin TCP: frame {i}: {exc}") from exc
                layout_fields = start.split(b",", 8)[2:8]
                sequence = int(head["sequence_number"])
            assert head is not None
            size = int(head["header_bytes"])
            rows, cols = int(head["height"]), int(head["width"])
            this = (head["pixel_depth"], rows, cols, head.get("counter_depth"), size)
            if layout is None:
                layout = this
            elif this != layout:
                raise StreamProtocolError(
                    f"Merlin TCP: frame {i} has layout {this}, the first frame had {layout}"
                )
            body = np.frombuffer(payload, dtype=np.uint8, offset=size)
            if head["pixel_depth"] == "R64":
                depth = int(head["counter_depth"])
                try:  # single chips and 2x2 quads, as the .mib reader decodes them
                    rows, cols, quad = raw_frame_layout(
                        head, depth, rows, cols, f"Merlin TCP frame {i}"
                    )
                except FormatError as exc:
                    raise StreamProtocolError(str(exc)) from exc
                if body.size != raw_payload_bytes(depth, rows * cols):
                    raise StreamProtocolError(
                        f"Merlin TCP: frame {i} carries {body.size} raw bytes, expected "
                        f"{raw_payload_bytes(depth, rows * cols)} for {rows} x {cols} at "
                        f"{depth} bit"
                    )
                out = np.empty((1, rows, cols), dtype=RAW_DEPTHS[depth][1])
                frame = decode_raw_frames(body[None, :], depth, out=out, quad=quad)[0]
            else:
                dtype = np.dtype(MIB_DTYPES[head["pixel_depth"]])
                if body.size != rows * cols * dtype.itemsize:
                    raise StreamProtocolError(
                        f"Merlin TCP: frame {i} carries {body.size} pixel bytes, its header says "
                        f"{rows} x {cols} {head['pixel_depth']} "
                        f"({rows * cols * dtype.itemsize})"
                    )
                frame = body.view(dtype).reshape(rows, cols).astype(dtype.newbyteorder("="))
            yield Frame(image_id=sequence - 1, data=frame)
            i += 1
        if status is not None:
            status.append({"expected": expected, "received": i, "ended": ended})
    finally:
        sock.close()


class MerlinSimulator:
    """Serve frames as a Merlin readout's TCP data socket (processed mode).

    Parameters
    ----------
    frames
        ``(n, k_r, k_c)`` ``uint8``/``uint16``/``uint32`` array, or a callable
        ``rows(start, stop)`` with ``n_frames``, ``frame_shape`` and ``dtype``.
    host, port
        Where to listen: 127.0.0.1 and any free port by default (:attr:`port`).
    rate_hz
        Frames per second; ``None``: as fast as the consumer reads.
    """

    def __init__(
        self,
        frames: np.ndarray | Callable[[int, int], np.ndarray],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        rate_hz: float | None = None,
        n_frames: int | None = None,
        frame_shape: tuple[int, int] | None = None,
        dtype: Any = None,
        acquisition_header: dict[str, str] | None = None,
    ) -> None:
        supply = frame_supply(frames, n_frames=n_frames, frame_shape=frame_shape, dtype=dtype)
        self._rows = supply.rows
        self.n_frames, self.frame_shape, self.dtype = (
            supply.n_frames,
            supply.frame_shape,
            supply.dtype,
        )
        if self.dtype.str[1:] not in _DEPTH_OF_DTYPE:
            raise ParameterError(f"Merlin frames are uint8, uint16 or uint32, not {self.dtype}")
        self.rate_hz = rate_hz
        self.header_fields = {
            "Frames in Acquisition (Number)": str(self.n_frames),
            "Frames per Trigger (Number)": str(self.n_frames),
            "Counter Depth (number)": str({1: 6, 2: 12, 4: 24}[self.dtype.itemsize]),
            **(acquisition_header or {}),
        }
        self._server = socket.create_server((host, int(port)))
        self.host, self.port = self._server.getsockname()[:2]
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.error: BaseException | None = None

    def start(self) -> MerlinSimulator:
        """Accept one consumer and send the acquisition, from a background thread."""
        self._thread = threading.Thread(target=self._run, name="qf-merlin-sim", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._server.settimeout(30.0)
            conn, _ = self._server.accept()
            with conn:
                text = "HDR,\t\n" + "".join(f"{k}:\t{v}\n" for k, v in self.header_fields.items())
                conn.sendall(encode_mpx((text + "End\t\n").encode("ascii")))
                t0 = time.perf_counter()
                big = self.dtype.newbyteorder(">")
                for a in range(0, self.n_frames, 256):
                    block = np.asarray(self._rows(a, min(self.n_frames, a + 256)))
                    for k, frame in enumerate(block):
                        i = a + k
                        if self.rate_hz is not None:
                            wait = t0 + i / self.rate_hz - time.perf_counter()
                            if wait > 0:
                                time.sleep(wait)
                        payload = (
                            mq1_header(i + 1, self.frame_shape, self.dtype)
                            + np.ascontiguousarray(frame, dtype=big).tobytes()
                        )
                        conn.sendall(encode_mpx(payload))
                        self.sent += 1
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self, timeout_s: float = 60.0) -> None:
        """Wait for the acquisition to be sent; re-raise what stopped it."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Stop listening."""
        self._server.close()
        if self._thread is not None:
            self._thread.join(10.0)

    def __enter__(self) -> MerlinSimulator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
