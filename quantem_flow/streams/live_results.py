"""Results that grow with a live scan: new rows computed once, the rest kept.

A pipeline over a live acquisition is ``build(dataset) -> lazy results``, the
same function that runs offline.  Each time more scan rows are complete,
:class:`LiveResults` runs it again, but only where it must:

* an output whose value at each scan position depends on that position's
  frame alone, once its plan is fixed (its operator declares
  ``scan_local = True`` and its plan does not ask for the dataset's probe
  estimate: a virtual detector or a centre of mass with a given centre or a
  calibrated ``detector_origin``) is computed over the **new rows only**, and
  the blocks are joined.  Each frame's value is the same whichever rows it is
  computed with, so the joined result equals the offline pass bit for bit
  (tested);
* any other output (an ``"auto"`` centre found from the data, a mean pattern,
  DPC, iDPC, SSB) is recomputed over all the rows so far, and at the end over
  the whole scan.

Every partial result says in its provenance which rows it covers; a joined
result lists its blocks.  The latest images are published to the scheduler
(``Client.set_metadata``), where the quantem-flow dashboard page draws them
as the scan fills in.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import ParameterError, StreamTimeoutError
from ..graphs.live_panel import LIVE_METADATA_KEY
from .waiting import wait_until

__all__ = ["LIVE_METADATA_KEY", "LiveResults", "is_incremental", "join_scan_rows"]

#: Largest scan side published to the page as it is; larger images are published at
#: every n-th scan position (stated on the page).
PAGE_SIDE = 256


class _NeedsTheDataError(Exception):
    """Raised by the probe provider while checking whether a plan is fixed."""


def _needs_the_data() -> Any:
    raise _NeedsTheDataError


def is_incremental(lazy: Any, view: Any) -> bool:
    """Whether ``lazy`` can be computed over new scan rows alone and joined.

    Parameters
    ----------
    lazy
        A lazy result built on ``view``.
    view
        The dataset ``build`` was given.

    Returns
    -------
    bool
        True when the operator declares each scan position's value a function
        of its own frame (``scan_local``), it runs over ``view``'s scan as
        given (no scan crop or bin inside ``build``), and its plan is fixed
        without looking at the data (no probe estimate).
    """
    from ..operators.base import ChunkOperator, PlanContext

    op = getattr(lazy, "operator", None)
    ds = getattr(lazy, "dataset", None)
    if not isinstance(op, ChunkOperator) or not getattr(op, "scan_local", False):
        return False
    if ds is None or tuple(ds.scan_shape) != tuple(view.scan_shape):
        return False
    if ds.describe().get("scan_block") != view.describe().get("scan_block"):
        return False
    try:
        op.plan(PlanContext(ds, _needs_the_data))
    except _NeedsTheDataError:
        return False
    return True


def _row_axis(result: Any) -> int:
    names = [a.name for a in result.axes]
    if "scan_row" not in names:
        raise ParameterError(f"{result.name!r} has no scan_row axis (axes {names})")
    return names.index("scan_row")


def join_scan_rows(
    blocks: Sequence[tuple[tuple[int, int], Any, Sequence[str]]],
    *,
    whole: Any,
    notes: Sequence[str] = (),
) -> Any:
    """Join results computed over consecutive blocks of scan rows into one.

    Parameters
    ----------
    blocks
        ``((row_start, row_stop), result, operator_notes)`` in order, the
        first starting at 0; ``operator_notes`` are the notes the operator
        added (not those of the block's dataset).
    whole
        The dataset the joined result stands for (its provenance's source,
        dataset, transforms and notes).
    notes
        More notes for the joined result.

    Returns
    -------
    Result
        The first block's type and metadata, the data joined along
        ``scan_row``, and provenance naming every block.
    """
    from ..operators.base import dataset_provenance

    if not blocks:
        raise ParameterError("join_scan_rows needs at least one block")
    spans = [span for span, _, _ in blocks]
    if spans[0][0] != 0 or any(a[1] != b[0] for a, b in itertools.pairwise(spans)):
        raise ParameterError(f"blocks of scan rows must follow each other from 0, got {spans}")
    first = blocks[0][1]
    axis = _row_axis(first)
    data = np.concatenate([np.asarray(r.data) for _, r, _ in blocks], axis=axis)
    axes = list(first.axes)
    axes[axis] = dataclasses.replace(axes[axis], size=int(data.shape[axis]))
    everywhere = set.intersection(*(set(n) for _, _, n in blocks))
    own: list[str] = [n for n in blocks[0][2] if n in everywhere]
    for (a, b), _, block_notes in blocks:
        own += [f"scan rows [{a}, {b}): {n}" for n in block_notes if n not in everywhere]
    parts = dataset_provenance(whole)
    prov = copy.deepcopy(first.provenance)
    for key, value in prov.parameters.items():  # counts over frames add up over the blocks
        if key.startswith("n_") and isinstance(value, int) and not isinstance(value, bool):
            prov.parameters[key] = sum(
                int(r.provenance.parameters.get(key, 0)) for _, r, _ in blocks
            )
    prov.source = parts["source"]
    prov.dataset = parts["dataset"]
    prov.transforms = parts["transforms"]
    prov.flags = parts["flags"]
    prov.notes = [
        *parts["notes"],
        *own,
        f"live: joined from {len(blocks)} block(s) of scan rows, each computed over its own "
        f"rows as they arrived: {', '.join(f'[{a}, {b})' for a, b in spans)}",
        *notes,
    ]
    prov.execution = {
        "live_blocks": [
            {"rows": [a, b], "execution": r.provenance.execution} for (a, b), r, _ in blocks
        ]
    }
    prov.timings = {
        "seconds_total": float(
            sum(r.provenance.timings.get("seconds_total", 0.0) for _, r, _ in blocks)
        )
    }
    return dataclasses.replace(first, data=data, axes=tuple(axes), provenance=prov)


def _page_image(result: Any) -> tuple[np.ndarray, str, int]:
    """What the page shows of a result: a 2-D float32 image, its label, and the stride."""
    names = [a.name for a in result.axes]
    if "scan_row" not in names or "scan_col" not in names:
        raise ParameterError(f"{result.name!r} is not a scan image (axes {names})")
    data = np.asarray(result.data)
    label = f"{result.name} ({result.units})"
    if data.ndim == 3 and data.shape[0] == 2:  # a vector field: its magnitude
        data = np.hypot(data[0], data[1])
        label = f"|{result.name}| ({result.units})"
    if data.ndim != 2:
        raise ParameterError(f"{result.name!r} is not an image (shape {data.shape})")
    if np.iscomplexobj(data):
        data = np.angle(data)
        label = f"phase of {result.name} (rad)"
    step = max(1, -(-max(data.shape) // PAGE_SIDE))
    return np.asarray(data[::step, ::step], dtype=np.float32), label, step


class LiveResults:
    """A pipeline's results over a live acquisition, kept up to date on a thread.

    Made by :meth:`~quantem_flow.streams.session.LiveAcquisition.watch`;
    see the module's description.

    Attributes
    ----------
    rows
        Scan rows the latest results cover.
    updates
        ``[{"rows", "arrived", "ready", "new_rows", "incremental", "seconds"}]``,
        one per update: ``arrived`` is the wall-clock time (``time.time()``) the
        last frame of the covered rows arrived, ``ready`` when the results
        were, ``seconds`` what the update took.
    error
        What stopped the updates, if anything (re-raised by :meth:`wait`).
    """

    def __init__(
        self,
        acquisition: Any,
        build: Callable[[Any], Any],
        *,
        every_s: float = 0.2,
        client: Any = None,
        allow_incomplete: bool = False,
        publish: bool = True,
        start: bool = True,
    ) -> None:
        if not float(every_s) >= 0:
            raise ParameterError(f"every_s must be >= 0 seconds, got {every_s!r}")
        self._acq = acquisition
        self._build = build
        self._every_s = float(every_s)
        self._client = client
        self._allow_incomplete = bool(allow_incomplete)
        self._publish = bool(publish)
        self._lock = threading.Condition()
        self._blocks: dict[int, list[tuple[tuple[int, int], Any, list[str]]]] = {}
        self._latest: tuple[Any, ...] | None = None
        self._final = False
        self._stop = False
        self.rows = 0
        self.updates: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._loop, name="qf-live-results", daemon=True)
            self._thread.start()

    # -- the update -----------------------------------------------------------------------
    def _lazies(self, view: Any) -> list[Any]:
        built = self._build(view)
        items = list(built) if isinstance(built, (list, tuple)) else [built]
        if not items:
            raise ParameterError("build(dataset) returned no lazy result")
        return items

    def _compute(self, lazies: Sequence[Any]) -> tuple[Any, ...]:
        from ..graphs import compute

        if not lazies:
            return ()
        return tuple(compute(*lazies, client=self._client, progress=False))

    def step(self, rows: int, *, final: bool = False) -> tuple[Any, ...]:
        """Bring the results to ``rows`` complete scan rows (or the whole scan when ``final``).

        Returns
        -------
        tuple of Result
            The results, in the order ``build`` returns them.
        """
        acq = self._acq
        t_step = time.perf_counter()
        R = acq.scan_shape[0]
        done = self.rows
        whole = acq.dataset(allow_incomplete=self._allow_incomplete) if final else None
        view = whole if whole is not None else acq.dataset_so_far()
        rows = view.scan_shape[0]
        so_far = self._lazies(view)
        incremental = [is_incremental(lazy, view) for lazy in so_far]
        out: list[Any] = [None] * len(so_far)
        new_rows = rows - done
        if any(incremental) and new_rows > 0:
            block_view = view.crop_scan(rows=(done, rows))
            block_lazies = self._lazies(block_view)
            picked = [i for i, inc in enumerate(incremental) if inc]
            computed = self._compute([block_lazies[i] for i in picked])
            block_notes = set(block_view.notes)
            for i, result in zip(picked, computed, strict=True):
                own = [n for n in result.provenance.notes if n not in block_notes]
                self._blocks.setdefault(i, []).append(((done, rows), result, own))
        for i, inc in enumerate(incremental):
            if inc:
                note = (
                    f"live: partial, scan rows [0, {rows}) of {R}" if rows < R and not final else ""
                )
                out[i] = join_scan_rows(self._blocks[i], whole=view, notes=[note] if note else [])
        others = [i for i, inc in enumerate(incremental) if not inc]
        for i, result in zip(others, self._compute([so_far[i] for i in others]), strict=True):
            out[i] = result
        arrived = acq.row_arrival_time(rows - 1) if rows > 0 else None
        update = {
            "rows": rows,
            "arrived": arrived,
            "ready": time.time(),
            "new_rows": new_rows,
            "incremental": [bool(v) for v in incremental],
            "seconds": time.perf_counter() - t_step,
        }
        if self._publish:  # before the results are handed out: a waiter then finds the page
            self._publish_latest(tuple(out), update, final=final)
        with self._lock:
            self.rows = rows
            self._latest = tuple(out)
            self._final = final
            self.updates.append(update)
            self._lock.notify_all()
        return tuple(out)

    def _loop(self) -> None:
        acq = self._acq
        try:
            while not self._stop:
                finished = acq.finished
                rows = acq.rows_complete
                if finished:
                    if acq.error is not None and rows == 0:
                        raise acq.error
                    self.step(acq.scan_shape[0], final=True)
                    return
                if rows > self.rows:
                    started = time.monotonic()
                    self.step(rows)
                    rest = self._every_s - (time.monotonic() - started)
                    if rest > 0:  # at most one update per every_s; a slow one waits no more
                        time.sleep(rest)
                    continue
                acq.wait_rows(self.rows + 1, timeout_s=0.5)
        except BaseException as exc:  # re-raised by wait()
            with self._lock:
                self.error = exc
                self._lock.notify_all()
        finally:
            with self._lock:
                self._stop = True
                self._lock.notify_all()

    # -- reading --------------------------------------------------------------------------
    def results(self) -> tuple[Any, ...]:
        """The latest results (partial until :attr:`final`).

        Raises
        ------
        StreamTimeoutError
            No update has finished yet (see :meth:`wait_rows`).
        """
        with self._lock:
            if self._latest is None:
                if self.error is not None:
                    raise self.error
                raise StreamTimeoutError(
                    "no live result yet: no scan row was complete when last looked; "
                    "wait_rows(1) waits for the first"
                )
            return self._latest

    @property
    def final(self) -> bool:
        """Whether the results cover the whole scan of a series that ended."""
        with self._lock:
            return self._final

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def wait_rows(self, rows: int, *, timeout_s: float = 60.0) -> tuple[Any, ...]:
        """Wait until the results cover at least ``rows`` scan rows (or are final)."""
        with self._lock:
            wait_until(
                self._lock,
                lambda: self.rows >= rows or self._final or self._stop,
                timeout_s,
                on_timeout=lambda: StreamTimeoutError(
                    f"live results reached {self.rows} of {rows} scan rows within {timeout_s:g} s"
                ),
                check=self._raise_error,
            )
        return self.results()

    def wait(self, *, timeout_s: float = 600.0) -> tuple[Any, ...]:
        """Wait for the final results over the whole scan.

        Raises
        ------
        StreamTimeoutError
            Not final within ``timeout_s``.
        StreamProtocolError, StreamTimeoutError
            What stopped the series or the updates.
        """
        with self._lock:
            wait_until(
                self._lock,
                lambda: self._final,
                timeout_s,
                on_timeout=lambda: StreamTimeoutError(
                    f"live results not final within {timeout_s:g} s ({self.rows} of "
                    f"{self._acq.scan_shape[0]} rows)"
                ),
                check=self._raise_error,
            )
            assert self._latest is not None
            return self._latest

    def stop(self, *, timeout_s: float = 30.0) -> None:
        """Stop updating (the acquisition keeps receiving)."""
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- the page ---------------------------------------------------------------------------
    def page_payload(
        self, results: Sequence[Any], update: dict[str, Any], *, final: bool = False
    ) -> dict[str, Any]:
        """What the dashboard page shows of one update: its images and how far the scan is."""
        acq = self._acq
        images = []
        for result in results:
            try:
                image, label, step = _page_image(result)
            except ParameterError:
                continue
            images.append(
                {
                    "label": label,
                    "shape": list(image.shape),
                    "pixels": image.tobytes(),  # float32, C order: msgpack carries bytes
                    "step": step,
                }
            )
        return {
            "endpoint": acq.endpoint,
            "scan_shape": list(acq.scan_shape),
            "rows": update["rows"],
            "final": bool(final),
            "arrived": update["arrived"],
            "ready": update["ready"],
            "published": time.time(),
            "images": images,
        }

    def _publish_latest(
        self, results: Sequence[Any], update: dict[str, Any], *, final: bool
    ) -> None:
        client = self._client
        from ..graphs.runner import in_process

        if in_process(client):  # this process: no scheduler to tell
            return
        if client is None:
            from ..graphs.cluster import embedded_client

            client = embedded_client()
        elif isinstance(client, str):
            from ..graphs.runner import client_for_address

            client = client_for_address(client)
        client.set_metadata(
            list(LIVE_METADATA_KEY), self.page_payload(results, update, final=final)
        )
