"""A DECTRIS stream v2 simulator: replays frames as a detector's PUSH socket sends them.

:class:`DectrisSimulator` binds a ZeroMQ PUSH socket (127.0.0.1 unless told
otherwise), and on :meth:`~DectrisSimulator.start` sends a start message,
one image message per frame in scan order (bitshuffle+LZ4, LZ4 or plain),
at a set rate or as fast as the consumer takes them, and an end message,
from a thread.  Faults for tests: stop after ``stop_after`` images without
an end message, skip image numbers (``skip``), send a damaged image
(``corrupt``).  PUSH blocks when the consumer's queue is full, so the
simulator never drops a frame on its own; a detector that cannot wait
drops, which ``skip`` imitates.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..errors import ParameterError
from .dectris_stream import encode_end, encode_image, encode_start
from .replay import frame_supply

__all__ = ["DectrisSimulator"]


class DectrisSimulator:
    """Serve frames as a DECTRIS stream v2.

    Parameters
    ----------
    frames
        ``(n, k_r, k_c)`` array, or a callable ``rows(start, stop) -> frames``
        with ``n_frames`` and ``frame_shape`` given, read piece by piece.
    endpoint
        Where to bind: ``"tcp://127.0.0.1:0"`` (the default) takes a free
        port; :attr:`endpoint` says which.
    rate_hz
        Frames per second to send at; ``None`` sends as fast as the consumer
        takes them.
    compression
        ``"bslz4"`` (the default, as ARINA sends), ``"lz4"`` or ``None``.
    n_frames, frame_shape
        With a callable ``frames``.
    stop_after
        Send only this many images and no end message (a stream cut mid-scan).
    skip
        Image numbers not sent (frames a detector dropped).
    corrupt
        Image numbers sent with damaged compressed data.
    """

    def __init__(
        self,
        frames: np.ndarray | Callable[[int, int], np.ndarray],
        *,
        endpoint: str = "tcp://127.0.0.1:0",
        rate_hz: float | None = None,
        compression: str | None = "bslz4",
        n_frames: int | None = None,
        frame_shape: tuple[int, int] | None = None,
        stop_after: int | None = None,
        skip: Iterable[int] = (),
        corrupt: Iterable[int] = (),
    ) -> None:
        import zmq

        supply = frame_supply(
            frames,
            n_frames=n_frames,
            frame_shape=frame_shape,
            # each image carries its own frame's dtype; the supply's is not used here
            dtype=np.asarray(frames).dtype if not callable(frames) else np.uint16,
        )
        self._rows = supply.rows
        self.n_frames = supply.n_frames
        self.frame_shape = supply.frame_shape
        if rate_hz is not None and not rate_hz > 0:
            raise ParameterError(f"rate_hz must be > 0 or None, got {rate_hz!r}")
        self.rate_hz = rate_hz
        self.compression = compression
        self.stop_after = stop_after
        self.skip = frozenset(int(i) for i in skip)
        self.corrupt = frozenset(int(i) for i in corrupt)
        self.series_id = 1
        self.series_unique_id = uuid.uuid4().hex
        self._context: Any = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.LINGER, 2000)
        if endpoint.endswith(":0"):
            port = self._socket.bind_to_random_port(endpoint.rsplit(":", 1)[0])
            self.endpoint = f"{endpoint.rsplit(':', 1)[0]}:{port}"
        else:
            self._socket.bind(endpoint)
            self.endpoint = endpoint
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.sent = 0
        self.error: BaseException | None = None
        #: Longest wait for the consumer to take a message before the run gives up.
        self.send_timeout_s = 30.0

    def start(self) -> DectrisSimulator:
        """Send the series from a background thread; returns at once."""
        self._thread = threading.Thread(target=self._run, name="qf-dectris-sim", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout_s: float = 60.0) -> None:
        """Wait for the series to be sent; re-raise what stopped the sending thread, if anything."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.error is not None:
            raise self.error

    def _send(self, payload: bytes) -> None:
        """Send when the consumer has room; give up on ``close()`` or after ``send_timeout_s``."""
        import zmq

        deadline = time.monotonic() + self.send_timeout_s
        while not self._stop.is_set():
            if self._socket.poll(100, zmq.POLLOUT):
                self._socket.send(payload, copy=False)
                return
            if time.monotonic() > deadline:
                from ..errors import StreamTimeoutError

                raise StreamTimeoutError(
                    f"no consumer took a message from {self.endpoint} for "
                    f"{self.send_timeout_s:g} s; the simulator stopped after {self.sent} images"
                )
        raise _StoppedError

    def _run(self) -> None:
        try:
            self._send(
                encode_start(
                    series_id=self.series_id,
                    series_unique_id=self.series_unique_id,
                    number_of_images=self.n_frames,
                    image_shape=self.frame_shape,
                    extra={"detector_description": "quantem-flow simulator (DECTRIS stream v2)"},
                )
            )
            t0 = time.perf_counter()  # paced from the moment a consumer took the start
            step = 256
            limit = (
                self.n_frames if self.stop_after is None else min(self.stop_after, self.n_frames)
            )
            for a in range(0, limit, step):
                block = np.asarray(self._rows(a, min(limit, a + step)))
                for k, frame in enumerate(block):
                    i = a + k
                    if i in self.skip:
                        continue
                    if self.rate_hz is not None:
                        wait = t0 + i / self.rate_hz - time.perf_counter()
                        if wait > 0:
                            time.sleep(wait)
                    message = encode_image(
                        frame, series_id=self.series_id, image_id=i, compression=self.compression
                    )
                    if i in self.corrupt:
                        message = _damaged(message)
                    self._send(message)
                    self.sent += 1
            if self.stop_after is None:
                self._send(
                    encode_end(series_id=self.series_id, series_unique_id=self.series_unique_id)
                )
        except _StoppedError:
            pass
        except BaseException as exc:  # reported to whoever joins
            self.error = exc
        finally:
            self._socket.close()  # by the thread that used it last (ZeroMQ sockets are not shared)

    def close(self) -> None:
        """Stop sending and release the socket (the sending thread closes its own)."""
        self._stop.set()
        if self._thread is None:
            self._socket.close(linger=0)
        else:
            self._thread.join(10.0)

    def __enter__(self) -> DectrisSimulator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
        if self.error is not None and exc[0] is None:
            raise self.error


class _StoppedError(Exception):
    """The simulator was closed while sending."""


def _damaged(message: bytes) -> bytes:
    """The image message with its frame's compressed header (or plain bytes) damaged."""
    import cbor2

    decoded = cbor2.loads(message)
    data = {}
    for name, item in decoded["data"].items():
        dims, typed = item.value
        body = typed.value
        if isinstance(body, cbor2.CBORTag):  # compressed: flip a bit of the declared size
            algorithm, modifier, payload = body.value
            raw = bytearray(payload)
            raw[4] ^= 0x40
            body = cbor2.CBORTag(body.tag, [algorithm, modifier, bytes(raw)])
        else:  # plain: one byte short
            body = bytes(body[:-1])
        data[name] = cbor2.CBORTag(item.tag, [list(dims), cbor2.CBORTag(typed.tag, body)])
    return bytes(cbor2.dumps({**decoded, "data": data}))
