r"""Single-sideband (SSB) ptychography, out of core.

Physics and conventions
-----------------------
Data are ``I[R_r, R_c, k_r, k_c]``.  The probe is
``psi_p(r) = IFT[A(k) exp(-i chi(k))]`` with the top-hat aperture
``A(k) = 1`` for ``lambda |k| < alpha`` (``alpha`` = ``semiangle_mrad``) and
the aberration phase, in the polar notation of Krivanek (``theta = lambda |k|``
in rad, ``phi = atan2(k_r, k_c)``: the azimuth measured from the scan column
axis toward the scan row axis)::

    chi(k) = (2 pi / lambda) * [ C10 theta^2 / 2
                                 + C12 theta^2 / 2 * cos(2 (phi - phi12))
                                 + sum C_nm theta^(n+1) / (n+1) * cos(m (phi - phi_nm)) ]

with ``C10 = defocus_A`` and ``C12 = astigmatism_A``, ``phi12 =
astigmatism_angle_deg`` (all lengths in Å, angles in degrees at the API).
With this sign, a positive ``C10`` adds a positive quadratic phase to
``chi`` (abTEM's ``defocus`` is ``-C10``).  The exit wave at probe position
``R`` is ``psi_p(r - R) O(r)``, its far field
``Psi(k) = sum_r psi(r) exp(-2 pi i k.r)`` and ``I = |Psi|^2``.

Transforming over the scan, ``G(Q, k) = sum_R I(R, k) exp(-2 pi i Q.R)``
(a scan frequency ``Q`` in 1/Å corresponds to the angle ``lambda Q``), and
keeping the terms linear in ``O - 1`` (the weak-object model)::

    G(Q, k) ~ A*(k) A(k - Q) exp(..) c(Q) + A(k) A*(k + Q) exp(..) conj(c(-Q))

where ``c`` are the Fourier coefficients of ``O - 1`` and the ``A`` include
``exp(-i chi)``.  In trotter T1 (the disk overlaps its copy shifted by
``+Q`` but not by ``-Q``) only the first term lives, in T2 only the second.
Per frequency, ``c(Q)`` is the aberration-corrected average of
``G / A*(k)A(k-Q)`` over T1 together with the conjugate of the T2 average at
``-Q``; ``O = 1 + IFT(c)``.  The *double-overlap loss* is
``sum |G - model|^2 / sum |G|^2`` over both trotters of every frequency: 0
for data that follow the model exactly, and it rises when the aberrations
(for example the defocus) are wrong.

Detector-to-scan mapping: a detector-frame angle ``(g_r, g_c)`` (pixel
offset from the centre times the detector sampling) is transposed first
when ``transpose`` is set (``(g_c, g_r)``) and then rotated, as in
:mod:`quantem_flow.operators.dpc`::

    v_r = cos(theta) g_r - sin(theta) g_c
    v_c = sin(theta) g_r + cos(theta) g_c

Out of core
-----------
Pass 1 is an ordinary one-pass plan (:class:`~.base.ChunkPlan` with
``gather`` = the bright-field pixel indices), so SSB shares its pass with
every other operator over the dataset.  The finalize then reads the gathered
``(n_pixels, R_r, R_c)`` array (a disk-backed memory map when large) in
blocks of ``pixel_block`` pixels, transforms each block over the scan on the
chosen runtime and accumulates per-frequency sums: memory holds one block of
spectra plus a few scan-sized arrays.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
import time
import tracemalloc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ...calibration import Axis
from ...dataset import Dataset4D
from ...errors import DtypeError, ParameterError
from ...results import ComplexObject
from ...runtimes import resolve_backend
from ...runtimes.array_ops import (
    Aberrations,
    PartialSums,
    make_ops,
    prewarm,
)
from ...runtimes.registry import get_spec
from ..base import (
    ChunkOperator,
    ChunkPlan,
    LazyResult,
    PassOutputs,
    PlanContext,
    make_provenance,
)
from ..probe import ProbeEstimate
from .fit import AberrationFit, loss_reading
from .geometry import GeometryChecks, SSBGeometry
from .parameters import (
    Pair,
    _finite,
    _fit_names,
    _pair,
    _parse_aberrations,
)
from .stages import ELEMENTWISE_ELEMENTS, QGrid, assemble, block_sums

__all__ = ["SSB", "SSBGeometry", "SSBParams", "ssb"]


class SSB(GeometryChecks, AberrationFit, ChunkOperator):
    """Single-sideband ptychography; see :func:`ssb` for the parameters."""

    name: ClassVar[str] = "ssb"

    def __init__(self, params: Any = None, /, **kwargs: Any) -> None:
        p = _ssb_params(params, kwargs)
        self.params = p
        kv = _finite(p.voltage_kV, "voltage_kV")
        if not kv > 0:
            raise ParameterError(
                f"voltage_kV must be > 0 (the accelerating voltage, e.g. 300), got {p.voltage_kV!r}"
            )
        alpha = _finite(p.semiangle_mrad, "semiangle_mrad")
        if not alpha > 0:
            raise ParameterError(
                f"semiangle_mrad must be > 0 (the probe-forming aperture's semiangle, e.g. 20), "
                f"got {p.semiangle_mrad!r}"
            )
        self.voltage_kV = kv
        self.semiangle_mrad = alpha
        self.scan_step_A = None if p.scan_step_A is None else _pair(p.scan_step_A, "scan_step_A")
        if isinstance(p.detector_sampling_mrad, str):
            if p.detector_sampling_mrad not in ("auto", "calibration", "bf_disk"):
                raise ParameterError(
                    "detector_sampling_mrad must be a size in mrad, (row, col) sizes, None/'auto', "
                    f"'calibration' or 'bf_disk', got {p.detector_sampling_mrad!r}"
                )
            self.detector_sampling: tuple[float, float] | str = p.detector_sampling_mrad
        elif p.detector_sampling_mrad is None:
            self.detector_sampling = "auto"
        else:
            self.detector_sampling = _pair(p.detector_sampling_mrad, "detector_sampling_mrad")
        self.rotation_deg = _finite(p.rotation_deg, "rotation_deg")
        if not isinstance(p.transpose, (bool, np.bool_)):
            raise ParameterError(f"transpose must be True or False, got {p.transpose!r}")
        self.transpose = bool(p.transpose)
        self.defocus_A = _finite(p.defocus_A, "defocus_A")
        self.astigmatism_A = _finite(p.astigmatism_A, "astigmatism_A")
        if self.astigmatism_A < 0:
            raise ParameterError(
                f"astigmatism_A is a magnitude (>= 0), got {p.astigmatism_A!r}; a negative "
                "astigmatism is the positive one turned by 90 degrees (add 90 to "
                "astigmatism_angle_deg)"
            )
        self.astigmatism_angle_deg = _finite(p.astigmatism_angle_deg, "astigmatism_angle_deg")
        self.extra_coeffs, self.extra_angles = _parse_aberrations(p.aberrations)
        self.aberrations_given = dict(p.aberrations or {})
        if not 0 < float(p.bf_threshold) < 1:
            raise ParameterError(f"bf_threshold must be in (0, 1), got {p.bf_threshold!r}")
        self.bf_threshold = float(p.bf_threshold)
        if not (math.isfinite(float(p.bf_radius_factor)) and float(p.bf_radius_factor) > 0):
            raise ParameterError(f"bf_radius_factor must be > 0, got {p.bf_radius_factor!r}")
        self.bf_radius_factor = float(p.bf_radius_factor)
        self.center = p.center
        if p.probe is not None and not isinstance(p.probe, ProbeEstimate):
            raise ParameterError(
                f"probe must be a ProbeEstimate (from find_probe), got {type(p.probe).__name__}"
            )
        self.probe = p.probe
        if p.pad_to is None:
            self.pad_to: tuple[int, int] | None = None
        else:
            size = list(p.pad_to)
            if len(size) != 2 or not all(isinstance(v, (int, np.integer)) and v > 0 for v in size):
                raise ParameterError(
                    f"pad_to must be (rows, cols) positive integers, got {p.pad_to!r}"
                )
            self.pad_to = (int(size[0]), int(size[1]))
        self.fit_names = _fit_names(p.fit_aberrations)
        for label, value in (
            ("fit_max_pixels", p.fit_max_pixels),
            ("fit_max_evaluations", p.fit_max_evaluations),
            ("pixel_block", p.pixel_block),
        ):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ParameterError(f"{label} must be an integer >= 1, got {value!r}")
        self.fit_max_pixels = int(p.fit_max_pixels)
        self.fit_max_evaluations = int(p.fit_max_evaluations)
        self.pixel_block = int(p.pixel_block)
        self.allow_complex64 = bool(p.allow_complex64)
        if not isinstance(p.allow_implausible, (bool, np.bool_)):
            raise ParameterError(
                f"allow_implausible must be True or False, got {p.allow_implausible!r}"
            )
        self.allow_implausible = bool(p.allow_implausible)
        self.backend = p.backend
        self.choice = resolve_backend(
            p.backend, operation="ssb", allow_complex64=self.allow_complex64
        )

    # -- parameters as given -------------------------------------------------------------
    def parameters(self) -> dict[str, Any]:
        """Parameters as given, with units."""
        return {
            "voltage_kV": self.voltage_kV,
            "semiangle_mrad": self.semiangle_mrad,
            "scan_step_A": None if self.scan_step_A is None else list(self.scan_step_A),
            "detector_sampling_mrad": self.detector_sampling
            if isinstance(self.detector_sampling, str)
            else list(self.detector_sampling),
            "rotation_deg": self.rotation_deg,
            "transpose": self.transpose,
            "defocus_A": self.defocus_A,
            "astigmatism_A": self.astigmatism_A,
            "astigmatism_angle_deg": self.astigmatism_angle_deg,
            "aberrations": self.aberrations_given,
            "bf_threshold": self.bf_threshold,
            "bf_radius_factor": self.bf_radius_factor,
            "center": self.center
            if isinstance(self.center, str)
            else [float(v) for v in self.center],
            "pad_to": None if self.pad_to is None else list(self.pad_to),
            "fit_aberrations": list(self.fit_names),
            "fit_max_pixels": self.fit_max_pixels,
            "fit_max_evaluations": self.fit_max_evaluations,
            "pixel_block": self.pixel_block,
            "backend": self.backend,
            "allow_complex64": self.allow_complex64,
            "allow_implausible": self.allow_implausible,
        }

    # -- resolution ----------------------------------------------------------------------
    def aberrations(self, c10: float, c12: float, phi12_deg: float) -> Aberrations:
        """The aberrations with the given C10, C12 (Å) and phi12 (deg), plus the extras."""
        terms: dict[tuple[int, int], tuple[float, float]] = {
            (1, 0): (c10, 0.0),
            (1, 2): (c12, math.radians(phi12_deg)),
        }
        for key, value in self.extra_coeffs.items():
            terms[key] = (value, math.radians(self.extra_angles.get(key, 0.0)))
        return Aberrations(terms)

    def validate(self, ds: Dataset4D) -> None:
        """Check units and shapes against the dataset (reads nothing)."""
        if ds.dtype.kind not in "uif":
            raise DtypeError(f"SSB needs real intensities (integer or float), got dtype {ds.dtype}")
        cal = ds.calibration
        self._check_voltage(cal)
        self._scan_step(cal)
        self._check_detector(cal)
        if self.pad_to is not None:
            R, C = ds.scan_shape
            if self.pad_to[0] < R or self.pad_to[1] < C:
                raise ParameterError(
                    f"pad_to={list(self.pad_to)} is smaller than the scan {[R, C]}; padding "
                    "never crops: give pad_to >= the scan shape on both axes (or None)"
                )
            # the padded object, its FFT accumulators and the transfer function are complex128
            need = 4 * 16 * self.pad_to[0] * self.pad_to[1]
            try:
                import importlib

                ram = int(importlib.import_module("psutil").virtual_memory().total)
            except (ImportError, OSError):  # pragma: no cover - psutil comes with distributed
                ram = need
            if need > ram:
                raise ParameterError(
                    f"pad_to={list(self.pad_to)} needs about {need / 2**30:.1f} GiB for the "
                    f"padded complex FFT grids, more than this machine's {ram / 2**30:.1f} GiB; "
                    f"give a pad_to closer to the scan shape {[R, C]}"
                )

    def plan(self, ctx: PlanContext) -> ChunkPlan:
        """Gather the bright-field pixels in the shared pass; reconstruct in the finalize."""
        ds = ctx.dataset
        # the runtime must declare the SSB stage for the gathered values' dtype
        self.choice = resolve_backend(
            self.backend, operation="ssb", allow_complex64=self.allow_complex64, dtype=ds.dtype
        )
        geo, notes = self.geometry(ctx)
        params = {"given": self.parameters(), **geo.record}
        prewarm(self.choice.chosen)  # the compiled CPU stage loads while the pass runs

        def finalize(out: PassOutputs) -> ComplexObject:
            return self._finalize(ds, geo, params, list(notes), out)

        return ChunkPlan(
            weights={},
            want_sum=False,
            want_max=False,
            parameters=params,
            finalize=finalize,
            gather=geo.indices,
        )

    # -- the reconstruction --------------------------------------------------------------
    def _finalize(
        self,
        ds: Dataset4D,
        geo: SSBGeometry,
        params: dict[str, Any],
        notes: list[str],
        out: PassOutputs,
    ) -> ComplexObject:
        t0 = time.perf_counter()
        started_tracing = not tracemalloc.is_tracing()
        if started_tracing:
            tracemalloc.start()
        else:
            tracemalloc.reset_peak()
        traced0 = tracemalloc.get_traced_memory()[0]
        try:
            result = self._reconstruct(ds, geo, params, notes, out)
        finally:
            traced_peak = tracemalloc.get_traced_memory()[1]
            if started_tracing:
                tracemalloc.stop()
        rss_bytes: int | None = None
        try:
            import resource  # Unix only

            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            rss_bytes = int(rss if sys.platform == "darwin" else rss * 1024)
        except ImportError:  # pragma: no cover - Windows
            pass
        result.provenance.parameters["memory"] = {
            **result.provenance.parameters.get("memory", {}),
            "ssb_stage_peak_traced_bytes": int(traced_peak - traced0),
            "tracemalloc": "host allocations traced during the SSB stage (NumPy/SciPy buffers; "
            "memory-mapped pages and device memory are not counted)"
            + ("" if started_tracing else "; tracing was already on, its peak was reset"),
            "process_peak_rss_bytes": rss_bytes,
            "process_peak_rss": "resource.getrusage(RUSAGE_SELF).ru_maxrss: the process's "
            "lifetime peak, an upper bound",
        }
        result.provenance.timings["ssb_stage_s"] = time.perf_counter() - t0
        return result

    def _reconstruct(
        self,
        ds: Dataset4D,
        geo: SSBGeometry,
        params: dict[str, Any],
        notes: list[str],
        out: PassOutputs,
    ) -> ComplexObject:
        if out.gathered is None or out.gather_indices is None:
            raise ParameterError("internal error: the pass returned no gathered pixels for SSB")
        gidx = np.asarray(out.gather_indices)
        rows = np.searchsorted(gidx, geo.indices)
        if rows.size and (rows.max() >= gidx.size or np.any(gidx[rows] != geo.indices)):
            raise ParameterError("internal error: the gathered pixels do not hold SSB's pixels")
        gathered = out.gathered
        R, C = ds.scan_shape
        fft_shape = self.pad_to or (R, C)
        grid = QGrid.build(fft_shape, geo.scan_step_A, geo.wavelength_A, geo.alpha_rad)
        ops = make_ops(self.choice.chosen)
        timings: dict[str, float] = {"ssb_read_s": 0.0, "ssb_fft_accumulate_s": 0.0}

        # per-pixel scan means come with each block; a pixel whose mean is not > 0 is dead
        def load(sel: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            t = time.perf_counter()
            if sel.size and sel[-1] - sel[0] + 1 == sel.size:
                block = np.asarray(gathered[int(sel[0]) : int(sel[-1]) + 1])
            else:
                block = np.asarray(gathered[sel])
            means = block.reshape(block.shape[0], -1).mean(axis=1, dtype=np.float64)
            good = np.isfinite(means) & (means > 0)
            timings["ssb_read_s"] += time.perf_counter() - t
            return block, means, good

        c10, c12, phi12 = self.defocus_A, self.astigmatism_A, self.astigmatism_angle_deg
        fit_record: dict[str, Any] | None = None
        if self.fit_names:
            t = time.perf_counter()
            c10, c12, phi12, fit_record = self._fit(ops, grid, geo, rows, load)
            timings["ssb_fit_s"] = time.perf_counter() - t
        ab = self.aberrations(c10, c12, phi12)

        sums = PartialSums.zeros(grid.band_shape)
        n_dead = 0
        n_blocks = 0
        for b0 in range(0, rows.size, self.pixel_block):
            sel = rows[b0 : b0 + self.pixel_block]
            block, means, good = load(sel)
            v_r, v_c = geo.v_r[b0 : b0 + self.pixel_block], geo.v_c[b0 : b0 + self.pixel_block]
            if not good.all():
                n_dead += int((~good).sum())
                block, means, v_r, v_c = block[good], means[good], v_r[good], v_c[good]
            if block.shape[0] == 0:
                continue
            t = time.perf_counter()
            with ops.lock():
                part = block_sums(ops, block, 1.0 / means, v_r, v_c, grid, ab, geo.wavelength_A)
            timings["ssb_fft_accumulate_s"] += time.perf_counter() - t
            sums.add(part)
            n_blocks += 1
            del block
        if n_dead:
            notes.append(
                f"{n_dead} bright-field pixel(s) had a scan mean <= 0 (dead) and were left out"
            )
        t = time.perf_counter()
        coeff, loss = assemble(sums, grid)
        obj_full = 1.0 + np.fft.ifft2(coeff) * (fft_shape[0] * fft_shape[1])
        obj = np.ascontiguousarray(obj_full[:R, :C], dtype=np.complex128)
        timings["ssb_assemble_s"] = time.perf_counter() - t

        lam = geo.wavelength_A
        band_A = 2 * geo.alpha_rad / lam
        nyquist = [1 / (2 * s) for s in geo.scan_step_A]
        if min(nyquist) < band_A:
            notes.append(
                f"the scan undersamples the SSB band: Nyquist {[round(v, 4) for v in nyquist]} "
                f"1/Å < 2 alpha / lambda = {band_A:.4f} 1/Å; object frequencies beyond Nyquist "
                "alias (a smaller scan step avoids it)"
            )
        params = {
            **params,
            "aberrations_used": {
                "C10_A": c10,
                "C12_A": c12,
                "phi12_deg": phi12,
                **{f"C{n}{m}_A": v for (n, m), v in self.extra_coeffs.items()},
                **{f"phi{n}{m}_deg": v for (n, m), v in self.extra_angles.items()},
                "convention": "chi = (2 pi / lambda) sum C_nm theta^(n+1)/(n+1) cos(m (phi - "
                "phi_nm)), phi = atan2(k_r, k_c); probe = IFT[A exp(-i chi)]",
                "source": "fitted" if fit_record else "given",
                "phase_path": "none (all zero)"
                if ab.is_zero
                else (
                    "quadratic (C10, C12): separable per-pixel phase ramp x exp(i chi(q))"
                    if ab.is_quadratic
                    else "general: chi evaluated at every (pixel, frequency)"
                ),
            },
            "padding": {
                "pad_to": None if self.pad_to is None else list(self.pad_to),
                "fft_shape": list(fft_shape),
                "scan_shape": [R, C],
                "mode": "none (FFT over the scan as it is; periodic boundary)"
                if self.pad_to is None
                else "each pixel's normalised series (I / mean - 1, zero mean) padded with "
                "zeros at the end of each axis (= padding with the pixel's mean intensity); "
                "the object is returned on the scan's own [0, R) x [0, C) grid, the padded "
                "margin (no data) is discarded",
            },
            "normalisation": "each pixel's series divided by its scan mean; O = 1 + IFT(c), "
            "c(0) = 0 (the mean of O - 1 is not measured by SSB)",
            "frequencies": {
                "band_limit_1_per_A": band_A,
                "band_rule": "trotters exist for 0 < lambda |Q| < 2 alpha; rows/columns with "
                "|lambda Q_r| or |lambda Q_c| >= 2 alpha are skipped",
                "band_rows": int(grid.rows.size),
                "band_cols_half_plane": int(grid.cols.size),
                "scan_nyquist_1_per_A": nyquist,
                "estimated": loss["frequencies_estimated"],
                "total": loss["frequencies_total"],
            },
            "double_overlap_loss": loss["loss"],
            "loss_definition": "sum |F - model|^2 / sum |F|^2 over both trotters of every "
            "frequency (F: normalised scan spectra)",
            "fit": fit_record,
            "ssb_backend": {
                **self.choice.to_dict(),
                **ops.describe(),
                "elementwise_sub_block_elements": ELEMENTWISE_ELEMENTS,
            },
            "blocks": {
                "pixel_block": self.pixel_block,
                "n_blocks": n_blocks,
                "n_pixels": int(geo.indices.size),
                "n_dead_pixels": n_dead,
            },
            "gathered": {
                "storage": "disk-backed memory map"
                if isinstance(gathered, np.memmap)
                else "in memory",
                "shape": list(np.shape(gathered)),
                "dtype": str(np.asarray(gathered[:0]).dtype),
                "nbytes": int(np.prod(np.shape(gathered))) * ds.dtype.itemsize,
            },
            "memory": {
                "bound": "one block of spectra + O(scan) arrays",
                "block_spectra_bytes": int(
                    min(self.pixel_block, geo.indices.size)
                    * grid.half_shape[0]
                    * grid.half_shape[1]
                    * 16
                ),
            },
        }
        params["quality"] = loss_reading(float(loss["loss"]))
        notes.append(f"quality: {params['quality']['reading']}")
        complex64 = get_spec(self.choice.chosen).array_ops_precision != "complex128"
        if complex64:
            notes.append(
                f"SSB FFT stage ran in complex64 on {self.choice.chosen} (allow_complex64=True); "
                "sums across blocks in complex128"
            )
        prov = make_provenance(
            ds,
            operator="ssb",
            parameters=params,
            outputs=out,
            accumulation_dtype="complex128"
            if not complex64
            else f"complex64 within blocks ({self.choice.chosen}), complex128 across blocks",
            notes=notes,
        )
        prov.timings.update(timings)
        axes = (
            Axis("scan_row", R, geo.scan_step_A[0], "Å", 0.0),
            Axis("scan_col", C, geo.scan_step_A[1], "Å", 0.0),
        )
        return ComplexObject(data=obj, units="1", axes=axes, provenance=prov)


def ssb(
    ds: Dataset4D,
    *,
    voltage_kV: float,
    semiangle_mrad: float,
    scan_step_A: Pair | None = None,
    detector_sampling_mrad: Pair | str | None = None,
    rotation_deg: float = 0.0,
    transpose: bool = False,
    defocus_A: float = 0.0,
    astigmatism_A: float = 0.0,
    astigmatism_angle_deg: float = 0.0,
    aberrations: Mapping[str, float] | None = None,
    bf_threshold: float = 0.5,
    bf_radius_factor: float = 1.0,
    center: str | Sequence[float] = "auto",
    probe: ProbeEstimate | None = None,
    pad_to: Sequence[int] | None = None,
    fit_aberrations: bool | Sequence[str] = False,
    fit_max_pixels: int = 128,
    fit_max_evaluations: int = 200,
    pixel_block: int = 256,
    backend: str = "auto",
    allow_complex64: bool = False,
    allow_implausible: bool = False,
    name: str | None = None,
) -> LazyResult:
    r"""Single-sideband ptychography: the complex transmission function over the scan.

    The model, signs and conventions are in the module docstring
    (:mod:`quantem_flow.operators.ssb.operator`): the aberration phase is
    ``chi(k) = (2 pi / lambda) [C10 theta^2 / 2 + C12 theta^2 / 2 cos(2 (phi -
    phi12)) + ...]`` (``theta = lambda |k|`` in rad, ``phi = atan2(k_r, k_c)``),
    and the probe is ``IFT[A(k) exp(-i chi(k))]``.

    Parameters
    ----------
    ds
        The dataset ``I[R_r, R_c, k_r, k_c]`` (real intensities).
    voltage_kV
        Accelerating voltage (kV, > 0); must agree with the calibration's when
        it has one.
    semiangle_mrad
        Probe-forming aperture semiangle ``alpha`` (mrad, > 0).
    scan_step_A
        Scan step (row, col) or one number, in Å.  ``None``: from the
        dataset's scan calibration, which must be a length (a ``px`` scan is
        a :class:`~quantem_flow.errors.CalibrationError`).  Given and
        calibrated values must agree.
    detector_sampling_mrad
        Detector pixel size in mrad (one number or (row, col)); ``None`` /
        ``"auto"``: from a calibrated detector (mrad, or 1/Å converted with
        ``voltage_kV``), else DERIVED from the bright-field disk as
        ``semiangle_mrad / radius_px`` (recorded as derived, with a note);
        ``"calibration"``: require the calibration; ``"bf_disk"``: always
        derive.  A given value that disagrees with the calibration raises.
    rotation_deg, transpose
        Detector-to-scan mapping (transpose first, then rotate; as
        :func:`~quantem_flow.operators.dpc.dpc`).
    defocus_A
        ``C10`` in Å (sign as in the module docstring).
    astigmatism_A, astigmatism_angle_deg
        Two-fold astigmatism ``C12`` (Å, a magnitude >= 0) and its angle
        ``phi12`` (degrees, from the scan column axis toward the row axis).
    aberrations
        More axial aberrations: ``{"C30": Å, "C23": Å, "phi23_deg": deg, ...}``.
    bf_threshold
        Segmentation threshold of the probe estimate (see
        :func:`~quantem_flow.operators.probe.estimate_probe`).
    bf_radius_factor
        Bright-field pixels are those within ``bf_radius_factor`` x the probe
        radius of the centre AND inside the aperture; only they are gathered.
    center
        ``"auto"``, ``"probe"``, ``"calibration"`` or ``(row, col)`` px.
    probe
        A precomputed :class:`~quantem_flow.operators.probe.ProbeEstimate`.
    pad_to
        FFT size ``(rows, cols)`` over the scan (>= the scan shape), padding
        each pixel's zero-mean series at the end; recorded.  Default: no
        padding (any scan shape works).
    fit_aberrations
        ``True`` (C10, C12 and phi12), ``False``, or names among ``"C10"``/
        ``"defocus_A"``, ``"C12"``/``"astigmatism_A"``, ``"phi12"``/
        ``"astigmatism_angle_deg"``: minimise the double-overlap loss with
        Nelder-Mead from the given values (fixed initial simplex, steps of
        ``lambda / alpha^2``), on ``fit_max_pixels`` evenly spaced pixels and
        at most ``fit_max_evaluations`` loss evaluations.
    fit_max_pixels, fit_max_evaluations
        Bounds of the fit's cost (recorded).
    pixel_block
        Detector pixels transformed together (memory: one block of
        ``pixel_block x R x (C/2 + 1)`` complex spectra).
    backend
        Runtime of the FFT/accumulation stage: ``"auto"`` (cuda, else cpu;
        mps only with ``allow_complex64``), ``"cpu"``, ``"cuda"`` or ``"mps"``.
    allow_complex64
        Allow a runtime without complex128 FFT (MLX) to compute in complex64.
    allow_implausible
        Reconstruct even when ``semiangle_mrad`` disagrees with the
        bright-field disk measured from the data (probe radius x detector
        sampling; tolerance
        :data:`~quantem_flow.operators.ssb.parameters.SEMIANGLE_RTOL` of the
        measured radius plus one pixel), which otherwise raises
        :class:`~quantem_flow.errors.ImplausibleParameterError`; recorded in
        the provenance and warned about.  Nothing is compared when the
        detector sampling is derived from the disk itself.
    name
        Label of the result (default ``"ssb"``).

    Returns
    -------
    LazyResult
        A lazy :class:`~quantem_flow.results.ComplexObject`: complex128
        ``(R_r, R_c)``, units ``"1"`` (transmission function), axes in Å;
        ``.phase`` in rad and ``.amplitude``.  Its provenance holds every
        input with units, how the detector sampling was obtained, the
        bright-field selection, rotation/transpose, padding, the
        double-overlap loss, the fit, peak memory and timings.
    """
    if not isinstance(ds, Dataset4D):
        raise ParameterError(
            f"expected a Dataset4D (from quantem_flow.open), got {type(ds).__name__}"
        )
    given = locals()
    op = SSB(SSBParams(**{f.name: given[f.name] for f in dataclasses.fields(SSBParams)}))
    return LazyResult(op, dataset=ds, name=name or "ssb")


def _params_class() -> Any:
    """:class:`SSBParams`: a frozen dataclass made from :func:`ssb`'s keyword parameters.

    The parameters are declared once, in :func:`ssb`'s signature and
    docstring; the operator (:class:`SSB`) and the pipeline schema read them
    from there.
    """
    fields: list[Any] = []
    for param in inspect.signature(ssb).parameters.values():
        if param.kind is not inspect.Parameter.KEYWORD_ONLY or param.name == "name":
            continue
        if param.default is inspect.Parameter.empty:
            fields.append((param.name, param.annotation))
        else:
            fields.append((param.name, param.annotation, dataclasses.field(default=param.default)))
    cls = dataclasses.make_dataclass("SSBParams", fields, frozen=True, kw_only=True, eq=False)
    cls.__module__ = __name__
    cls.__doc__ = (
        "The parameters of single-sideband ptychography, as :func:`ssb` takes them "
        "(names, defaults, units and meanings are its signature and docstring). "
        "``SSB(SSBParams(...))`` is ``SSB(**keywords)``."
    )
    return cls


#: The parameters of :func:`ssb` as one frozen dataclass (see :func:`_params_class`).
SSBParams: Any = _params_class()


def _ssb_params(params: Any, keywords: dict[str, Any]) -> Any:
    """An :class:`SSBParams` from one given, or from keywords (named errors, not TypeErrors)."""
    if params is not None:
        if keywords:
            raise ParameterError(
                f"give SSB either an SSBParams or keywords, not both (keywords: {sorted(keywords)})"
            )
        if not isinstance(params, SSBParams):
            raise ParameterError(
                f"SSB takes an SSBParams (or keywords), got {type(params).__name__}"
            )
        return params
    known = [f.name for f in dataclasses.fields(SSBParams)]
    unknown = sorted(set(keywords) - set(known))
    if unknown:
        raise ParameterError(f"unknown SSB parameter(s) {unknown}; the parameters are {known}")
    missing = [
        f.name
        for f in dataclasses.fields(SSBParams)
        if f.default is dataclasses.MISSING and f.name not in keywords
    ]
    if missing:
        raise ParameterError(f"SSB needs {missing} (e.g. voltage_kV=300, semiangle_mrad=20)")
    return SSBParams(**keywords)
