"""Where SSB's numbers come from: scan step, detector sampling, centre and the bright field.

:class:`SSBGeometry` holds what the plan resolved; :class:`GeometryChecks` is
the part of the :class:`~quantem_flow.operators.ssb.operator.SSB` operator
that resolves it (a mixin: the checks of the voltage, the scan step and the
detector calibration, the detector sampling from the calibration or the
bright-field disk, the semiangle against the disk, and :meth:`GeometryChecks.geometry`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...calibration import Calibration, electron_wavelength_angstrom, length_scale
from ...errors import CalibrationError, ImplausibleParameterError, ParameterError
from ...provenance import array_identity
from ..base import PlanContext
from ..geometry import allow_implausible_note, detector_distance, resolve_center
from ..probe import ProbeEstimate, find_probe
from .parameters import _RTOL, SEMIANGLE_RTOL, _close

__all__ = ["GeometryChecks", "SSBGeometry"]


@dataclasses.dataclass
class SSBGeometry:
    """Everything SSB resolved at plan time (pixels, angles, units).

    Attributes
    ----------
    indices
        Sorted flat detector indices of the bright-field pixels used.
    v_r, v_c
        Their scan-frame angles (rad).
    wavelength_A
        Electron wavelength.
    alpha_rad
        Aperture semiangle.
    scan_step_A
        Scan step (row, col) in Å.
    detector_mrad
        Detector pixel size (row, col) in mrad.
    record
        Provenance of every choice.
    """

    indices: np.ndarray
    v_r: np.ndarray
    v_c: np.ndarray
    wavelength_A: float
    alpha_rad: float
    scan_step_A: tuple[float, float]
    detector_mrad: tuple[float, float]
    record: dict[str, Any]


class GeometryChecks:
    """The geometry part of the SSB operator (a mixin; the attributes are the operator's)."""

    voltage_kV: float
    semiangle_mrad: float
    scan_step_A: tuple[float, float] | None
    detector_sampling: tuple[float, float] | str
    rotation_deg: float
    transpose: bool
    center: str | Sequence[float]
    probe: ProbeEstimate | None
    bf_threshold: float
    bf_radius_factor: float
    allow_implausible: bool

    def _check_voltage(self, cal: Calibration) -> None:
        kv = cal.accelerating_voltage_kV
        if kv is not None and not math.isclose(kv, self.voltage_kV, rel_tol=_RTOL):
            raise CalibrationError(
                f"voltage_kV={self.voltage_kV} disagrees with the dataset calibration's "
                f"accelerating_voltage_kV={kv}; give one consistent value (fix the calibration "
                "with ds.with_calibration(accelerating_voltage_kV=...) or pass the same voltage)"
            )

    def _scan_step(self, cal: Calibration) -> tuple[tuple[float, float], dict[str, Any]]:
        cal_A: tuple[float, float] | None = None
        if cal.scan_is_calibrated:
            f = length_scale(cal.scan_units, "Å")
            cal_A = (cal.scan_sampling[0] * f, cal.scan_sampling[1] * f)
        if self.scan_step_A is not None:
            if cal_A is not None and not _close(self.scan_step_A, cal_A):
                raise CalibrationError(
                    f"scan_step_A={list(self.scan_step_A)} Å disagrees with the dataset's scan "
                    f"calibration {list(cal.scan_sampling)} {cal.scan_units} (= {list(cal_A)} Å); "
                    "pass scan_step_A=None to use the calibration, or fix the calibration"
                )
            how = "given (agrees with the calibration)" if cal_A is not None else "given"
            return self.scan_step_A, {"scan_step_from": how}
        if cal_A is None:
            raise CalibrationError(
                "SSB needs the scan step as a length, but the dataset's scan is uncalibrated "
                f"(scan_units='px', sampling {list(cal.scan_sampling)}): a scan index is not a "
                "length. Pass scan_step_A=(row, col) in Å, or open the data with "
                "Calibration(scan_sampling=..., scan_units='Å')"
            )
        return cal_A, {
            "scan_step_from": f"calibration ({list(cal.scan_sampling)} {cal.scan_units})"
        }

    def _calibrated_mrad(self, cal: Calibration) -> tuple[float, float] | None:
        if cal.detector_units == "mrad":
            return cal.detector_sampling
        if cal.detector_units == "1/Å":
            lam = electron_wavelength_angstrom(self.voltage_kV)
            s = cal.detector_sampling
            return (s[0] * lam * 1e3, s[1] * lam * 1e3)
        return None

    def _check_detector(self, cal: Calibration) -> None:
        cal_mrad = self._calibrated_mrad(cal)
        if isinstance(self.detector_sampling, tuple):
            if cal_mrad is not None and not _close(self.detector_sampling, cal_mrad):
                raise CalibrationError(
                    f"detector_sampling_mrad={list(self.detector_sampling)} mrad disagrees with "
                    f"the dataset's detector calibration {list(cal.detector_sampling)} "
                    f"{cal.detector_units} (= {[round(v, 6) for v in cal_mrad]} mrad at "
                    f"{self.voltage_kV} kV); pass detector_sampling_mrad=None to use the "
                    "calibration, or fix the calibration"
                )
        elif self.detector_sampling == "calibration" and cal_mrad is None:
            raise CalibrationError(
                "detector_sampling_mrad='calibration' needs a calibrated detector, but its pixels "
                "are uncalibrated (detector_units='px'), and an uncalibrated pixel is never mrad. "
                "Give detector_sampling_mrad=<mrad per pixel>, calibrate the detector "
                "(Calibration(detector_sampling=..., detector_units='mrad')), or let SSB derive "
                "it from the bright-field disk (detector_sampling_mrad=None or 'bf_disk': "
                "semiangle_mrad / disk radius in px, recorded as derived)"
            )

    def _detector_mrad(
        self, cal: Calibration, radius_px: float
    ) -> tuple[tuple[float, float], dict[str, Any], list[str]]:
        cal_mrad = self._calibrated_mrad(cal)
        derive = self.detector_sampling == "bf_disk" or (
            self.detector_sampling == "auto" and cal_mrad is None
        )
        if isinstance(self.detector_sampling, tuple):
            how = "given" + (" (agrees with the calibration)" if cal_mrad is not None else "")
            return self.detector_sampling, {"detector_sampling_from": how}, []
        if not derive:
            assert cal_mrad is not None
            how = f"calibration ({list(cal.detector_sampling)} {cal.detector_units}"
            how += f", at {self.voltage_kV} kV)" if cal.detector_units == "1/Å" else ")"
            return cal_mrad, {"detector_sampling_from": how}, []
        s = self.semiangle_mrad / radius_px
        rule = "semiangle_mrad / bright-field disk radius (px)"
        note = (
            f"detector sampling DERIVED from the bright-field disk: {self.semiangle_mrad} mrad / "
            f"{radius_px:.4g} px = {s:.6g} mrad/px (isotropic); give detector_sampling_mrad= or "
            "a calibrated detector to use a measured value"
        )
        if cal_mrad is not None:
            note += f"; the detector calibration ({list(cal_mrad)} mrad) was not used"
        return (
            (s, s),
            {
                "detector_sampling_from": "derived from the bright-field disk",
                "detector_sampling_rule": rule,
                "bf_disk_radius_px": radius_px,
            },
            [note],
        )

    def _check_semiangle(
        self,
        radius_px: float,
        det_mrad: tuple[float, float],
        det_rec: dict[str, Any],
    ) -> tuple[dict[str, Any], list[str]]:
        """Compare ``semiangle_mrad`` with the measured bright-field disk (reads nothing)."""
        if "bf_disk_radius_px" in det_rec:
            return {
                "consistent": None,
                "reason": "not checked: the detector sampling was derived from the bright-field "
                "disk (semiangle_mrad / radius px), so the disk measures semiangle_mrad by "
                "construction",
            }, []
        px = math.sqrt(det_mrad[0] * det_mrad[1])
        measured = radius_px * px
        tolerance = SEMIANGLE_RTOL * measured + px
        consistent = abs(self.semiangle_mrad - measured) <= tolerance
        record: dict[str, Any] = {
            "consistent": consistent,
            "semiangle_mrad": self.semiangle_mrad,
            "measured_mrad": measured,
            "measured_radius_px": radius_px,
            "detector_sampling_mrad": list(det_mrad),
            "tolerance_mrad": tolerance,
            "rule": f"|semiangle_mrad - measured| <= {SEMIANGLE_RTOL} x measured + one pixel; "
            "measured = probe radius (px, sqrt(area / pi) of the segmented disk) x "
            "sqrt(row x col pixel size, mrad)",
        }
        if consistent:
            return record, []
        core = (
            f"ssb: semiangle_mrad={self.semiangle_mrad:g} disagrees with the bright-field disk "
            f"measured from the data: radius {radius_px:.3g} px x {px:.4g} mrad/px = measured "
            f"{measured:.3g} mrad (tolerance {tolerance:.2g} mrad: {SEMIANGLE_RTOL:.0%} + one "
            f"pixel; detector sampling from {det_rec.get('detector_sampling_from', '?')})."
        )
        if not self.allow_implausible:
            raise ImplausibleParameterError(
                f"{core} Give semiangle_mrad={measured:.3g} (the measured disk), or fix the "
                "detector sampling (detector_sampling_mrad or the calibration) if the disk is "
                "right; or pass allow_implausible=True to reconstruct anyway (recorded in the "
                "provenance, with a warning)",
                parameters=("semiangle_mrad",),
            )
        return record, [allow_implausible_note(core)]

    def geometry(self, ctx: PlanContext) -> tuple[SSBGeometry, list[str]]:
        """Resolve the probe, units and bright-field pixels."""
        ds = ctx.dataset
        cal = ds.calibration
        self._check_voltage(cal)
        step, step_rec = self._scan_step(cal)
        self._check_detector(cal)
        if self.probe is not None:
            est = self.probe
            probe_from = "given"
        else:
            shared = ctx.probe()
            if math.isclose(shared.threshold, self.bf_threshold):
                est, probe_from = shared, "shared probe estimate of the pass"
            else:
                est = find_probe(ds, threshold=self.bf_threshold)
                probe_from = f"found with threshold {self.bf_threshold} (sampled frames)"
        center, center_rec = resolve_center(self.center, ctx, est)
        det_mrad, det_rec, notes = self._detector_mrad(cal, float(est.radius))
        semiangle_check, check_notes = self._check_semiangle(float(est.radius), det_mrad, det_rec)
        notes.extend(check_notes)
        lam = electron_wavelength_angstrom(self.voltage_kV)
        alpha = self.semiangle_mrad * 1e-3
        shape = ds.detector_shape
        select_radius = self.bf_radius_factor * float(est.radius)
        d_px = detector_distance(shape, center, (1.0, 1.0))
        selected = d_px < select_radius
        g_r = (np.arange(shape[0], dtype=np.float64) - center[0])[:, None] * det_mrad[0] * 1e-3
        g_c = (np.arange(shape[1], dtype=np.float64) - center[1])[None, :] * det_mrad[1] * 1e-3
        g_r, g_c = np.broadcast_arrays(g_r, g_c)
        if self.transpose:
            g_r, g_c = g_c, g_r
        th = math.radians(self.rotation_deg)
        v_r = math.cos(th) * g_r - math.sin(th) * g_c
        v_c = math.sin(th) * g_r + math.cos(th) * g_c
        inside = v_r**2 + v_c**2 < alpha**2
        used = selected & inside
        n_sel, n_used = int(selected.sum()), int(used.sum())
        if n_used == 0:
            raise ParameterError(
                f"no bright-field pixel is both within {select_radius:.4g} px of the centre "
                f"{list(center)} and inside the {self.semiangle_mrad} mrad aperture at "
                f"{list(det_mrad)} mrad/px; check semiangle_mrad, the detector sampling and "
                "bf_radius_factor"
            )
        flat = np.flatnonzero(used.ravel())
        record: dict[str, Any] = {
            "voltage_kV": self.voltage_kV,
            "wavelength_A": lam,
            "semiangle_mrad": self.semiangle_mrad,
            "scan_step_A": list(step),
            **step_rec,
            "detector_sampling_mrad": list(det_mrad),
            **det_rec,
            "semiangle_check": semiangle_check,
            "allow_implausible": self.allow_implausible,
            "rotation_deg": self.rotation_deg,
            "transpose": self.transpose,
            "rotation_convention": "transpose (g_r, g_c) -> (g_c, g_r) first, then "
            "v_r = cos g_r - sin g_c, v_c = sin g_r + cos g_c (as dpc)",
            "bright_field": {
                "probe": est.to_dict(),
                "probe_from": probe_from,
                "threshold": self.bf_threshold,
                "radius_px": float(est.radius),
                "radius_factor": self.bf_radius_factor,
                "selection_radius_px": select_radius,
                "center_px": [float(center[0]), float(center[1])],
                **center_rec,
                "n_selected": n_sel,
                "n_inside_aperture": int(inside.sum()),
                "n_used": n_used,
                "rule": "distance from the centre < radius_factor x probe radius (px) AND "
                "inside the aperture (|v| < semiangle); only these pixels are gathered",
                "mask": array_identity(used),
            },
        }
        if n_used < n_sel:
            notes.append(
                f"{n_sel - n_used} selected bright-field pixel(s) lie outside the "
                f"{self.semiangle_mrad} mrad aperture and were not used"
            )
        geo = SSBGeometry(
            indices=flat,
            v_r=v_r.ravel()[flat],
            v_c=v_c.ravel()[flat],
            wavelength_A=lam,
            alpha_rad=alpha,
            scan_step_A=step,
            detector_mrad=det_mrad,
            record=record,
        )
        return geo, notes
