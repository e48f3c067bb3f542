"""Structured weight rows: a frame pass whose cost barely grows with the rows.

The pass planner stacks every operator's weight map into rows (BF, ADF, the
three maps of a centre of mass...).  The fused kernel
(:func:`~quantem_flow.runtimes.cpu.kernels._fused`) multiplies every frame by
every row, so its cost is linear in the rows.  Most rows have structure:

- **mask rows**: 0/1 valued (BF, ABF, ADF, annular, boolean masks); the
  value is the sum of the frame over the row's *support* (its nonzero
  pixels);
- **moment rows**: ``M * (g - c)`` for a support ``M``, ``g`` the pixel's row
  (or column) index and a constant ``c`` (the maps centre of mass builds:
  ``mask * (row - centre_row)``, ``mask * (col - centre_col)``); the value
  is the first moment of the frame over ``M`` minus ``c`` times its sum.

:func:`analyse_weights` finds them once per distinct stack of rows (cached
by content).  The distinct supports partition the detector into *cells*
(pixels grouped by which supports hold them; a pixel in no support is in no
cell and is never read).  The cells are stored as runs of consecutive
pixels along detector rows.  Per frame, one pass over the runs accumulates,
for every cell, the sum of the frame and (when a moment row needs it) its
row and column moments; every structured row is then a short sum over its
cells.  The remaining ("general") rows go through the fused kernel on
those rows only, in the same groups of frames, while they are in cache.

Segments (8/16-bit integer data with moment rows): moments are needed only
per *class* of cells (the cells held by the same moment supports), so
adjacent runs of one detector row whose cells share a class are merged into
a *segment* of at most :data:`MAX_RUN` pixels (:func:`_segments`); one long
loop per segment takes its sum and moments (BF + ADF + CoM on 128 x 128: 128
segments instead of 328 runs with moments), and the cells' sums need only
the runs of each segment's smaller cells (the largest cell's sum is the
segment's minus theirs, exact in integers): 2 826 of 16 384 pixels summed a
second time, from cache.  Measured 1.2-1.3x the per-run pass; recorded
in the variant (``moments``).  Tried and dropped (slower on this machine,
Zen 4): the column moment from per-cell column projections
(``proj[cell, c0:c1] += x[r, c0:c1]``, then ``sum_c c * proj``: 1.4-1.7x
slower than the multiply-add, the projection's load-add-store costs more
than the multiply, also on whole detector rows), and masked windows aligned
to 16 pixels in place of scalar run tails (no faster).  Real data keep the
per-run pass (a difference of sums would cancel), 32-bit integers too
(int64 runs).

Exactness
---------
On integer data the cell accumulators are integers: int64 sums of
``value``, ``value * (row - r0)`` and ``value * (col - c0)`` (``(r0, c0)``
the detector's middle pixel), and for 8- and 16-bit data int32 sums within
one run (or segment) of at most :data:`MAX_RUN` pixels (``2**16 * 256 *
255 / 2 < 2**31``), widened once per run; a segment's largest cell gets the
segment's int32 sum minus its other cells' (exact: every term is bounded
as the run sums are).  They are exact.  A structured row is then
a sum of cell accumulators, converted to float64: exact while below
``2**53``.  :meth:`WeightPlan.applicable` admits integer data only when
``max |value| * touched pixels * 2 * max(k_r, k_c) < 2**53``, which bounds
every accumulator (u16 frames of 4096 x 4096 pixels: ``2**16 * 2**24 *
2**13 = 2**53``, just out; 2048 x 2048 pass).  64-bit integers never pass
and keep the fused kernel.  So, on integer data, mask rows equal the fused
kernel's values bit for bit (both are the exact integer sums; the fused
kernel's float64 partial sums of integers are exact below ``2**53``), and
so do moment rows whose centre ``c`` makes ``value * (g - c)`` exact in
float64 (an integer or half-integer centre, the usual detector centres):
``fl(M - fl(c - r0) * S)`` with exact ``M`` and ``S`` is then exact too.  For
any other centre both are roundings of the same real number, the fused
kernel's after ``K`` roundings and this one's after at most three.  On
real data the cell sums are float64 sums regrouped by cell (the fused
kernel already sums in any order, ``fastmath`` reassociation) and stay
within the runtime's declared float64 tolerance.  No float32 path is used.

Non-finite pixels
-----------------
A NaN or infinity in a cell makes that cell's accumulators non-finite and
only the rows whose support holds the cell; the caller then recomputes
every non-finite output over the row's nonzero weights exactly as the fused
kernel's repair does (:func:`~quantem_flow.runtimes.cpu.kernels.skip_zero_weights`),
so the contract of docs/runtimes.md holds unchanged.

When it is used
---------------
The structured part is taken when its estimated cost (pixels touched, more
with moments, plus a per-run overhead: :data:`RUN_OVERHEAD_PIXELS`) is below
the fused kernel's on the same rows (the detector times the row pairs);
supports cut into short runs (random speckle masks, fine stripes, small
detectors with many cells) stay on the fused kernel.  The choice and its reason are recorded
(:meth:`WeightPlan.describe`) and reach the pass's per-chunk provenance.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from .kernels import _fused, _jit

__all__ = [
    "MAX_CELLS",
    "MOMENT_FACTOR",
    "PIXEL_COST",
    "RUN_OVERHEAD_PIXELS",
    "WeightPlan",
    "analyse_weights",
    "finish_moment_rows",
    "plan_arrays",
    "readonly",
    "structured_pass",
    "structured_vectors",
]

#: Most cells a structured plan may have (more: the rows go to the fused kernel).
MAX_CELLS = 64
#: The cost estimate, in pixel-steps (one step: one detector pixel of the fused
#: kernel's pass with one pair of rows): a touched pixel costs PIXEL_COST, a run
#: RUN_OVERHEAD_PIXELS.  Calibrated on 128 x 128 u16/f32 frames: two complementary
#: striped masks with runs of 2, 4, 8, 16, 32 pixels took 5.9, 3.7, 2.4, 1.25 and
#: 1.0x the fused kernel's time (runs shorter than the vector loop's lanes are
#: mostly scalar), BF + ADF (228 runs, 14 816 pixels) 0.75x.
PIXEL_COST = 0.7
RUN_OVERHEAD_PIXELS = 10
#: Cost of a touched pixel when moment rows are present (the cell pass with
#: moments measured 1.6x the one with sums only).
MOMENT_FACTOR = 1.6
#: Longest run (pixels): int32 sums of 16-bit values over a run stay exact
#: (``65535 * 256 * 255 / 2 < 2**31`` for the column moment).
MAX_RUN = 256
#: Frames per group: the structured pass, the fused kernel on the general rows
#: and the pattern sums read a group while it is in cache (multiple of 4).
GROUP_BYTES = 512 * 1024
#: Take the segments on 8/16-bit data with moment rows (False: the per-cell-run
#: kernel; for benchmarks that compare the two).
USE_SEGMENTS = True
#: Exactness bound of float64 sums of integers.
EXACT_INTEGER = 2**53

_KIND_SUM, _KIND_ROW, _KIND_COL = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class WeightPlan:
    """How one stack of weight rows is computed (see the module docstring).

    Attributes
    ----------
    n_rows
        Rows in the stack.
    frame_shape
        ``(k_r, k_c)`` the coordinates were taken from (``(1, K)`` when the
        caller did not give a detector shape: then no moment row is found).
    kinds
        Per row: ``"mask"``, ``"row moment"``, ``"column moment"`` or
        ``"general"``.
    n_supports, n_cells, n_runs, touched
        Distinct supports of the structured rows, cells, runs and pixels in
        some cell.
    structured
        Whether the structured part runs (``False``: every row is general).
    reason
        Why (cost estimate or what is missing).
    """

    n_rows: int
    frame_shape: tuple[int, int]
    kinds: tuple[str, ...]
    n_supports: int
    n_cells: int
    n_runs: int
    touched: int
    structured: bool
    reason: str
    max_coordinate: float
    # kernel arrays
    run_start: np.ndarray
    run_length: np.ndarray
    run_cell: np.ndarray
    run_row: np.ndarray
    run_col: np.ndarray
    need_moments: bool
    srow_out: np.ndarray  # output column of each structured row
    srow_kind: np.ndarray
    srow_offset: np.ndarray  # fl(c - origin) of moment rows
    srow_ptr: np.ndarray  # CSR over srow_cells
    srow_scol: np.ndarray  # output column of a moment row's support sum (-1: mask rows)
    srow_cells: np.ndarray
    general: np.ndarray  # output columns of the general rows
    general_weights: np.ndarray  # their weights, an even number of rows
    # segments (8/16-bit integer data with moment rows; see _segments)
    seg_arrays: tuple[np.ndarray, ...] = ()
    n_segments: int = 0
    n_subruns: int = 0
    subrun_pixels: int = 0

    @property
    def n_out(self) -> int:
        """Output columns the structured part writes: the rows, then the moment rows' sums."""
        return int(self.n_rows + np.count_nonzero(self.srow_kind != _KIND_SUM))

    @property
    def n_general(self) -> int:
        """Rows computed by the fused kernel."""
        return int(self.general.size)

    def applicable(self, dtype: np.dtype[Any]) -> tuple[bool, str]:
        """Whether the structured part runs on frames of ``dtype``, and why.

        Integer data need the exactness bound of the module docstring; real
        data always qualify (the sums are regrouped within the declared
        float64 tolerance).
        """
        if not self.structured:
            return False, self.reason
        dt = np.dtype(dtype)
        if dt.kind in "ui":
            info = np.iinfo(dt)
            vmax = max(abs(int(info.min)), int(info.max))
            coord = max(1, int(np.ceil(self.max_coordinate))) if self.need_moments else 1
            bound = vmax * max(self.touched, 1) * coord
            if bound >= EXACT_INTEGER:
                return False, (
                    f"{dt.name} data: max|value| {vmax} x {self.touched} pixels x coordinate "
                    f"{coord} = {bound} >= 2**53, integer sums would not be exact in float64"
                )
            return True, (
                f"{self.reason}; {dt.name} sums exact (max|value| x pixels x coordinate "
                f"= {bound} < 2**53)"
            )
        if dt.kind == "f":
            return True, f"{self.reason}; real data: sums regrouped (float64)"
        return False, f"{dt.name} data are not integer or real"

    def cell_cost(self) -> float:
        """The cell kernels' estimated pixel-steps per frame on this plan (the cost model above)."""
        factor = MOMENT_FACTOR if self.need_moments else 1.0
        return self.touched * PIXEL_COST * factor + RUN_OVERHEAD_PIXELS * self.n_runs

    def describe(self, dtype: np.dtype[Any]) -> dict[str, Any]:
        """JSON-ready record of the variant that runs on ``dtype`` frames, and why."""
        use, why = self.applicable(dtype)
        kinds = list(self.kinds)
        if not use:
            return {
                "variant": "fused",
                "summary": f"fused: {self.n_rows} general rows",
                "why": why,
            }
        n_mask = kinds.count("mask")
        n_mom = kinds.count("row moment") + kinds.count("column moment")
        summary = (
            f"structured: {n_mask} mask rows, {n_mom} moment rows over {self.n_supports} "
            f"supports, {self.n_cells} cells, {self.touched} of "
            f"{self.frame_shape[0] * self.frame_shape[1]} pixels in {self.n_runs} runs; "
            f"general rows: {self.n_general}"
        )
        record: dict[str, Any] = {
            "variant": "structured",
            "summary": summary,
            "rows": kinds,
            "why": why,
        }
        if self.need_moments:
            if integer_mode(np.dtype(dtype), self) == 3:
                record["summary"] += f"; moments over {self.n_segments} segments"
                record["moments"] = (
                    f"segments: {self.n_segments} segments (adjacent runs whose cells are in "
                    f"the same moment supports, <= {MAX_RUN} pixels, int32) give sums and "
                    f"moments; cell sums from {self.n_subruns} sub-runs ({self.subrun_pixels} "
                    "pixels), each segment's largest cell by difference (exact in integers)"
                )
            else:
                if np.dtype(dtype).kind not in "ui":
                    why_runs = "real data: no differences of sums (they would cancel)"
                elif not USE_SEGMENTS:
                    why_runs = "segments switched off (structure.USE_SEGMENTS)"
                else:
                    why_runs = "segments are for 8/16-bit integer data only (int32 sums)"
                record["moments"] = f"per cell run ({self.n_runs} runs): {why_runs}"
        return record


def _coordinates(frame_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, int, int]:
    kr, kc = frame_shape
    r0, c0 = kr // 2, kc // 2
    rows = np.repeat(np.arange(kr, dtype=np.float64), kc)
    cols = np.tile(np.arange(kc, dtype=np.float64), kr)
    return rows, cols, r0, c0


def _moment_of(w: np.ndarray, nz: np.ndarray, coords: np.ndarray) -> float | None:
    """``c`` with ``w == fl(coords - c)`` on the support ``nz``, or ``None``."""
    g = coords[nz]
    v = w[nz]
    d = g - v
    # fl(g - c) may round: try c from a few pixels (the first, the smallest |w|, the largest)
    for q in (0, int(np.argmin(np.abs(v))), int(np.argmax(np.abs(v)))):
        c = float(d[q])
        if np.array_equal(g - c, v):
            return c
    return None


def _runs(label: np.ndarray, frame_shape: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """Runs of equal nonzero labels along detector rows: start, length, cell, row, col."""
    kr, kc = frame_shape
    lab = label.reshape(kr, kc)
    edge = np.ones((kr, kc), dtype=bool)
    edge[:, 1:] = lab[:, 1:] != lab[:, :-1]
    rr, cc = np.nonzero(edge)
    starts = rr * kc + cc
    ends = np.append(starts[1:], kr * kc)
    ends = np.minimum(ends, (rr + 1) * kc)  # a run never crosses a detector row
    cell = label[starts]
    keep = cell > 0
    starts, ends, cell, rr, cc = starts[keep], ends[keep], cell[keep], rr[keep], cc[keep]
    pieces = -(-(ends - starts) // MAX_RUN)  # runs of at most MAX_RUN pixels
    if pieces.size and pieces.max() > 1:
        first = np.repeat(starts, pieces)
        offset = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)
        new_starts = first + offset * MAX_RUN
        ends = np.minimum(new_starts + MAX_RUN, np.repeat(ends, pieces))
        cell, rr = np.repeat(cell, pieces), np.repeat(rr, pieces)
        cc = np.repeat(cc, pieces) + offset * MAX_RUN
        starts = new_starts
    keep = np.ones(starts.size, dtype=bool)
    return (
        starts[keep].astype(np.int64),
        (ends - starts)[keep].astype(np.int64),
        (cell[keep] - 1).astype(np.int64),
        rr[keep].astype(np.int64),
        cc[keep].astype(np.int64),
    )


def _build(weights: np.ndarray, frame_shape: tuple[int, int] | None, force: bool) -> WeightPlan:
    m, k = weights.shape
    shape = frame_shape if frame_shape and frame_shape[0] * frame_shape[1] == k else (1, k)
    rows, cols, r0, c0 = _coordinates(shape)
    supports: list[np.ndarray] = []
    keys: dict[bytes, int] = {}

    def support_id(mask: np.ndarray) -> int:
        key = np.packbits(mask).tobytes()
        if key not in keys:
            keys[key] = len(supports)
            supports.append(mask)
        return keys[key]

    kinds = ["general"] * m
    row_support = [-1] * m
    row_offset = [0.0] * m
    nonzero = [weights[j] != 0.0 for j in range(m)]
    for j in range(m):  # mask rows first: their supports are the moment rows' candidates
        w = weights[j]
        if bool(np.all((w == 0.0) | (w == 1.0))):
            kinds[j] = "mask"
            row_support[j] = support_id(nonzero[j])
    mask_supports = list(supports)
    if shape[0] > 1:
        for j in range(m):
            if kinds[j] != "general" or not np.isfinite(weights[j]).all():
                continue
            nz = nonzero[j]
            if not nz.any():
                continue
            for kind, coords, origin in (("row moment", rows, r0), ("column moment", cols, c0)):
                c = _moment_of(weights[j], nz, coords)
                if c is None:
                    continue
                on_line = coords == c
                chosen = nz
                for s in mask_supports:  # a mask row's support, if it differs only on g == c
                    if not (nz & ~s).any() and not (s & ~nz & ~on_line).any():
                        chosen = s
                        break
                kinds[j] = kind
                row_support[j] = support_id(chosen)
                row_offset[j] = float(np.float64(c) - np.float64(origin))
                break
    structured_rows = [j for j in range(m) if kinds[j] != "general"]
    general = np.array([j for j in range(m) if kinds[j] == "general"], dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    n_cells = 0
    runs: tuple[np.ndarray, ...] = (empty,) * 5
    cells_of: list[np.ndarray] = []
    reason = "no mask or moment rows"
    ok = bool(structured_rows)
    if ok:
        table = np.stack(supports)  # (supports, K)
        if len(supports) < 63:  # the pixel's signature: which supports hold it, as bits
            sig = (table.astype(np.int64) << np.arange(len(supports))[:, None]).sum(axis=0)
            uniq, inverse = np.unique(sig, return_inverse=True)
            has_zero = bool(uniq.size) and uniq[0] == 0
        else:
            packed = np.packbits(table, axis=0).T.copy()  # (K, bytes)
            vsig = packed.view(np.dtype((np.void, packed.shape[1]))).ravel()
            uniq, inverse = np.unique(vsig, return_inverse=True)
            has_zero = bool(uniq.size) and not np.frombuffer(uniq[0].tobytes(), np.uint8).any()
        inverse = inverse.ravel()
        label = inverse + (0 if has_zero else 1)  # 0: in no support
        n_cells = int(uniq.size) - int(has_zero)
        if n_cells > MAX_CELLS:
            ok = False
            reason = f"{n_cells} cells > {MAX_CELLS}"
        else:
            runs = _runs(label, shape)
            cell_pixel = np.zeros(n_cells, dtype=np.int64)  # one pixel of each cell
            cell_pixel[label[label > 0] - 1] = np.flatnonzero(label > 0)
            cells_of = [np.flatnonzero(s[cell_pixel]) for s in supports]
            touched = int(runs[1].sum())
            moments = any(k_ not in ("mask", "general") for k_ in kinds)
            cost = int(touched * PIXEL_COST * (MOMENT_FACTOR if moments else 1.0))
            cost += RUN_OVERHEAD_PIXELS * int(runs[0].size)
            fused = k * ((len(structured_rows) + 1) // 2)
            reason = (
                f"estimated cost {cost} pixel-steps (pixels touched x {PIXEL_COST}"
                + (f" x {MOMENT_FACTOR}" if moments else "")
                + f", {int(runs[0].size)} runs x {RUN_OVERHEAD_PIXELS}) vs {fused} for the "
                "fused kernel on those rows (detector pixels x row pairs)"
            )
            if cost >= fused and not force:
                ok = False
                reason = "fragmented supports: " + reason
    if not ok:
        kinds = ["general"] * m
        structured_rows = []
        general = np.arange(m, dtype=np.int64)
        runs = (empty,) * 5
    gw = weights[general]
    if gw.shape[0] % 2:
        gw = np.concatenate([gw, np.zeros((1, k))])
    ptr = [0]
    cells: list[int] = []
    for j in structured_rows:
        cells.extend(cells_of[row_support[j]].tolist())
        ptr.append(len(cells))
    kind_code = {"mask": _KIND_SUM, "row moment": _KIND_ROW, "column moment": _KIND_COL}
    # |p| < k_c inside a run and |g - origin| <= max(k_r, k_c): every moment term and
    # partial sum is below max|value| * touched * 2 * max(k_r, k_c)
    max_coord = float(2 * max(shape[0], shape[1]))
    need_moments = any(kd in ("row moment", "column moment") for kd in kinds)
    seg: tuple[np.ndarray, ...] = ()
    if ok and need_moments:
        moment_supports = sorted({row_support[j] for j in structured_rows if kinds[j] != "mask"})
        rel = (runs[0], runs[1], runs[2], runs[3] - r0, runs[4] - c0)
        seg = _segments(rel, [cells_of[q] for q in moment_supports], n_cells)
    return WeightPlan(
        n_rows=m,
        frame_shape=(int(shape[0]), int(shape[1])),
        kinds=tuple(kinds),
        n_supports=len(supports) if ok else 0,
        n_cells=n_cells if ok else 0,
        n_runs=int(runs[0].size),
        touched=int(runs[1].sum()),
        structured=ok,
        reason=reason,
        max_coordinate=max_coord,
        run_start=runs[0],
        run_length=runs[1],
        run_cell=runs[2],
        run_row=runs[3] - r0,
        run_col=runs[4] - c0,
        need_moments=need_moments,
        srow_out=np.array(structured_rows, dtype=np.int64),
        srow_kind=np.array([kind_code[kinds[j]] for j in structured_rows], dtype=np.int64),
        srow_offset=np.array([row_offset[j] for j in structured_rows], dtype=np.float64),
        srow_ptr=np.array(ptr, dtype=np.int64),
        srow_scol=_sum_columns(m, [kind_code[kinds[j]] for j in structured_rows]),
        srow_cells=np.array(cells, dtype=np.int64),
        general=general,
        general_weights=np.ascontiguousarray(gw, dtype=np.float64),
        seg_arrays=seg,
        n_segments=int(seg[0].size) if seg else 0,
        n_subruns=int(seg[7].size) if seg else 0,
        subrun_pixels=int(seg[8].sum()) if seg else 0,
    )


def structured_vectors(plan: WeightPlan) -> list[tuple[np.ndarray, int]]:
    """Integer vectors whose dot products with a frame give the plan's structured columns.

    Per structured row: its support (0/1) for a mask row; for a moment row,
    the support times the pixel's row (column) offset from the detector's
    middle pixel, then the support itself for the row's sum column.  Each
    ``(vector, output column)``; int64 vectors of ``k_r * k_c`` pixels.  The
    dot products are the integers the cell kernels accumulate, before
    :func:`finish_moment_rows` (the exact NumPy pass and the integer dot
    kernel compute them this way).
    """
    kr, kc = plan.frame_shape
    cells = np.full(kr * kc, -1, dtype=np.int64)
    for s0, ln, c in zip(
        plan.run_start.tolist(), plan.run_length.tolist(), plan.run_cell.tolist(), strict=True
    ):
        cells[s0 : s0 + ln] = c
    rows = np.repeat(np.arange(kr, dtype=np.int64), kc) - kr // 2
    cols = np.tile(np.arange(kc, dtype=np.int64), kr) - kc // 2
    out: list[tuple[np.ndarray, int]] = []
    ptr, held = plan.srow_ptr, plan.srow_cells
    for q in range(plan.srow_out.size):
        support = np.isin(cells, held[ptr[q] : ptr[q + 1]]).astype(np.int64)
        kind = int(plan.srow_kind[q])
        if kind == _KIND_SUM:
            out.append((support, int(plan.srow_out[q])))
        else:
            out.append((support * (rows if kind == _KIND_ROW else cols), int(plan.srow_out[q])))
            out.append((support, int(plan.srow_scol[q])))
    return out


def _sum_columns(n_rows: int, kinds: list[int]) -> np.ndarray:
    """The column after the rows where each moment row's support sum goes (-1 for masks)."""
    out = np.full(len(kinds), -1, dtype=np.int64)
    moment = [q for q, kd in enumerate(kinds) if kd != _KIND_SUM]
    out[moment] = n_rows + np.arange(len(moment), dtype=np.int64)
    return out


def finish_moment_rows(out: np.ndarray, plan: WeightPlan) -> None:
    """Turn each moment row's ``(moment, sum)`` columns into ``moment - offset * sum``, in place.

    The group loop writes the moment ``M`` (relative to the detector's middle
    pixel) in the row's column and the support's sum ``S`` in a column after
    the rows (:attr:`WeightPlan.n_out`); the value is ``fl(M - fl(offset *
    S))``, two IEEE roundings, here in NumPy.  Compiled code would let LLVM
    fuse them into one FMA where the CPU has one, so the last bit of a centre
    of mass would depend on the machine; here it does not, and the exact
    NumPy path (:mod:`~quantem_flow.runtimes.cpu.exact_numpy`) gives the same
    bits.
    """
    moment = plan.srow_kind != _KIND_SUM
    if not moment.any() or out.shape[0] == 0:
        return
    cols = plan.srow_out[moment]
    sums = out[:, plan.srow_scol[moment]]
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite: repaired by the caller
        out[:, cols] = out[:, cols] - sums * plan.srow_offset[moment]


def _segments(
    runs: tuple[np.ndarray, ...], moment_cells: list[np.ndarray], n_cells: int
) -> tuple[np.ndarray, ...]:
    """Segments: adjacent runs merged where moments need only their union.

    A cell's *class* is the set of moment supports holding it; every moment
    row sums the moments of whole classes.  Adjacent runs on one detector row
    whose cells have the same class (and at most :data:`MAX_RUN` pixels in
    all) form a segment: its sum and moments are taken in one long loop and
    credited to the class's first cell (``rep``; -1: no moments).  The cells'
    sums then need only the runs of all cells but the segment's largest one
    (``comp``, whose sum is the segment's minus the others': exact in
    integers).  Returns ``(start, length, rep, row, col, ptr, comp,
    sub_start, sub_length, sub_cell)``, ``ptr`` a CSR over the sub-runs.
    """
    start, length, cell, row, col = runs
    member = np.zeros((n_cells, len(moment_cells)), dtype=bool)
    for q, cells in enumerate(moment_cells):
        member[cells, q] = True
    keys: dict[bytes, int] = {}
    rep = np.full(n_cells, -1, dtype=np.int64)
    for c in range(n_cells):
        if member[c].any():
            rep[c] = keys.setdefault(member[c].tobytes(), c)
    out: list[list[int]] = []  # start, length, rep, row, col, first run, runs
    lst = start.tolist()
    lln = length.tolist()
    lrow = row.tolist()
    lcol = col.tolist()
    lcell = cell.tolist()
    lrep = rep[cell].tolist()
    for t in range(len(lst)):
        s0, ln, r, cl = lst[t], lln[t], lrow[t], lrep[t]
        cur = out[-1] if out else None
        if (
            cur is not None
            and cur[2] == cl
            and cur[3] == r
            and cur[0] + cur[1] == s0
            and cur[1] + ln <= MAX_RUN
        ):
            cur[1] += ln
            cur[6] += 1
        else:
            out.append([s0, ln, cl, r, lcol[t], t, 1])
    out.sort(key=lambda g: g[2] < 0)  # segments with moments first (stable)
    ptr = [0]
    comp: list[int] = []
    sub: list[int] = []
    for g in out:
        ts = range(g[5], g[5] + g[6])
        size: dict[int, int] = {}
        for t in ts:
            size[lcell[t]] = size.get(lcell[t], 0) + lln[t]
        big = max(size, key=lambda c: (size[c], -c))
        comp.append(big)
        sub.extend(t for t in ts if lcell[t] != big)
        ptr.append(len(sub))
    arr = np.array(out, dtype=np.int64).reshape(-1, 7)
    idx = np.array(sub, dtype=np.int64)
    return (
        np.ascontiguousarray(arr[:, 0]),
        np.ascontiguousarray(arr[:, 1]),
        np.ascontiguousarray(arr[:, 2]),
        np.ascontiguousarray(arr[:, 3]),
        np.ascontiguousarray(arr[:, 4]),
        np.array(ptr, dtype=np.int64),
        np.array(comp, dtype=np.int64),
        start[idx].copy(),
        length[idx].copy(),
        cell[idx].copy(),
    )


_CACHE: OrderedDict[tuple[Any, ...], tuple[np.ndarray, WeightPlan]] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 16


def holds_plan(plan: WeightPlan) -> bool:
    """Whether :func:`analyse_weights`'s cache still holds ``plan`` (the object itself)."""
    with _CACHE_LOCK:
        return any(found is plan for _, found in _CACHE.values())


def analyse_weights(
    weights: np.ndarray,
    *,
    frame_shape: tuple[int, int] | None = None,
    force: bool = False,
) -> WeightPlan:
    """Analyse a stack of weight rows into a :class:`WeightPlan` (cached by content).

    Parameters
    ----------
    weights
        ``(n_rows, K)`` float64 weight rows.
    frame_shape
        ``(k_r, k_c)`` with ``k_r * k_c == K``; moment rows need it (without
        it the frames are one detector row of ``K`` pixels).
    force
        Take the structured part whenever rows have structure, whatever the
        cost estimate (tests of fragmented supports).

    Returns
    -------
    WeightPlan
        Shared between calls with equal rows: do not modify its arrays.
    """
    w = np.ascontiguousarray(weights, dtype=np.float64)
    # a cheap fingerprint finds the candidate; a full comparison (memcmp speed) confirms it
    sample = w.reshape(-1)[:: max(1, w.size // 4096)]
    finger = hashlib.blake2b(sample.tobytes(), digest_size=16).digest()
    key = (w.shape, finger, tuple(frame_shape) if frame_shape else None, force)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None and np.array_equal(hit[0], w):
            _CACHE.move_to_end(key)
            return hit[1]
    plan = _build(w, frame_shape, force)
    with _CACHE_LOCK:
        _CACHE[key] = (w.copy(), plan)
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return plan


@_jit
def _cells_int(frames, start, length, cell, rrow, rcol, acc, moments):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    # acc[i, q, c] (int64, exact): q = 0 sum, 1 row moment, 2 column moment of frame i
    # over cell c.  Four frames per run: each run's set-up and its scalar remainder
    # loop are shared by four frames (measured 1.2-1.3x one frame at a time).
    n = frames.shape[0]
    nruns = start.shape[0]
    acc[:] = 0
    n4 = n - n % 4
    for i in range(0, n4, 4):
        for t in range(nruns):
            s0 = start[t]
            ln = length[t]
            ce = cell[t]
            xa = frames[i, s0 : s0 + ln]
            xb = frames[i + 1, s0 : s0 + ln]
            xc = frames[i + 2, s0 : s0 + ln]
            xd = frames[i + 3, s0 : s0 + ln]
            sa = np.int64(0)
            sb = np.int64(0)
            sc = np.int64(0)
            sd = np.int64(0)
            if moments:
                ma = np.int64(0)
                mb = np.int64(0)
                mc = np.int64(0)
                md = np.int64(0)
                for p in range(ln):
                    va = np.int64(xa[p])
                    vb = np.int64(xb[p])
                    vc = np.int64(xc[p])
                    vd = np.int64(xd[p])
                    sa += va
                    sb += vb
                    sc += vc
                    sd += vd
                    ma += va * p
                    mb += vb * p
                    mc += vc * p
                    md += vd * p
                r = rrow[t]
                c0 = rcol[t]
                acc[i, 1, ce] += sa * r
                acc[i + 1, 1, ce] += sb * r
                acc[i + 2, 1, ce] += sc * r
                acc[i + 3, 1, ce] += sd * r
                acc[i, 2, ce] += ma + sa * c0
                acc[i + 1, 2, ce] += mb + sb * c0
                acc[i + 2, 2, ce] += mc + sc * c0
                acc[i + 3, 2, ce] += md + sd * c0
            else:
                for p in range(ln):
                    sa += np.int64(xa[p])
                    sb += np.int64(xb[p])
                    sc += np.int64(xc[p])
                    sd += np.int64(xd[p])
            acc[i, 0, ce] += sa
            acc[i + 1, 0, ce] += sb
            acc[i + 2, 0, ce] += sc
            acc[i + 3, 0, ce] += sd
    for i in range(n4, n):
        row = frames[i]
        for t in range(nruns):
            s0 = start[t]
            ln = length[t]
            ce = cell[t]
            x = row[s0 : s0 + ln]
            s = np.int64(0)
            mom = np.int64(0)
            for p in range(ln):
                v = np.int64(x[p])
                s += v
                mom += v * p
            acc[i, 0, ce] += s
            if moments:
                acc[i, 1, ce] += s * rrow[t]
                acc[i, 2, ce] += mom + s * rcol[t]


@_jit
def _cells_small_moments(frames, start, length, cell, rrow, rcol, acc):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    # _cells_int for 8- and 16-bit integers: within one run (at most MAX_RUN pixels)
    # the sum and the column moment fit int32 exactly (|value| <= 2**16:
    # 2**16 * 256 * 255 / 2 < 2**31), so the loop runs on 32-bit lanes (twice as
    # many per vector, measured 1.3-1.6x the int64 loop) and widens once per run.
    # With and without moments are two functions: one loop with a branch on
    # `moments` measured 1.3x slower.
    n = frames.shape[0]
    nruns = start.shape[0]
    acc[:] = 0
    n4 = n - n % 4
    for i in range(0, n4, 4):
        for t in range(nruns):
            s0 = start[t]
            ln = length[t]
            ce = cell[t]
            xa = frames[i, s0 : s0 + ln]
            xb = frames[i + 1, s0 : s0 + ln]
            xc = frames[i + 2, s0 : s0 + ln]
            xd = frames[i + 3, s0 : s0 + ln]
            sa = np.int32(0)
            sb = np.int32(0)
            sc = np.int32(0)
            sd = np.int32(0)
            ma = np.int32(0)
            mb = np.int32(0)
            mc = np.int32(0)
            md = np.int32(0)
            for p in range(ln):
                q = np.int32(p)
                va = np.int32(xa[p])
                vb = np.int32(xb[p])
                vc = np.int32(xc[p])
                vd = np.int32(xd[p])
                sa = np.int32(sa + va)
                sb = np.int32(sb + vb)
                sc = np.int32(sc + vc)
                sd = np.int32(sd + vd)
                ma = np.int32(ma + va * q)
                mb = np.int32(mb + vb * q)
                mc = np.int32(mc + vc * q)
                md = np.int32(md + vd * q)
            r = rrow[t]
            c0 = rcol[t]
            acc[i, 0, ce] += sa
            acc[i + 1, 0, ce] += sb
            acc[i + 2, 0, ce] += sc
            acc[i + 3, 0, ce] += sd
            acc[i, 1, ce] += np.int64(sa) * r
            acc[i + 1, 1, ce] += np.int64(sb) * r
            acc[i + 2, 1, ce] += np.int64(sc) * r
            acc[i + 3, 1, ce] += np.int64(sd) * r
            acc[i, 2, ce] += np.int64(ma) + np.int64(sa) * c0
            acc[i + 1, 2, ce] += np.int64(mb) + np.int64(sb) * c0
            acc[i + 2, 2, ce] += np.int64(mc) + np.int64(sc) * c0
            acc[i + 3, 2, ce] += np.int64(md) + np.int64(sd) * c0
    for i in range(n4, n):  # the last frames: the int64 loop, one frame at a time
        _cells_int(frames[i : i + 1], start, length, cell, rrow, rcol, acc[i : i + 1], True)


@_jit
def _cells_small_segments(  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    frames, gs, gl, grep, grow, gcol, gptr, gcomp, us, ul, uc, acc
):
    # _cells_small_moments over segments (_segments): one loop per segment takes
    # its sum and int32 column moment (no cell boundaries inside: long vector
    # loops, a quarter as many horizontal reductions); the cells' sums need only
    # the sub-runs of the segment's smaller cells, the largest one gets the rest.
    # Exact as _cells_small_moments: a segment has at most MAX_RUN pixels.
    # Measured 1.2-1.3x _cells_small_moments on BF + ADF + CoM (128 x 128 u16).
    n = frames.shape[0]
    ns = gs.shape[0]
    acc[:] = 0
    nm = 0  # the segments with moments come first
    while nm < ns and grep[nm] >= 0:
        nm += 1
    n4 = n - n % 4
    for i in range(0, n4, 4):
        for g in range(nm):  # with moments
            s0 = gs[g]
            ln = gl[g]
            cl = grep[g]
            xa = frames[i, s0 : s0 + ln]
            xb = frames[i + 1, s0 : s0 + ln]
            xc = frames[i + 2, s0 : s0 + ln]
            xd = frames[i + 3, s0 : s0 + ln]
            sa = np.int32(0)
            sb = np.int32(0)
            sc = np.int32(0)
            sd = np.int32(0)
            ma = np.int32(0)
            mb = np.int32(0)
            mc = np.int32(0)
            md = np.int32(0)
            for p in range(ln):
                q = np.int32(p)
                va = np.int32(xa[p])
                vb = np.int32(xb[p])
                vc = np.int32(xc[p])
                vd = np.int32(xd[p])
                sa = np.int32(sa + va)
                sb = np.int32(sb + vb)
                sc = np.int32(sc + vc)
                sd = np.int32(sd + vd)
                ma = np.int32(ma + va * q)
                mb = np.int32(mb + vb * q)
                mc = np.int32(mc + vc * q)
                md = np.int32(md + vd * q)
            r = grow[g]
            c0 = gcol[g]
            acc[i, 1, cl] += np.int64(sa) * r
            acc[i + 1, 1, cl] += np.int64(sb) * r
            acc[i + 2, 1, cl] += np.int64(sc) * r
            acc[i + 3, 1, cl] += np.int64(sd) * r
            acc[i, 2, cl] += np.int64(ma) + np.int64(sa) * c0
            acc[i + 1, 2, cl] += np.int64(mb) + np.int64(sb) * c0
            acc[i + 2, 2, cl] += np.int64(mc) + np.int64(sc) * c0
            acc[i + 3, 2, cl] += np.int64(md) + np.int64(sd) * c0
            for t in range(gptr[g], gptr[g + 1]):
                u0 = us[t]
                ue = u0 + ul[t]
                ya = frames[i, u0:ue]
                yb = frames[i + 1, u0:ue]
                yc = frames[i + 2, u0:ue]
                yd = frames[i + 3, u0:ue]
                ta = np.int32(0)
                tb = np.int32(0)
                tc = np.int32(0)
                td = np.int32(0)
                for p in range(ue - u0):
                    ta = np.int32(ta + np.int32(ya[p]))
                    tb = np.int32(tb + np.int32(yb[p]))
                    tc = np.int32(tc + np.int32(yc[p]))
                    td = np.int32(td + np.int32(yd[p]))
                ce = uc[t]
                acc[i, 0, ce] += ta
                acc[i + 1, 0, ce] += tb
                acc[i + 2, 0, ce] += tc
                acc[i + 3, 0, ce] += td
                sa = np.int32(sa - ta)
                sb = np.int32(sb - tb)
                sc = np.int32(sc - tc)
                sd = np.int32(sd - td)
            ce = gcomp[g]
            acc[i, 0, ce] += sa
            acc[i + 1, 0, ce] += sb
            acc[i + 2, 0, ce] += sc
            acc[i + 3, 0, ce] += sd
        for g in range(nm, ns):  # sums only: no branch on moments in the loop
            s0 = gs[g]
            ln = gl[g]
            xa = frames[i, s0 : s0 + ln]
            xb = frames[i + 1, s0 : s0 + ln]
            xc = frames[i + 2, s0 : s0 + ln]
            xd = frames[i + 3, s0 : s0 + ln]
            sa = np.int32(0)
            sb = np.int32(0)
            sc = np.int32(0)
            sd = np.int32(0)
            for p in range(ln):
                sa = np.int32(sa + np.int32(xa[p]))
                sb = np.int32(sb + np.int32(xb[p]))
                sc = np.int32(sc + np.int32(xc[p]))
                sd = np.int32(sd + np.int32(xd[p]))
            for t in range(gptr[g], gptr[g + 1]):
                u0 = us[t]
                ue = u0 + ul[t]
                ya = frames[i, u0:ue]
                yb = frames[i + 1, u0:ue]
                yc = frames[i + 2, u0:ue]
                yd = frames[i + 3, u0:ue]
                ta = np.int32(0)
                tb = np.int32(0)
                tc = np.int32(0)
                td = np.int32(0)
                for p in range(ue - u0):
                    ta = np.int32(ta + np.int32(ya[p]))
                    tb = np.int32(tb + np.int32(yb[p]))
                    tc = np.int32(tc + np.int32(yc[p]))
                    td = np.int32(td + np.int32(yd[p]))
                ce = uc[t]
                acc[i, 0, ce] += ta
                acc[i + 1, 0, ce] += tb
                acc[i + 2, 0, ce] += tc
                acc[i + 3, 0, ce] += td
                sa = np.int32(sa - ta)
                sb = np.int32(sb - tb)
                sc = np.int32(sc - tc)
                sd = np.int32(sd - td)
            ce = gcomp[g]
            acc[i, 0, ce] += sa
            acc[i + 1, 0, ce] += sb
            acc[i + 2, 0, ce] += sc
            acc[i + 3, 0, ce] += sd
    for i in range(n4, n):  # the last frames one at a time, in int64
        row = frames[i]
        for g in range(ns):
            s = np.int64(0)
            mom = np.int64(0)
            for p in range(gl[g]):
                v = np.int64(row[gs[g] + p])
                s += v
                mom += v * p
            cl = grep[g]
            if cl >= 0:
                acc[i, 1, cl] += s * grow[g]
                acc[i, 2, cl] += mom + s * gcol[g]
            for t in range(gptr[g], gptr[g + 1]):
                u = np.int64(0)
                for p in range(us[t], us[t] + ul[t]):
                    u += np.int64(row[p])
                acc[i, 0, uc[t]] += u
                s -= u
            acc[i, 0, gcomp[g]] += s


@_jit
def _cells_small_sums(frames, start, length, cell, acc):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    # _cells_small_moments without moments (only acc[:, 0]).
    n = frames.shape[0]
    nruns = start.shape[0]
    acc[:] = 0
    n4 = n - n % 4
    for i in range(0, n4, 4):
        for t in range(nruns):
            s0 = start[t]
            ln = length[t]
            ce = cell[t]
            xa = frames[i, s0 : s0 + ln]
            xb = frames[i + 1, s0 : s0 + ln]
            xc = frames[i + 2, s0 : s0 + ln]
            xd = frames[i + 3, s0 : s0 + ln]
            sa = np.int32(0)
            sb = np.int32(0)
            sc = np.int32(0)
            sd = np.int32(0)
            for p in range(ln):
                sa = np.int32(sa + np.int32(xa[p]))
                sb = np.int32(sb + np.int32(xb[p]))
                sc = np.int32(sc + np.int32(xc[p]))
                sd = np.int32(sd + np.int32(xd[p]))
            acc[i, 0, ce] += sa
            acc[i + 1, 0, ce] += sb
            acc[i + 2, 0, ce] += sc
            acc[i + 3, 0, ce] += sd
    for i in range(n4, n):
        row = frames[i]
        for t in range(nruns):
            s = np.int64(0)
            for p in range(start[t], start[t] + length[t]):
                s += np.int64(row[p])
            acc[i, 0, cell[t]] += s


@_jit
def _cells_real(frames, start, length, cell, rrow, rcol, acc, moments):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    # As _cells_int in float64 (real frames), one frame at a time (measured faster
    # than four for float conversions).
    n = frames.shape[0]
    nruns = start.shape[0]
    acc[:] = 0.0
    for i in range(n):
        row = frames[i]
        for t in range(nruns):
            s0 = start[t]
            ln = length[t]
            ce = cell[t]
            x = row[s0 : s0 + ln]
            s = 0.0
            if moments:
                mom = 0.0
                for p in range(ln):
                    v = np.float64(x[p])
                    s += v
                    mom += v * np.float64(p)
                acc[i, 1, ce] += s * np.float64(rrow[t])
                acc[i, 2, ce] += mom + s * np.float64(rcol[t])
            else:
                for p in range(ln):
                    s += np.float64(x[p])
            acc[i, 0, ce] += s


@_jit
def _combine(acc, kind, ptr, cells, outcol, scol, out):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    # Each structured row: the sum over its cells (mask), or its moment and, in column
    # scol, its sum (finish_moment_rows makes moment - offset * sum, outside compiled code).
    n = acc.shape[0]
    for i in range(n):
        for q in range(kind.shape[0]):
            s = acc[i, 0, 0] * 0  # the accumulators' type: int64 sums stay exact
            mom = acc[i, 0, 0] * 0
            kd = kind[q]
            for t in range(ptr[q], ptr[q + 1]):
                s += acc[i, 0, cells[t]]
                if kd != 0:
                    mom += acc[i, kd, cells[t]]
            if kd == 0:
                out[i, outcol[q]] = np.float64(s)
            else:
                out[i, outcol[q]] = np.float64(mom)
                out[i, scol[q]] = np.float64(s)


def _make_structured_segments(integer: int, moments: bool, fused: bool = True) -> Any:
    """The structured group loop compiled for one cell kernel (``integer`` mode, ``moments``).

    One function per mode instead of one taking the mode as an argument: Numba
    prunes the other modes' branches (closure constants) before typing, so a
    first pass compiles one cell kernel, not all five (first compute on a
    fresh install: benchmarks/RESULTS.md, "First use of the CPU kernels").
    ``fused``: the loop may run the fused kernel (general rows, patterns); a pass
    of structured rows alone (BF, ADF, CoM) takes ``False`` and compiles no
    fused kernel (~1.4 s of a first compute: three specialisations of it).
    """

    @_jit
    def structured_segments(  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
        frames,
        start,
        length,
        cell,
        rrow,
        rcol,
        kind,
        scol,
        ptr,
        cells,
        outcol,
        general,
        gweights,
        out,
        acc,
        gout,
        acc_sum,
        acc_max,
        do_sum,
        do_max,
        seg,
    ):
        # integer == 3: 8/16-bit integers with moment rows over the segments ``seg``
        # (WeightPlan.seg_arrays); otherwise ``seg`` is not read. ``integer`` and
        # ``moments`` are this closure's constants: the branches of other modes are pruned
        # before typing, so only the cell kernel this mode runs is compiled.
        n = frames.shape[0]
        g = acc.shape[0]
        ng = general.shape[0]
        for f0 in range(0, n, g):
            f1 = min(f0 + g, n)
            block = frames[f0:f1]
            a = acc[: f1 - f0]
            if kind.shape[0]:
                if integer == 3:
                    _cells_small_segments(
                        block, seg[0], seg[1], seg[2], seg[3], seg[4], seg[5], seg[6], seg[7],
                        seg[8], seg[9], a,
                    )  # fmt: skip
                elif integer == 2 and moments:
                    _cells_small_moments(block, start, length, cell, rrow, rcol, a)
                elif integer == 2:
                    _cells_small_sums(block, start, length, cell, a)
                elif integer == 1:
                    _cells_int(block, start, length, cell, rrow, rcol, a, moments)
                else:
                    _cells_real(block, start, length, cell, rrow, rcol, a, moments)
                _combine(a, kind, ptr, cells, outcol, scol, out[f0:f1])
            if fused:  # a closure constant: pruned before typing when False
                nb = f1 - f0
                zero = nb < 0  # False, not a literal: one specialisation of _fused for every call
                if ng and nb % 4:
                    # a short group goes through the fused kernel as a full group padded with zero
                    # frames: general rows then get the same values whatever the split of the frames
                    # into calls or chunks (the fused kernel compiled inside this one rounds a short
                    # group differently from a full one); the patterns run on the real frames only
                    nb4 = nb + 4 - nb % 4
                    padded = np.zeros((nb4, frames.shape[1]), dtype=frames.dtype)
                    # copied element by element: an array-to-array slice assignment compiles numba's
                    # shape-mismatch error formatting (~4-6 s of first JIT, string code included)
                    for i in range(nb):
                        for p in range(frames.shape[1]):
                            padded[i, p] = block[i, p]
                    go = np.empty((nb4, gout.shape[1]), dtype=np.float64)
                    _fused(padded, gweights, go, acc_sum, acc_max, zero, zero)
                    if do_sum or do_max:
                        none = np.empty((nb, 0), dtype=np.float64)
                        _fused(block, gweights[:0], none, acc_sum, acc_max, do_sum, do_max)
                    for i in range(nb):
                        for j in range(ng):
                            out[f0 + i, general[j]] = go[i, j]
                elif ng or do_sum or do_max:
                    go = gout[:nb]
                    _fused(block, gweights, go, acc_sum, acc_max, do_sum, do_max)
                    for i in range(nb):
                        for j in range(ng):
                            out[f0 + i, general[j]] = go[i, j]

    return structured_segments


#: The structured group loop per ``(integer mode, moments, fused)`` (compiled on first use).
_SEGMENTS = {
    (mode, moments, fused): _make_structured_segments(mode, moments, fused)
    for mode in range(4)
    for moments in (False, True)
    for fused in (False, True)
}
# by name, for compiled callers choosing among them with constants (packed_kernels)
_seg0f, _seg0t = _SEGMENTS[(0, False, True)], _SEGMENTS[(0, True, True)]
_seg1f, _seg1t = _SEGMENTS[(1, False, True)], _SEGMENTS[(1, True, True)]
_seg2f, _seg2t = _SEGMENTS[(2, False, True)], _SEGMENTS[(2, True, True)]


def plan_arrays(plan: WeightPlan) -> tuple[Any, ...]:
    """The plan's arrays the group loop takes after the frames (``moments`` among them)."""
    return (
        plan.run_start,
        plan.run_length,
        plan.run_cell,
        plan.run_row,
        plan.run_col,
        plan.need_moments,
        plan.srow_kind,
        plan.srow_scol,
        plan.srow_ptr,
        plan.srow_cells,
        plan.srow_out,
        plan.general,
    )


def integer_mode(dtype: np.dtype[Any], plan: WeightPlan | None = None) -> int:
    """The cell kernel for frames of ``dtype``.

    3: int32 segments (8/16-bit data and a ``plan`` with moment rows), 2: int32
    runs (8/16-bit), 1: int64 runs, 0: float64 runs.
    """
    if dtype.kind in "ui":
        if dtype.itemsize > 2:
            return 1
        return 3 if USE_SEGMENTS and plan is not None and plan.n_segments else 2
    return 0


def readonly(frames: np.ndarray) -> np.ndarray:
    """A read-only view: compiled kernels see one array type, however the frames were made.

    Numba compiles a kernel again for a writable and a read-only array of the
    same dtype (a memory map or a persisted chunk vs a reused read buffer);
    every caller passing read-only views keeps one specialisation per dtype.
    """
    if not frames.flags.writeable:
        return frames
    view = frames.view()
    view.flags.writeable = False
    return view


def group_frames(frame_nbytes: int) -> int:
    """Frames per group: about :data:`GROUP_BYTES`, a multiple of 4 (at least 4)."""
    g = GROUP_BYTES // max(frame_nbytes, 1)
    return int(max(4, g - g % 4))


def structured_pass(
    frames: np.ndarray,
    plan: WeightPlan,
    out: np.ndarray,
    acc_sum: np.ndarray,
    acc_max: np.ndarray,
    *,
    do_sum: bool,
    do_max: bool,
) -> None:
    """Run the structured part and the fused kernel on the general rows, group by group.

    Parameters
    ----------
    frames
        ``(n, K)`` C-contiguous frames (no float16).
    plan
        From :func:`analyse_weights`, with :meth:`WeightPlan.applicable` true.
    out
        ``(n, >= plan.n_out)`` float64, every ``out[:, :n_rows]`` written (moment rows
        finished by :func:`finish_moment_rows`, which this calls).
    acc_sum, acc_max
        The pattern accumulators of the fused kernel, updated in place.
    do_sum, do_max
        Accumulate the patterns.

    Groups start at multiples of 4 frames from the first frame, so the
    general rows are grouped exactly as by the fused kernel alone.
    Non-finite outputs are not repaired here (the caller runs
    :func:`~quantem_flow.runtimes.cpu.kernels.skip_zero_weights`).
    """
    n = frames.shape[0]
    if out.shape[1] < plan.n_out:
        raise ValueError(f"out has {out.shape[1]} columns, the plan writes {plan.n_out}")
    frames = readonly(frames)
    g = min(group_frames(frames.shape[1] * frames.itemsize), max(4, -(-n // 4) * 4))
    integer = integer_mode(frames.dtype, plan)
    acc = np.empty((g, 3, max(plan.n_cells, 1)), dtype=np.int64 if integer else np.float64)
    gout = np.empty((g, max(plan.general_weights.shape[0], 1)), dtype=np.float64)
    e = np.zeros(0, dtype=np.int64)
    arrays = plan_arrays(plan)
    fused = bool(plan.general.size or do_sum or do_max)
    run = _SEGMENTS[(integer, bool(plan.need_moments), fused)]
    run(
        frames,
        *arrays[:5],
        *arrays[6:],
        plan.general_weights,
        out,
        acc,
        gout,
        acc_sum,
        acc_max,
        do_sum,
        do_max,
        plan.seg_arrays if integer == 3 else (e,) * 10,
    )
    finish_moment_rows(out, plan)
