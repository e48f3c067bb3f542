"""A live acquisition: a stream received into a file in scan order, queryable while it runs.

:func:`live` connects to a detector's stream where the user says and
receives one series on a background thread into a raw file (frames in scan
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

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ParameterError, StreamProtocolError, StreamTimeoutError
from .dectris_receive import Frame, SeriesReport, receive_series

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
        self.path = folder / "live_frames.raw"
        self.hdf5_path = None if keep_hdf5 is None else Path(keep_hdf5).expanduser().absolute()
        if self.hdf5_path is not None and self.hdf5_path.exists():
            from ..errors import OverwriteError

            raise OverwriteError(
                f"{str(self.hdf5_path)!r} exists; choose another keep_hdf5 path (a live series "
                "never replaces a file)"
            )
        self._lock = threading.Condition()
        self._received = np.zeros(R * C, dtype=bool)
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
        self._thread = threading.Thread(target=self._receive, name="qf-live", daemon=True)
        self._thread.start()

    # -- receiving ----------------------------------------------------------------------
    def _frames(self, reports: list[SeriesReport]) -> Iterator[Frame]:
        """The stream's frames; ``reports`` receives what arrived."""
        if self.protocol == "dectris":
            yield from receive_series(
                self.endpoint,
                timeout_s=self._timeout_s,
                start_timeout_s=self._start_timeout_s,
                report=reports,
            )
            return
        from .dectris_stream import StartMessage
        from .merlin_tcp import receive_merlin

        host, _, port = self.endpoint.removeprefix("tcp://").rpartition(":")
        if not host or not port.isdigit():
            raise ParameterError(
                f"a Merlin endpoint is 'tcp://HOST:PORT' (the readout's data socket), got "
                f"{self.endpoint!r}"
            )
        status: list[dict[str, Any]] = []
        seen: list[int] = []
        shape: tuple[int, int] = (0, 0)
        try:
            for frame in receive_merlin(
                host,
                int(port),
                timeout_s=self._timeout_s,
                connect_timeout_s=self._start_timeout_s,
                status=status,
            ):
                seen.append(frame.image_id)
                shape = (int(frame.data.shape[0]), int(frame.data.shape[1]))
                yield frame
        finally:
            done = status[0] if status else {"expected": None, "ended": "stopped"}
            n = int(done["expected"] or self.scan_shape[0] * self.scan_shape[1])
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

    def _open_hdf5(self, frame_shape: tuple[int, int], dtype: np.dtype[Any]) -> Any:
        """The archive file: ``/entry/data/data``, one bitshuffle+LZ4 chunk per frame."""
        import json

        import h5py
        import hdf5plugin

        assert self.hdf5_path is not None
        R, C = self.scan_shape
        f = h5py.File(self.hdf5_path, "x")
        dset = f.create_dataset(
            "entry/data/data",
            shape=(R * C, *frame_shape),
            dtype=dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype,
            chunks=(1, *frame_shape),
            **hdf5plugin.Bitshuffle(cname="lz4"),
        )
        record: dict[str, Any] = {"live": {"endpoint": self.endpoint, "protocol": self.protocol,
                                           "scan_shape": [R, C]}}  # fmt: skip
        if self.calibration is not None:
            cal = self.calibration
            record["calibration"] = cal.to_dict() if hasattr(cal, "to_dict") else dict(cal)
        dset.attrs["quantem_flow"] = json.dumps(record)
        return f, dset

    def _receive(self) -> None:
        reports: list[SeriesReport] = []
        archive: Any = None
        dset: Any = None
        fd: int | None = None
        frame_bytes = 0
        R, C = self.scan_shape
        try:
            for frame in self._frames(reports):
                if fd is None:
                    self.frame_shape = (int(frame.data.shape[0]), int(frame.data.shape[1]))
                    self.dtype = frame.data.dtype
                    frame_bytes = frame.data.nbytes
                    # the whole scan's size at once (sparse); each frame is written in place
                    # with pwrite, which fills the page cache without a fault per page
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.ftruncate(fd, R * C * frame_bytes)
                    if self.hdf5_path is not None:
                        archive, dset = self._open_hdf5(self.frame_shape, self.dtype)
                    self._started.set()
                if frame.image_id >= R * C:
                    raise StreamProtocolError(
                        f"image {frame.image_id} lies beyond the {R} x {C} scan that was given; "
                        "check scan_shape against the detector's number of images"
                    )
                data = np.ascontiguousarray(frame.data, dtype=self.dtype)
                if data.nbytes != frame_bytes:
                    raise StreamProtocolError(
                        f"image {frame.image_id} is {frame.data.shape} {frame.data.dtype}; the "
                        f"series began with {self.frame_shape} {self.dtype}"
                    )
                os.pwrite(fd, data.data.cast("B"), frame.image_id * frame_bytes)
                if dset is not None:
                    if frame.bslz4 is not None:  # kept as received: no second compression
                        dset.id.write_direct_chunk((frame.image_id, 0, 0), frame.bslz4)
                    else:
                        dset[frame.image_id] = data
                with self._lock:
                    self._received[frame.image_id] = True
                    before = self._rows_done
                    while (
                        self._rows_done < R
                        and self._received[self._rows_done * C : (self._rows_done + 1) * C].all()
                    ):
                        self._row_time[self._rows_done] = time.time()
                        self._rows_done += 1
                    if self._rows_done != before:
                        self._lock.notify_all()
        except BaseException as exc:  # reported by wait() and the datasets
            self.error = exc
        finally:
            if fd is not None:
                os.close(fd)
            if archive is not None:
                archive.close()
            with self._lock:
                self.report = reports[0] if reports else None
                self._finished = True
                self._started.set()
                self._lock.notify_all()

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
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._rows_done < rows and not self._finished:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(min(left, 0.5))
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
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not self._finished:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StreamTimeoutError(
                        f"the live series from {self.endpoint} did not end within {timeout_s:g} s "
                        f"({self._rows_done} of {self.scan_shape[0]} rows complete)"
                    )
                self._lock.wait(min(left, 0.5))
        if self.error is not None:
            raise self.error
        assert self.report is not None
        return self.report

    def _open(self, rows: int, notes: list[str]) -> Any:
        from .. import open as open_dataset

        assert self.frame_shape is not None and self.dtype is not None
        R, C = self.scan_shape
        ds = open_dataset(
            self.path,
            format="raw",
            dtype=self.dtype,
            frame_shape=self.frame_shape,
            scan_shape=(R, C),
            calibration=self.calibration,
            chunk_rows=self.chunk_rows,
        )
        if rows < R:
            ds = ds.crop_scan(rows=(0, rows))
        ds._notes.extend(notes)
        return ds

    def dataset_so_far(self, *, wait_s: float = 30.0) -> Any:
        """A dataset over the scan rows complete now (every operator applies).

        Raises
        ------
        StreamTimeoutError
            Not one row arrived within ``wait_s``.
        """
        deadline = time.monotonic() + wait_s
        with self._lock:
            while self._rows_done == 0 and not self._finished:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StreamTimeoutError(
                        f"no complete scan row from {self.endpoint} within {wait_s:g} s"
                    )
                self._lock.wait(min(left, 0.5))
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
        """Delete the received frames' file (when live() chose the folder)."""
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


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
        Where the frames are kept as they arrive (``live_frames.raw``); a
        temporary folder when ``None``, removed by :meth:`LiveAcquisition.close`.
    timeout_s, start_timeout_s
        Longest silence within the series, and longest wait for its start.
    calibration, chunk_rows
        As for :func:`quantem_flow.open`.
    protocol
        ``"dectris"`` (SIMPLON stream v2, ZeroMQ) or ``"merlin"`` (the Merlin
        readout's TCP data socket).
    keep_hdf5
        Also keep the series in this new HDF5 file, ``/entry/data/data`` of
        ``(R_r * R_c, k_r, k_c)`` frames, one bitshuffle+LZ4 chunk each (HDF5
        filter 32008): a frame the detector sent bitshuffle+LZ4 is written as
        the bytes it came in, without a second compression.  Its attribute
        ``quantem_flow`` records the stream, the scan shape and the calibration.

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
    )
