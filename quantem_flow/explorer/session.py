"""The explorer's state and computations, shared by every browser page of one explorer.

One :class:`ExplorerSession` per explored dataset: the dataset persisted on the
cluster (the embedded default or a given ``distributed.Client``), the
navigator patterns computed once, the current detector, the kept detectors,
the chosen scan position and view.  Pages change the state through its
methods and listen for changes, so two browsers on one explorer see the
same state.  Images are computed by one background thread, latest request
first: while a user drags, requests that were overtaken are skipped, never
queued, and each image is labelled with the detector it shows.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from ..dataset import Dataset4D
from ..errors import ImplausibleParameterWarning, ParameterError
from ..operators import center_of_mass, estimate_probe, idpc, max_diffraction, mean_diffraction
from ..results import Result
from .detectors import Detector

__all__ = ["VIEWS", "ExplorerSession", "ImageUpdate"]

logger = logging.getLogger(__name__)

#: The views of the scan image.
VIEWS = ("virtual image", "CoM magnitude", "iDPC phase")


@dataclasses.dataclass(frozen=True)
class ImageUpdate:
    """One computed scan image and what it shows.

    Attributes
    ----------
    view
        One of :data:`VIEWS`.
    detector
        The detector it was computed for.
    result
        The computed result (a :class:`~quantem_flow.results.ScanImage`, or
        for the CoM view its :class:`~quantem_flow.results.VectorField`).
    image
        The 2-D array drawn, float64.
    units
        Units of ``image``.
    seconds
        Wall time of the computation.
    exact
        ``True``: the full-resolution result of ``qf.compute``.
    notes
        What was allowed that is normally refused (a detector mostly off the
        detector), as its warning said.
    """

    view: str
    detector: Detector
    result: Result
    image: np.ndarray
    units: str
    seconds: float
    exact: bool = True
    notes: tuple[str, ...] = ()


def _compute(*lazy: Any, client: Any) -> tuple[Any, ...]:
    from ..graphs import compute

    return tuple(compute(*lazy, client=client))


class ExplorerSession:
    """A persisted dataset and what the explorer's pages show of it.

    Parameters
    ----------
    ds
        The dataset; persisted here unless it is already.
    client
        As for :func:`quantem_flow.compute`: ``None`` (the embedded local
        cluster), a ``distributed.Client``, ``"threads"`` or ``"synchronous"``.
    """

    def __init__(
        self, ds: Dataset4D, *, client: Any = None, live: Any = None, follow_s: float = 2.0
    ):
        self.client = client
        t0 = time.perf_counter()
        self.dataset = ds if ds.is_persisted else ds.persist(client=client)
        self.persist_s = time.perf_counter() - t0
        #: A live acquisition this session follows (``qf.explore(acq)``): the persisted
        #: dataset is replaced by one over more rows as they arrive; images cover the
        #: whole scan, rows not yet received blank (NaN).
        self.live = live
        self.scan_shape: tuple[int, int] = (
            tuple(live.scan_shape) if live is not None else tuple(self.dataset.scan_shape)  # type: ignore[assignment]
        )
        mean, peak = _compute(
            mean_diffraction(self.dataset), max_diffraction(self.dataset), client=client
        )
        self.mean_pattern = np.asarray(mean.data, dtype=np.float64)
        self.max_pattern = np.asarray(peak.data, dtype=np.float64)
        self.pattern_units = str(mean.units)
        #: The pattern's detector axes and what they are measured from (the beam
        #: centre when known or found: ``axes_origin`` in the provenance).
        self.pattern_axes = mean.axes
        self.pattern_origin = dict(mean.provenance.parameters.get("axes_origin") or {})
        kr, kc = self.dataset.detector_shape
        try:
            probe = estimate_probe(self.mean_pattern)
            centre = (float(probe.center[0]), float(probe.center[1]))
            radius = float(probe.radius)
        except Exception as exc:  # no clear probe disk: start in the middle of the detector
            logger.info("quantem-flow explore: no probe found (%s); detector centred", exc)
            centre, radius = ((kr - 1) / 2, (kc - 1) / 2), min(kr, kc) / 8
        self.probe_center = centre
        self.probe_radius = radius
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._listeners: list[Callable[[str], None]] = []
        self.detector = Detector("disk", center=centre, outer=max(radius, 1.0), name="bf")
        self.kept: list[Detector] = []
        self.view = VIEWS[0]
        R, C = self.dataset.scan_shape
        self.position = (R // 2, C // 2)
        self.latest: ImageUpdate | None = None
        self.error: str | None = None
        self._pending: tuple[str, Detector] | None = None
        self._field_cache: dict[tuple[float, float], Any] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="qf-explore", daemon=True)
        self._thread.start()
        self._follower: threading.Thread | None = None
        self._stop_following = threading.Event()
        if live is not None:
            self._follow_s = float(follow_s)
            self._follower = threading.Thread(
                target=self._follow, name="qf-explore-live", daemon=True
            )
            self._follower.start()
        self.request()

    # -- listeners --------------------------------------------------------------------------
    def subscribe(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call ``listener(what)`` on every change (``"detector"``, ``"image"``...).

        Returns
        -------
        Callable
            Removes the listener.
        """
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def _notify(self, what: str) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(what)
            except Exception:  # a closed page must not stop the others
                logger.debug("quantem-flow explore: a listener failed", exc_info=True)

    # -- state --------------------------------------------------------------------------------
    def set_detector(self, detector: Detector) -> None:
        """Make ``detector`` the current one and compute its image (latest first)."""
        if detector == self.detector:
            return
        self.detector = detector
        self._notify("detector")
        self.request()

    def set_view(self, view: str) -> None:
        """Show ``view`` (one of :data:`VIEWS`)."""
        if view not in VIEWS:
            raise ParameterError(f"view must be one of {VIEWS}, got {view!r}")
        if view != self.view:
            self.view = view
            self._notify("view")
            self.request()

    def set_position(self, row: int, col: int) -> None:
        """Choose the scan position whose pattern is shown."""
        R, C = self.scan_shape
        if not (0 <= row < R and 0 <= col < C):
            raise ParameterError(f"scan position ({row}, {col}) is outside the scan ({R}, {C})")
        if (row, col) != self.position:
            self.position = (row, col)
            self._notify("position")

    def keep(self) -> Detector:
        """Keep the current detector for export under a new name; returns the kept one."""
        names = {d.name for d in self.kept}
        base = self.detector.kind
        n = 1
        while f"{base}{n}" in names:
            n += 1
        kept = dataclasses.replace(self.detector, name=f"{base}{n}")
        self.kept.append(kept)
        self._notify("kept")
        return kept

    # -- patterns -------------------------------------------------------------------------
    def region_of(self, row: int, col: int, size: int) -> tuple[int, int, int, int]:
        """The half-open ``size x size`` scan region around ``(row, col)``, within the scan."""
        if size < 1:
            raise ParameterError(f"a region is at least 1 x 1 positions, got size={size}")
        R, C = self.scan_shape
        r0 = min(max(row - (size - 1) // 2, 0), max(R - size, 0))
        c0 = min(max(col - (size - 1) // 2, 0), max(C - size, 0))
        return r0, min(r0 + size, R), c0, min(c0 + size, C)

    def pattern(self, row: int, col: int, *, size: int = 1) -> np.ndarray:
        """The pattern at ``(row, col)``, or the sum over the ``size x size`` region around it.

        Integer data are summed in int64 (exact); the result is float64 for display.
        """
        r0, r1, c0, c1 = self.region_of(row, col, size)
        received = self.dataset.scan_shape[0]  # a live scan: rows beyond have not come
        if r0 >= received:
            return np.zeros(self.dataset.detector_shape, dtype=np.float64)
        block = self.dataset.load_block((r0, min(r1, received)), (c0, c1))
        acc = np.int64 if block.dtype.kind in "iub" else np.float64
        return np.asarray(block.sum(axis=(0, 1), dtype=acc), dtype=np.float64)

    # -- images ------------------------------------------------------------------------------
    def request(self) -> None:
        """Ask for the image of the current view and detector (replaces any waiting request)."""
        with self._wake:
            self._pending = (self.view, self.detector)
            self._wake.notify()

    def compute_now(self, view: str, detector: Detector) -> ImageUpdate:
        """Compute one image in this thread (what the background thread does per request).

        A detector the user placed mostly off the detector is computed anyway
        (``allow_implausible``): its warning is recorded in the result's
        provenance and in :attr:`ImageUpdate.notes`, not printed once per
        drag step; any other warning raised meanwhile is passed on.
        """
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            update = self._compute_now(view, detector)
        notes = []
        for w in caught:
            if issubclass(w.category, ImplausibleParameterWarning):
                notes.append(str(w.message))
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return dataclasses.replace(update, notes=tuple(notes))

    def _compute_now(self, view: str, detector: Detector) -> ImageUpdate:
        t0 = time.perf_counter()
        if view == "virtual image":
            (res,) = _compute(detector.lazy(self.dataset), client=self.client)
            image = np.asarray(res.data, dtype=np.float64)
            units = str(res.units)
        else:
            centre = detector.center if detector.kind in ("disk", "annulus") else self.probe_center
            key = (round(centre[0], 3), round(centre[1], 3))
            if key not in self._field_cache:
                com = center_of_mass(self.dataset, center=centre)
                self._field_cache[key] = _compute(com, idpc(com), client=self.client)
            com_res, phase = self._field_cache[key]
            if view == "CoM magnitude":
                res = com_res
                image = np.hypot(com_res.data[0], com_res.data[1]).astype(np.float64)
                units = str(com_res.units)
            else:
                res = phase
                image = np.asarray(phase.data, dtype=np.float64)
                units = str(phase.units)
        rows = image.shape[0]
        if rows < self.scan_shape[0]:  # a live scan: rows not yet received are blank
            full = np.full((self.scan_shape[0], image.shape[1]), np.nan)
            full[:rows] = image
            image = full
        return ImageUpdate(view, detector, res, image, units, time.perf_counter() - t0)

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                assert self._pending is not None
                view, detector = self._pending
                self._pending = None
            try:
                update = self.compute_now(view, detector)
            except Exception as exc:
                logger.warning("quantem-flow explore: %s", exc)
                self.error = f"{type(exc).__name__}: {exc}"
                self._notify("error")
                continue
            self.error = None
            self.latest = update
            self._notify("image")

    def _follow(self) -> None:
        """Persist the rows of a live scan as they arrive; swap them in; redraw."""
        live = self.live
        while not self._stop_following.is_set():
            rows = self.dataset.scan_shape[0]
            finished = live.finished
            now = live.rows_complete
            if now > rows:
                try:
                    fresh = live.dataset_so_far().persist(client=self.client)
                except Exception as exc:  # the page says so; the rows shown stay
                    logger.warning("quantem-flow explore: live rows: %s", exc)
                    self.error = f"{type(exc).__name__}: {exc}"
                    self._notify("error")
                    return
                with self._wake:
                    old, self.dataset = self.dataset, fresh
                    self._field_cache.clear()
                old.release()
                self._notify("rows")
                self.request()
            elif finished:
                return
            self._stop_following.wait(self._follow_s)

    def close(self, *, release: bool = True) -> None:
        """Stop the background thread; release the resident chunks persisted here."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        self._stop_following.set()
        self._thread.join(timeout=10)
        if self._follower is not None:
            self._follower.join(timeout=30)
        if release and self.dataset.is_persisted:
            self.dataset.release()
