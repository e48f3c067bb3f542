"""The receiving side of a live acquisition, run in its own process.

A detector sends 10^4 frames a second and more; each frame costs the
receiver a few tens of microseconds of Python (the message, the checks,
the write) around calls that release the GIL (the socket, the decoder,
``pwrite``).  In the same process as the analysis, a thread doing that
waits for the GIL each time it comes back from such a call, up to the
interpreter's switch interval (5 ms) while the analysis holds it: measured
here, ~650 frames/s instead of 10,000.  So the receiver runs in a child
process of its own (``python -m quantem_flow.streams.receiver_process``, a
fresh interpreter: safe beside a Dask client's threads, and it never runs
the user's script again, as a ``multiprocessing`` child would; see
:func:`start_receiver`):

* it connects where the user said, receives one series and keeps each
  frame in scan order: bitshuffle+LZ4 images as their chunks, others
  decoded into the preallocated raw file (:mod:`.live_chunks`), and, when
  asked, the series as HDF5 with the chunks as received (:mod:`.hdf5_keep`);
* it tells the parent over its stdout (length-prefixed pickles):
  ``("started", frame_shape, dtype, storage)`` at the first frame,
  ``("rows", rows_complete, [arrival times])`` whenever more scan rows are
  complete, and ``("end", report, error, received)`` last;
* it never decides what the frames mean; the parent's views read the file.

If the child dies without its ``end`` message, the parent's listener sees
the pipe close and reports :class:`~quantem_flow.errors.StreamReceiverLostError`
with the exit code; the frames already written stay in the file.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import ParameterError, StreamProtocolError
from ..representations.encoded import encode_frames
from .dectris_receive import Frame, SeriesReport, receive_series
from .dectris_stream import PackedImage
from .live_chunks import CHUNKS, RAW, ChunkStoreWriter, write_manifest

__all__ = ["MessagePipe", "ReceiverConfig", "run_receiver", "start_receiver"]


@dataclasses.dataclass(frozen=True)
class ReceiverConfig:
    """What the receiving process needs (picklable)."""

    endpoint: str
    protocol: str
    scan_shape: tuple[int, int]
    folder: str
    hdf5_path: str | None
    timeout_s: float
    start_timeout_s: float
    calibration: dict[str, Any] | None
    images_per_file: int = 1000


def _frames(cfg: ReceiverConfig, reports: list[SeriesReport]) -> Iterator[Frame]:
    """The stream's frames; ``reports`` receives what arrived."""
    if cfg.protocol == "dectris":
        yield from receive_series(
            cfg.endpoint,
            timeout_s=cfg.timeout_s,
            start_timeout_s=cfg.start_timeout_s,
            report=reports,
            decode=False,  # bitshuffle+LZ4 images stay as their checked chunks
        )
        return
    from .dectris_stream import StartMessage
    from .merlin_tcp import receive_merlin

    host, _, port = cfg.endpoint.removeprefix("tcp://").rpartition(":")
    if not host or not port.isdigit():
        raise ParameterError(
            f"a Merlin endpoint is 'tcp://HOST:PORT' (the readout's data socket), got "
            f"{cfg.endpoint!r}"
        )
    status: list[dict[str, Any]] = []
    seen: list[int] = []
    shape: tuple[int, int] = (0, 0)
    try:
        for frame in receive_merlin(
            host,
            int(port),
            timeout_s=cfg.timeout_s,
            connect_timeout_s=cfg.start_timeout_s,
            status=status,
        ):
            seen.append(frame.image_id)
            shape = (int(frame.data.shape[0]), int(frame.data.shape[1]))
            yield frame
    finally:
        done = status[0] if status else {"expected": None, "ended": "stopped"}
        n = int(done["expected"] or cfg.scan_shape[0] * cfg.scan_shape[1])
        start = StartMessage(0, "merlin", n, shape, (), {"protocol": "merlin"})
        got = set(seen)
        reports.append(
            SeriesReport(
                start=start,
                received=len(seen),
                missing=[i for i in range(n) if i not in got],
                ended=done["ended"] == "complete",
                reason="end" if done["ended"] == "complete" else str(done["ended"]),
            )
        )


def run_receiver(cfg: ReceiverConfig, conn: Any) -> None:
    """Receive one series into ``cfg.folder``, telling ``conn`` how far it is (the child's main)."""
    from pathlib import Path

    reports: list[SeriesReport] = []
    archive: Any = None
    fd: int | None = None
    store: ChunkStoreWriter | None = None
    frame_bytes = 0
    R, C = cfg.scan_shape
    folder = Path(cfg.folder)
    received = np.zeros(R * C, dtype=bool)
    per_row = [0] * R  # frames received per scan row
    rows_done = 0
    dtype: np.dtype[Any] | None = None
    frame_shape: tuple[int, int] | None = None
    error: BaseException | None = None
    try:
        for frame in _frames(cfg, reports):
            if dtype is None:
                frame_shape = (int(frame.data.shape[0]), int(frame.data.shape[1]))
                dtype = np.dtype(frame.data.dtype)
                frame_bytes = int(frame.data.nbytes)
                storage = "bslz4-chunks" if isinstance(frame.data, PackedImage) else "raw"
                if storage == "raw":
                    # the whole scan's size at once (sparse); each frame is written in place
                    # with pwrite, which fills the page cache without a fault per page
                    fd = os.open(folder / RAW, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.ftruncate(fd, R * C * frame_bytes)
                else:
                    store = ChunkStoreWriter(folder, R * C)
                write_manifest(
                    folder,
                    {
                        "storage": storage,
                        "scan_shape": [R, C],
                        "frame_shape": list(frame_shape),
                        "dtype": dtype.str,
                        "endpoint": cfg.endpoint,
                        "protocol": cfg.protocol,
                        "calibration": cfg.calibration,
                        "files": [CHUNKS if store is not None else RAW],
                    },
                )
                if cfg.hdf5_path is not None:
                    from .hdf5_keep import HDF5Keep

                    record: dict[str, Any] = {
                        "live": {
                            "endpoint": cfg.endpoint,
                            "protocol": cfg.protocol,
                            "scan_shape": [R, C],
                        },
                        "calibration": cfg.calibration,
                    }
                    archive = HDF5Keep(
                        Path(cfg.hdf5_path),
                        scan_shape=(R, C),
                        frame_shape=frame_shape,
                        dtype=dtype,
                        record=record,
                        images_per_file=cfg.images_per_file,
                    )
                conn.send(("started", frame_shape, dtype.str, storage))
            if frame.image_id >= R * C:
                raise StreamProtocolError(
                    f"image {frame.image_id} lies beyond the {R} x {C} scan that was given; "
                    "check scan_shape against the detector's number of images"
                )
            if tuple(frame.data.shape) != frame_shape or np.dtype(frame.data.dtype) != dtype:
                raise StreamProtocolError(
                    f"image {frame.image_id} is {frame.data.shape} {frame.data.dtype}; the "
                    f"series began with {frame_shape} {dtype}"
                )
            packed = frame.data if isinstance(frame.data, PackedImage) else None
            if store is not None:
                chunk = (  # a frame that came decoded: encoded, so the store stays uniform
                    packed.chunk
                    if packed is not None
                    else encode_frames(np.asarray(frame.data), "bitshuffle-lz4")
                )
                store.write(frame.image_id, chunk)
            else:
                assert fd is not None
                data = packed.decode() if packed is not None else np.asarray(frame.data)
                data = np.ascontiguousarray(data, dtype=dtype)
                os.pwrite(fd, data.data.cast("B"), frame.image_id * frame_bytes)
            if archive is not None:
                if frame.bslz4 is not None:  # kept as received: no second compression
                    archive.write(frame.image_id, frame.bslz4, None)
                else:
                    archive.write(
                        frame.image_id,
                        None,
                        packed.decode() if packed is not None else np.asarray(frame.data),
                    )
            received[frame.image_id] = True
            per_row[frame.image_id // C] += 1
            before = rows_done
            while rows_done < R and per_row[rows_done] == C:
                rows_done += 1
            if rows_done != before:
                if store is not None:
                    store.flush()  # the rows' chunks and index entries before the message
                now = time.time()
                conn.send(("rows", rows_done, [now] * (rows_done - before)))
    except BaseException as exc:  # sent to the parent, which re-raises it
        error = exc
    finally:
        if fd is not None:
            os.close(fd)
        if store is not None:
            store.close()
        if archive is not None:
            try:
                archive.close()
            except Exception as exc:  # a full disk while closing: reported, the raw file kept
                error = error or exc
        try:
            conn.send(
                ("end", reports[0] if reports else None, error, np.packbits(received).tobytes())
            )
        except Exception as exc:  # an error that does not pickle: its text instead
            conn.send(
                (
                    "end",
                    reports[0] if reports else None,
                    StreamProtocolError(f"{type(error).__name__}: {error}") if error else exc,
                    np.packbits(received).tobytes(),
                )
            )
        conn.close()


class MessagePipe:
    """Pickled messages over a byte stream, each prefixed by its length (8 bytes, big-endian)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def send(self, message: Any) -> None:
        """Write one message (flushed)."""
        import pickle

        body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self._stream.write(len(body).to_bytes(8, "big") + body)
        self._stream.flush()

    def recv(self) -> Any:
        """Read one message; ``EOFError`` when the other side is gone."""
        import pickle

        head = self._read(8)
        return pickle.loads(self._read(int.from_bytes(head, "big")))

    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            part = self._stream.read(n - len(out))
            if not part:
                raise EOFError("the receiving process closed its pipe")
            out += part
        return out

    def close(self) -> None:
        """Close the stream."""
        self._stream.close()


def start_receiver(cfg: ReceiverConfig) -> tuple[Any, MessagePipe]:
    """Start the receiving process; return it and the pipe its messages come on.

    It is ``python -m quantem_flow.streams.receiver_process``, not a
    ``multiprocessing`` child: a spawned child imports the parent's main
    module again, so a user's script without an ``if __name__ == "__main__":``
    guard would start its acquisition a second time inside the receiver.
    The configuration goes in on stdin, the messages come out on stdout
    (the child points its own stdout at stderr, so nothing a library prints
    mixes into them).
    """
    import pickle
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "quantem_flow.streams.receiver_process"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        close_fds=True,
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(pickle.dumps(cfg))
    process.stdin.close()
    return process, MessagePipe(process.stdout)


def _main() -> None:
    """The receiving process: its configuration on stdin, its messages on stdout."""
    import pickle
    import sys

    cfg = pickle.load(sys.stdin.buffer)
    messages = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the messages
    run_receiver(cfg, MessagePipe(messages))


if __name__ == "__main__":
    _main()
