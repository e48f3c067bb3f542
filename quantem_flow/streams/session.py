"""A live acquisition: a stream received into a file in scan order, queryable while it runs.

:func:`live` connects to a detector's stream where the user says and
receives one series in a process of its own into a raw file (frames in scan
order, native byte order: the data are kept as they come, without a second
pass).  :class:`LiveAcquisition` then gives, at any moment, a dataset over
the scan rows that are complete so far (:meth:`LiveAcquisition.dataset_so_far`),
on which every operator and ``qf.compute`` run unchanged; partial results
carry the rows they cover in their provenance.  When the series ends,
:meth:`LiveAcquisition.dataset` is the whole scan, read from the same file,
so results equal the offline pass over the same frames bit for bit (the
reader returns the same bytes in the same chunks).

Nothing is silent: frames the detector never sent are named in the report;
the full dataset of an incomplete series is refused unless
``allow_incomplete=True``, and then its missing frames read as zero and
every result says so in its provenance notes.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    ParameterError,
    StreamProtocolError,
    StreamReceiverLostError,
    StreamTimeoutError,
)
from .dectris_receive import SeriesReport
from .receiver_process import ReceiverConfig, start_receiver
from .waiting import wait_until

__all__ = ["LiveAcquisition", "live"]


class LiveAcquisition:
    """One series received from a stream into a raw file; see :func:`live`."""

    def __init__(
        self,
        endpoint: str,
        *,
        scan_shape: Sequence[int],
        directory: str | Path | None = None,
        timeout_s: float = 10.0,
        start_timeout_s: float = 30.0,
        calibration: Any = None,
        chunk_rows: int | None = None,
        protocol: str = "dectris",
        keep_hdf5: str | Path | None = None,
        images_per_file: int = 1000,
    ) -> None:
        if protocol not in ("dectris", "merlin"):
            raise ParameterError(f"protocol must be 'dectris' or 'merlin', got {protocol!r}")
        self.protocol = protocol
        R, C = (int(scan_shape[0]), int(scan_shape[1]))
        if R < 1 or C < 1:
            raise ParameterError(f"scan_shape must be (rows, cols) >= 1, got {scan_shape!r}")
        self.endpoint = endpoint
        self.scan_shape = (R, C)
        self.calibration = calibration
        self.chunk_rows = chunk_rows
        self._tmp = (
            None if directory is not None else tempfile.TemporaryDirectory(prefix="qf-live-")
        )
        folder = Path(directory if directory is not None else self._tmp.name)  # type: ignore[union-attr]
        folder.mkdir(parents=True, exist_ok=True)
        self.directory = folder
        self.storage: str | None = None  # "bslz4-chunks" or "raw", at the first frame
        self.hdf5_path = None if keep_hdf5 is None else Path(keep_hdf5).expanduser().absolute()
        if self.hdf5_path is not None:
            from ..errors import OverwriteError
            from .hdf5_keep import kept_files

            if int(images_per_file) < 1:
                raise ParameterError(f"images_per_file must be >= 1, got {images_per_file!r}")
            for existing in kept_files(self.hdf5_path, R * C, int(images_per_file)):
                if existing.exists():
                    raise OverwriteError(
                        f"{str(existing)!r} exists; choose another keep_hdf5 path (a live "
                        "series never replaces a file)"
                    )
        self._lock = threading.Condition()
        self._received = np.zeros(R * C, dtype=bool)  # filled in from the receiver's report
        self._rows_done = 0
        self._row_time = np.full(R, np.nan)  # time.time() each row became complete
        self.report: SeriesReport | None = None
        self.error: BaseException | None = None
        self.frame_shape: tuple[int, int] | None = None
        self.dtype: np.dtype[Any] | None = None
        self._finished = False
        self._started = threading.Event()
        self._timeout_s = float(timeout_s)
        self._start_timeout_s = float(start_timeout_s)
        cal = calibration
        config = ReceiverConfig(
            endpoint=endpoint,
            protocol=protocol,
            scan_shape=(R, C),
            folder=str(folder),
            hdf5_path=None if self.hdf5_path is None else str(self.hdf5_path),
            timeout_s=self._timeout_s,
            start_timeout_s=self._start_timeout_s,
            calibration=None
            if cal is None
            else (cal.to_dict() if hasattr(cal, "to_dict") else dict(cal)),
            images_per_file=int(images_per_file),
        )
        # the receiver is a process of its own: as a thread here it would wait for the GIL
        # after every socket read, decode and write (receiver_process.py says how much)
        self._process, self._conn = start_receiver(config)
        self._listener = threading.Thread(target=self._listen, name="qf-live", daemon=True)
        self._listener.start()
        self._finalizer = weakref.finalize(self, _stop_process, self._process)

    # -- receiving (in the child process; here its messages) --------------------------------
    def _listen(self) -> None:
        R, C = self.scan_shape
        try:
            while True:
                message = self._conn.recv()
                kind = message[0]
                with self._lock:
                    if kind == "started":
                        self.frame_shape = (int(message[1][0]), int(message[1][1]))
                        self.dtype = np.dtype(message[2])
                        self.storage = str(message[3])
                        self._started.set()
                    elif kind == "rows":
                        for t in message[2]:
                            self._row_time[self._rows_done] = t
                            self._rows_done += 1
                    elif kind == "end":
                        self.report, self.error = message[1], message[2]
                        bits = np.frombuffer(message[3], dtype=np.uint8)
                        self._received = np.unpackbits(bits)[: R * C].astype(bool)
                        self._finished = True
                    self._lock.notify_all()
                if kind == "end":
                    return
        except (EOFError, OSError):
            with contextlib.suppress(Exception):  # still running: its code stays unknown
                self._process.wait(5.0)
            with self._lock:
                if not self._finished:
                    self.error = StreamReceiverLostError(
                        f"the process receiving {self.endpoint} ended without its report (exit "
                        f"code {self._process.returncode}) after {self._rows_done} complete scan "
                        f"rows; the frames it wrote are kept in {str(self.directory)!r}"
                    )
                    self._finished = True
        finally:
            with self._lock:
                self._started.set()
                self._lock.notify_all()
            self._conn.close()

    # -- what has arrived -----------------------------------------------------------------
    @property
    def rows_complete(self) -> int:
        """Scan rows whose every frame has arrived, from the top (a prefix of the scan)."""
        with self._lock:
            return self._rows_done

    def wait_started(self, *, timeout_s: float | None = None) -> tuple[tuple[int, int], Any]:
        """Wait for the series' first frame; return its frame shape and dtype.

        Raises
        ------
        StreamTimeoutError
            No frame within ``timeout_s`` (default: the start deadline given
            to :func:`live`).
        StreamProtocolError, StreamTimeoutError
            What stopped the series before its first frame.
        """
        wait = self._start_timeout_s + 1.0 if timeout_s is None else float(timeout_s)
        if not self._started.wait(wait):
            raise StreamTimeoutError(
                f"no frame from {self.endpoint} within {wait:g} s; is the detector (or "
                "`quantem-flow simulate`) sending to that address?"
            )
        if self.frame_shape is None or self.dtype is None:
            if self.error is not None:
                raise self.error
            raise StreamTimeoutError(
                f"the series from {self.endpoint} ended before its first frame"
            )
        return self.frame_shape, self.dtype

    def row_arrival_time(self, row: int) -> float | None:
        """Wall-clock time (``time.time()``) scan row ``row`` became complete, or ``None``."""
        with self._lock:
            t = float(self._row_time[int(row)])
        return None if np.isnan(t) else t

    def wait_rows(self, rows: int, *, timeout_s: float = 30.0) -> int:
        """Wait until ``rows`` scan rows are complete or the series ended; return the rows now.

        Returns after ``timeout_s`` with fewer rows rather than raising (a poll).
        """
        with self._lock:
            wait_until(self._lock, lambda: self._rows_done >= rows or self._finished, timeout_s)
            return self._rows_done

    @property
    def finished(self) -> bool:
        """Whether the series ended (end message, deadline, or an error)."""
        with self._lock:
            return self._finished

    def wait(self, *, timeout_s: float = 600.0) -> SeriesReport:
        """Wait for the series to end; return its report.

        Raises
        ------
        StreamTimeoutError
            The series did not end within ``timeout_s``.
        StreamProtocolError, StreamTimeoutError
            What stopped the receiving (re-raised), after the frames before it
            were kept.
        """
        with self._lock:
            wait_until(
                self._lock,
                lambda: self._finished,
                timeout_s,
                on_timeout=lambda: StreamTimeoutError(
                    f"the live series from {self.endpoint} did not end within {timeout_s:g} s "
                    f"({self._rows_done} of {self.scan_shape[0]} rows complete)"
                ),
            )
        if self.error is not None:
            raise self.error
        assert self.report is not None
        return self.report

    def _open(self, rows: int, notes: list[str]) -> Any:
        from .live_chunks import open_live_folder

        assert self.frame_shape is not None and self.dtype is not None
        R = self.scan_shape[0]
        ds = open_live_folder(
            self.directory,
            calibration=self.calibration,
            chunk_rows=self.chunk_rows,
            scan_rows=(0, rows) if rows < R else None,
        )
        ds._notes.extend(notes)
        return ds

    def dataset_view(self) -> Any:
        """The whole scan as it stands now (rows not yet received read as 0), for checks.

        What a pipeline checks before it runs (shapes, units, output files)
        needs the dataset's layout, not its frames; results need
        :meth:`dataset_so_far` or :meth:`dataset`.
        """
        self.wait_started()
        return self._open(self.scan_shape[0], ["live: layout only (the series is running)"])

    def dataset_so_far(self, *, wait_s: float = 30.0) -> Any:
        """A dataset over the scan rows complete now (every operator applies).

        Raises
        ------
        StreamTimeoutError
            Not one row arrived within ``wait_s``.
        """
        with self._lock:
            wait_until(
                self._lock,
                lambda: self._rows_done > 0 or self._finished,
                wait_s,
                on_timeout=lambda: StreamTimeoutError(
                    f"no complete scan row from {self.endpoint} within {wait_s:g} s"
                ),
            )
            rows = self._rows_done
        if rows == 0:
            if self.error is not None:
                raise self.error
            raise StreamTimeoutError(f"the series from {self.endpoint} ended before one scan row")
        R = self.scan_shape[0]
        note = (
            f"live: partial, scan rows [0, {rows}) of {R} received when this view was made"
            if rows < R
            else f"live: all {R} scan rows received"
        )
        return self._open(rows, [note])

    def dataset(self, *, allow_incomplete: bool = False, timeout_s: float = 600.0) -> Any:
        """The whole scan once the series ended.

        Parameters
        ----------
        allow_incomplete
            Give the dataset of a series with missing frames anyway (they read
            as zero; named in the notes of every result).

        Raises
        ------
        StreamProtocolError
            The series is incomplete and ``allow_incomplete`` is false.
        """
        report = self.wait(timeout_s=timeout_s)
        R, C = self.scan_shape
        missing = np.flatnonzero(~self._received)
        if missing.size:
            from .dectris_receive import _ranges

            text = (
                f"live: INCOMPLETE, {missing.size} of {R * C} frames never arrived (image "
                f"numbers {_ranges([int(i) for i in missing])}); they read as 0. "
                f"{report.describe()}"
            )
            if not allow_incomplete:
                raise StreamProtocolError(
                    f"the live series from {self.endpoint} is incomplete: {text}. Pass "
                    "allow_incomplete=True to analyse it anyway (recorded), or use "
                    "dataset_so_far() for the complete rows"
                )
            return self._open(R, [text])
        return self._open(R, [f"live: complete, {report.describe()}"])

    def follow(
        self,
        build: Callable[[Any], Any],
        *,
        every_s: float = 1.0,
        client: Any = None,
        allow_incomplete: bool = False,
        publish: bool = False,
    ) -> Iterator[tuple[int, tuple[Any, ...]]]:
        """Yield results over the rows so far, again whenever more rows are complete.

        The same updates as :meth:`watch`, in the caller's thread.

        Parameters
        ----------
        build
            ``build(dataset) -> lazy result or sequence of them`` (the same
            operators as offline), called on each view.
        every_s
            Least seconds between two updates.
        client
            As for :func:`quantem_flow.compute`.
        allow_incomplete
            For the last update, as for :meth:`dataset`.
        publish
            Also show each update on the dashboard page (as :meth:`watch`).

        Yields
        ------
        (int, tuple of Result)
            Rows covered, and the results; the last yield covers the whole
            scan once the series ended (bit-identical to the offline pass).
            Outputs that allow it are computed over the new rows only and
            joined (:mod:`~quantem_flow.streams.live_results`); the others
            over all the rows so far.
        """
        from .live_results import LiveResults

        results = LiveResults(
            self,
            build,
            client=client,
            allow_incomplete=allow_incomplete,
            publish=publish,
            start=False,
        )
        last = 0.0
        while True:
            if self.finished:
                if self.error is not None and self.rows_complete == 0:
                    raise self.error
                yield self.scan_shape[0], results.step(self.scan_shape[0], final=True)
                return
            rows = self.rows_complete
            if rows > results.rows and time.monotonic() - last >= every_s:
                last = time.monotonic()
                yield rows, results.step(rows)
                continue
            self.wait_rows(results.rows + 1, timeout_s=max(every_s, 0.05))

    def watch(
        self,
        build: Callable[[Any], Any],
        *,
        every_s: float = 0.2,
        client: Any = None,
        allow_incomplete: bool = False,
        publish: bool = True,
    ) -> Any:
        """Keep a pipeline's results up to date on a background thread while the scan runs.

        Parameters
        ----------
        build
            ``build(dataset) -> lazy result or sequence of them`` (the same
            operators as offline).
        every_s
            Least seconds between two updates.
        client
            As for :func:`quantem_flow.compute`.
        allow_incomplete
            For the final update, as for :meth:`dataset`.
        publish
            Show each update's images on the quantem-flow dashboard page of
            the client's scheduler.

        Returns
        -------
        LiveResults
            ``results()`` (the latest, partial until ``final``), ``wait_rows(n)``,
            ``wait()`` (the final results, equal to the offline pass), ``updates``.
        """
        from .live_results import LiveResults

        return LiveResults(
            self,
            build,
            every_s=every_s,
            client=client,
            allow_incomplete=allow_incomplete,
            publish=publish,
        )

    def close(self) -> None:
        """Stop receiving if the series still runs; delete the frames' file if live() chose it."""
        _stop_process(self._process)
        self._listener.join(10.0)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _stop_process(process: Any) -> None:
    """End the receiving process if it still runs (it ends by itself at its deadlines)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10.0)
        except Exception:  # it did not end: killed
            process.kill()
            process.wait(10.0)


def live(
    endpoint: str,
    *,
    scan_shape: Sequence[int],
    directory: str | Path | None = None,
    timeout_s: float = 10.0,
    start_timeout_s: float = 30.0,
    calibration: Any = None,
    chunk_rows: int | None = None,
    protocol: str = "dectris",
    keep_hdf5: str | Path | None = None,
    images_per_file: int = 1000,
) -> LiveAcquisition:
    """Receive one series from a detector stream; query it while it runs.

    Parameters
    ----------
    endpoint
        The detector's (or simulator's) stream, ``"tcp://host:port"``:
        connected to, never bound.
    scan_shape
        ``(rows, cols)`` of the scan the images fill in order.
    directory
        Where the frames are kept as they arrive: images sent bitshuffle+LZ4
        as their chunks (``live_chunks.bin`` and ``.idx``), others decoded
        (``live_frames.raw``), described by ``live.json``
        (:func:`~quantem_flow.streams.live_chunks.open_live_folder` opens it
        again); a temporary folder when ``None``, removed by
        :meth:`LiveAcquisition.close`.
    timeout_s, start_timeout_s
        Longest silence within the series, and longest wait for its start.
    calibration, chunk_rows
        As for :func:`quantem_flow.open`.
    protocol
        ``"dectris"`` (SIMPLON stream v2, ZeroMQ) or ``"merlin"`` (the Merlin
        readout's TCP data socket).
    keep_hdf5
        Also keep the series as HDF5, one bitshuffle+LZ4 chunk per frame
        (HDF5 filter 32008): a frame the detector sent bitshuffle+LZ4 is
        written as the bytes it came in, without a second compression.  A
        name ending ``_master.h5`` writes DECTRIS's layout (master, data files
        of 1000 frames, a JSON sidecar with the scan shape and calibration:
        ``qf.open(master)`` opens it whole); any other name one file,
        ``/entry/data/data`` of ``(R_r * R_c, k_r, k_c)`` frames whose
        ``quantem_flow`` attribute records the stream, the scan shape and the
        calibration (:mod:`~quantem_flow.streams.hdf5_keep`).
    images_per_file
        Frames per data file of the DECTRIS layout.

    Returns
    -------
    LiveAcquisition
        Receiving already; ``dataset_so_far()``, ``dataset()``, ``report``.
    """
    return LiveAcquisition(
        endpoint,
        scan_shape=scan_shape,
        directory=directory,
        timeout_s=timeout_s,
        start_timeout_s=start_timeout_s,
        calibration=calibration,
        chunk_rows=chunk_rows,
        protocol=protocol,
        keep_hdf5=keep_hdf5,
        images_per_file=images_per_file,
    )
