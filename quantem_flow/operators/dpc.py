"""Differential phase contrast: detector-to-scan rotation, and iDPC.

Rotation convention
-------------------
A centre-of-mass vector measured in detector axes ``(g_r, g_c)`` (after an
optional transpose, which swaps the two components) is rotated into scan
axes by ``theta``::

    v_r = cos(theta) g_r - sin(theta) g_c
    v_c = sin(theta) g_r + cos(theta) g_c

The curl of the rotated field is ``cos(theta) A + sin(theta) B`` with
``A = d g_c/d r - d g_r/d c`` (curl of the unrotated field) and
``B = d g_r/d r + d g_c/d c`` (its divergence).  Its mean square is a
quadratic form in ``(cos, sin)``, so the curl-minimising angle is the
eigenvector of the 2 x 2 matrix ``[[<A A>, <A B>], [<A B>, <B B>]]`` with the
smallest eigenvalue: exact, with no grid search.  ``theta`` and
``theta + 180°`` have the same curl; the engine picks the one whose
integrated phase has positive skewness (atoms are sparse positive phase
peaks on a flat background), records both skewness values, and accepts an
explicit ``rotation_deg`` from the user.

Fourier integration
-------------------
With ``g = grad(phi)``, ``phi_hat(q) = (q_r g_r_hat + q_c g_c_hat) /
(2 pi i (|q|^2 + q_hp^2))`` and ``phi_hat(0) = 0``.  The integration assumes
a periodic field; nothing is padded unless asked, and that is recorded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ..calibration import Axis, electron_wavelength_angstrom, length_scale
from ..dataset import Dataset4D
from ..errors import CalibrationError, ParameterError
from ..provenance import Provenance
from ..results import PhaseImage, Result, VectorField
from .base import DerivedOperator, LazyResult
from .com import CenterOfMass, center_of_mass

__all__ = [
    "DPC",
    "IDPC",
    "curl_minimizing_rotation",
    "dpc",
    "fourier_integrate",
    "idpc",
    "rotate_field",
]


def _gradients(f: np.ndarray, spacing: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    d_r, d_c = np.gradient(f, spacing[0], spacing[1])
    return np.asarray(d_r), np.asarray(d_c)


def rotate_field(field: np.ndarray, theta_rad: float, *, transpose: bool) -> np.ndarray:
    """Rotate a ``(2, R, C)`` vector field by ``theta`` (after an optional transpose)."""
    g_r, g_c = (field[1], field[0]) if transpose else (field[0], field[1])
    c, s = math.cos(theta_rad), math.sin(theta_rad)
    return np.stack([c * g_r - s * g_c, s * g_r + c * g_c])


def curl_minimizing_rotation(
    field: np.ndarray, spacing: tuple[float, float] = (1.0, 1.0)
) -> dict[str, Any]:
    """Find the rotation and transpose that minimise the field's curl.

    Parameters
    ----------
    field
        ``(2, R, C)`` vectors in detector axes; NaN entries are ignored.
    spacing
        Scan step ``(row, col)``.

    Returns
    -------
    dict
        ``theta_rad`` (in [0, pi); add pi for the other solution),
        ``transpose``, ``curl_rms`` (at the minimum), ``curl_rms_max`` (at the
        worst angle) and the same two for the other transpose.
    """
    best: dict[str, Any] | None = None
    per_transpose: dict[str, Any] = {}
    for transpose in (False, True):
        g_r, g_c = (field[1], field[0]) if transpose else (field[0], field[1])
        dgr_r, dgr_c = _gradients(g_r, spacing)
        dgc_r, dgc_c = _gradients(g_c, spacing)
        a = dgc_r - dgr_c
        b = dgr_r + dgc_c
        ok = np.isfinite(a) & np.isfinite(b)
        if not ok.any():
            raise ParameterError("the vector field has no finite values; cannot find a rotation")
        a, b = a[ok], b[ok]
        m = np.array([[np.mean(a * a), np.mean(a * b)], [np.mean(a * b), np.mean(b * b)]])
        evals, evecs = np.linalg.eigh(m)
        v = evecs[:, 0]
        theta = math.atan2(float(v[1]), float(v[0])) % math.pi
        rec = {
            "theta_rad": theta,
            "transpose": transpose,
            "curl_rms": math.sqrt(max(float(evals[0]), 0.0)),
            "curl_rms_max": math.sqrt(max(float(evals[1]), 0.0)),
        }
        per_transpose[str(transpose).lower()] = {k: rec[k] for k in ("curl_rms", "curl_rms_max")}
        if best is None or rec["curl_rms"] < best["curl_rms"]:
            best = rec
    assert best is not None
    best["by_transpose"] = per_transpose
    return best


def fourier_integrate(
    field: np.ndarray, spacing: tuple[float, float], *, highpass: float = 0.0
) -> np.ndarray:
    """Integrate a gradient field ``(2, R, C)`` into a scalar ``(R, C)`` (periodic).

    Parameters
    ----------
    field
        ``(d phi/d r, d phi/d c)`` per unit length of ``spacing``.
    spacing
        Scan step ``(row, col)``.
    highpass
        Regularising spatial frequency ``q_hp`` (same inverse units as
        ``spacing``); 0 disables it.

    Returns
    -------
    numpy.ndarray
        ``phi`` with zero mean.
    """
    f = np.where(np.isfinite(field), field, 0.0)
    R, C = f.shape[1:]
    q_r = np.fft.fftfreq(R, d=spacing[0])[:, None]
    q_c = np.fft.fftfreq(C, d=spacing[1])[None, :]
    q2 = q_r**2 + q_c**2 + highpass**2
    q2[0, 0] = 1.0
    num = q_r * np.fft.fft2(f[0]) + q_c * np.fft.fft2(f[1])
    phi_hat = num / (2j * math.pi * q2)
    phi_hat[0, 0] = 0.0
    return np.asarray(np.fft.ifft2(phi_hat).real)


def _skewness(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    s = float(x.std())
    return 0.0 if s == 0 else float(np.mean((x - x.mean()) ** 3) / s**3)


def _scan_step_signs(field: Result) -> tuple[int, int]:
    """The scan step directions of the dataset a field was computed on (``(1, 1)`` if unknown)."""
    cal = field.provenance.dataset.get("calibration") or {}
    signs = cal.get("scan_step_signs") or (1, 1)
    return (int(signs[0]), int(signs[1]))


def _scan_spacing(field: Result) -> tuple[tuple[float, float], str]:
    ax_r, ax_c = field.axes[1], field.axes[2]
    return (ax_r.sampling, ax_c.sampling), ax_r.units


class DPC(DerivedOperator):
    """Rotate a centre-of-mass field into scan axes (curl-minimising by default).

    Parameters
    ----------
    rotation_deg
        ``"auto"`` or the rotation in degrees.
    transpose
        ``"auto"`` or whether to swap the detector components first.
    subtract
        ``"mean"`` removes the mean vector (descan and origin offsets) before
        rotating; ``"none"`` keeps it.
    """

    name: ClassVar[str] = "dpc"

    def __init__(
        self,
        *,
        rotation_deg: float | str = "auto",
        transpose: bool | str = "auto",
        subtract: str = "mean",
    ):
        if isinstance(rotation_deg, str) and rotation_deg != "auto":
            raise ParameterError(f"rotation_deg must be 'auto' or degrees, got {rotation_deg!r}")
        if isinstance(transpose, str) and transpose != "auto":
            raise ParameterError(f"transpose must be 'auto', True or False, got {transpose!r}")
        if subtract not in ("mean", "none"):
            raise ParameterError(f"subtract must be 'mean' or 'none', got {subtract!r}")
        if rotation_deg == "auto" and transpose != "auto":
            pass  # transpose fixed, rotation searched for that transpose only
        self.rotation_deg = rotation_deg
        self.transpose = transpose
        self.subtract = subtract

    def parameters(self) -> dict[str, Any]:
        """Parameters as given."""
        return {
            "rotation_deg": self.rotation_deg,
            "transpose": self.transpose,
            "subtract": self.subtract,
        }

    def rotate(self, com: VectorField) -> tuple[np.ndarray, dict[str, Any], list[str]]:
        """Return the rotated field, the resolved parameters and notes."""
        field = np.array(com.data, dtype=np.float64)
        notes: list[str] = []
        if self.subtract == "mean":
            mean = np.nanmean(field, axis=(1, 2))
            field -= mean[:, None, None]
        spacing, _ = _scan_spacing(com)
        params: dict[str, Any] = {**self.parameters()}
        if self.subtract == "mean":
            params["subtracted_mean"] = [float(v) for v in mean]
        if self.rotation_deg == "auto":
            found = curl_minimizing_rotation(field, spacing)
            if self.transpose != "auto" and bool(self.transpose) != found["transpose"]:
                # re-run restricted to the requested transpose
                t = bool(self.transpose)
                sub = curl_minimizing_rotation(field[::-1] if t else field, spacing)
                found = {**sub, "transpose": t, "by_transpose": found["by_transpose"]}
            theta = found["theta_rad"]
            transpose = found["transpose"]
            candidates = []
            for extra in (0.0, math.pi):
                rotated = rotate_field(field, theta + extra, transpose=transpose)
                phase = fourier_integrate(rotated, spacing)
                candidates.append((_skewness(phase), theta + extra, rotated))
            candidates.sort(key=lambda t: -t[0])
            _, theta, rotated = candidates[0]
            params.update(
                rotation_deg_found=math.degrees(theta) % 360.0,
                transpose_found=transpose,
                curl_rms=found["curl_rms"],
                curl_rms_max=found["curl_rms_max"],
                curl_by_transpose=found["by_transpose"],
                ambiguity_180="chose the rotation whose integrated phase has positive skewness",
                phase_skewness=[c[0] for c in candidates],
            )
            notes.append(
                f"rotation {math.degrees(theta) % 360.0:.3f} deg, transpose={transpose} found by "
                "minimising the curl; the 180 deg ambiguity was resolved by positive phase "
                "skewness (pass rotation_deg= to override)"
            )
            if _scan_step_signs(com) != (1, 1):
                notes.append(
                    f"the scan steps run {_scan_step_signs(com)} (row, col); the search over "
                    "rotation and transpose covers that reflection, so the rotation found is "
                    "that of the scan's index frame"
                )
            return rotated, params, notes
        transpose = bool(self.transpose) if self.transpose != "auto" else False
        theta = math.radians(float(self.rotation_deg))
        params.update(rotation_deg_found=float(self.rotation_deg), transpose_found=transpose)
        rotated = rotate_field(field, theta, transpose=transpose)
        signs = _scan_step_signs(com)
        if signs != (1, 1):
            # a fixed rotation maps the detector onto the scan's physical axes; where the
            # positions decrease with the index, the index frame runs the other way
            rotated = rotated * np.asarray(signs, dtype=np.float64)[:, None, None]
            params["scan_step_signs"] = list(signs)
            notes.append(
                f"the scan steps run {signs} (row, col): the rotated field's components were "
                "multiplied by them to follow the scan index (Calibration.scan_step_signs)"
            )
        return rotated, params, notes

    def finalize(self, inputs: Sequence[Result]) -> Result:
        """Rotate the centre of mass into scan axes."""
        com = _one_field(inputs, self.name)
        rotated, params, notes = self.rotate(com)
        return VectorField(
            data=rotated,
            units=com.units,
            axes=com.axes,
            provenance=_derived_provenance("dpc", params, com, notes),
        )


class IDPC(DerivedOperator):
    """Integrated DPC: the phase whose gradient is the rotated CoM field.

    Parameters
    ----------
    rotation
        How to rotate a centre-of-mass input (ignored when the input is
        already a DPC field).
    highpass
        Regularising frequency in 1/(scan unit); 0 disables it.
    """

    name: ClassVar[str] = "idpc"

    def __init__(self, *, rotation: DPC | None = None, highpass: float = 0.0):
        if highpass < 0:
            raise ParameterError(f"highpass must be >= 0, got {highpass}")
        self.rotation = rotation or DPC()
        self.highpass = float(highpass)

    def parameters(self) -> dict[str, Any]:
        """Parameters as given."""
        return {"rotation": self.rotation.parameters(), "highpass": self.highpass}

    def finalize(self, inputs: Sequence[Result]) -> Result:
        """Rotate (if needed) and integrate."""
        field_in = _one_field(inputs, self.name)
        params: dict[str, Any] = {"highpass": self.highpass}
        notes: list[str] = []
        if field_in.provenance.operator == "dpc":
            field = np.asarray(field_in.data, dtype=np.float64)
            params["rotation"] = "already rotated (input is a DPC field)"
        else:
            field, rot_params, notes = self.rotation.rotate(field_in)
            params["rotation"] = rot_params
        spacing, scan_units = _scan_spacing(field_in)
        gradient, units, how = _phase_gradient(field, field_in, scan_units)
        if units == "rad":
            spacing = tuple(s * length_scale(scan_units, "Å") for s in spacing)  # type: ignore[assignment]
        phase = fourier_integrate(gradient, spacing, highpass=self.highpass)
        params.update(
            phase_units=units,
            gradient_conversion=how,
            boundary="periodic (no padding)",
            spacing=list(spacing),
        )
        if units != "rad":
            notes.append(f"phase is in arbitrary units: {how}")
        return PhaseImage(
            data=phase,
            units=units,
            axes=field_in.axes[1:],
            provenance=_derived_provenance("idpc", params, field_in, notes),
        )


def _phase_gradient(field: np.ndarray, src: Result, scan_units: str) -> tuple[np.ndarray, str, str]:
    """Convert a CoM field to a phase gradient in rad/Å when calibrated."""
    units = src.units
    if scan_units == "px":
        return field, "arb.", "scan step uncalibrated (px); give scan_sampling in Å or nm"
    if units == "1/Å":
        return 2 * math.pi * field, "rad", "grad(phi) = 2 pi k, k in 1/Å"
    if units == "mrad":
        kv = _voltage(src)
        if kv is None:
            return field, "arb.", "CoM in mrad but the accelerating voltage is unknown"
        lam = electron_wavelength_angstrom(kv)
        return (
            2 * math.pi * field * 1e-3 / lam,
            "rad",
            f"grad(phi) = 2 pi theta / lambda, lambda = {lam:.6g} Å at {kv} kV",
        )
    return field, "arb.", "detector uncalibrated (px); give detector_sampling in mrad"


def _voltage(src: Result) -> float | None:
    cal = src.provenance.dataset.get("calibration", {})
    kv = cal.get("accelerating_voltage_kV")
    if kv is None:
        for parent in src.provenance.derived_from:
            kv = parent.get("dataset", {}).get("calibration", {}).get("accelerating_voltage_kV")
            if kv is not None:
                break
    return None if kv is None else float(kv)


def _one_field(inputs: Sequence[Result], op: str) -> VectorField:
    if len(inputs) != 1 or not isinstance(inputs[0], VectorField):
        raise ParameterError(
            f"{op} needs one VectorField (a centre of mass or DPC field), got "
            f"{[type(i).__name__ for i in inputs]}"
        )
    return inputs[0]


def _derived_provenance(
    operator: str, params: dict[str, Any], parent: Result, notes: list[str]
) -> Provenance:
    p = parent.provenance
    return Provenance(
        operator=operator,
        parameters=params,
        source=p.source,
        dataset=p.dataset,
        transforms=p.transforms,
        flags=p.flags,
        accumulation_dtype="float64",
        execution={"computed_on": "client (small derived result)"},
        derived_from=[p.to_dict()],
        notes=[*p.notes, *notes],
        timings={},
    )


def _as_field(data: Dataset4D | LazyResult, name: str) -> LazyResult:
    if isinstance(data, Dataset4D):
        return center_of_mass(data)
    if isinstance(data, LazyResult) and isinstance(data.operator, (CenterOfMass, DPC)):
        return data
    raise ParameterError(
        f"{name} needs a Dataset4D or a lazy center_of_mass/dpc result, got {data!r}"
    )


def dpc(
    com: Dataset4D | LazyResult,
    *,
    rotation_deg: float | str = "auto",
    transpose: bool | str = "auto",
    subtract: str = "mean",
    name: str | None = None,
) -> LazyResult:
    """DPC field: the centre of mass rotated into scan axes.

    Parameters
    ----------
    com
        A lazy :func:`~quantem_flow.operators.com.center_of_mass`, or a
        dataset (its default centre of mass is used).
    rotation_deg
        ``"auto"`` (minimise the curl; recorded) or degrees.
    transpose
        ``"auto"``, ``True`` (transpose the detector axes before rotating) or ``False``.
    subtract
        ``"mean"``: remove the field's mean first; ``"none"``: keep it.
    name
        Label of the result (default ``"dpc"``).

    Returns
    -------
    LazyResult
        A lazy :class:`~quantem_flow.results.VectorField`.
    """
    src = _as_field(com, "dpc")
    op = DPC(rotation_deg=rotation_deg, transpose=transpose, subtract=subtract)
    return LazyResult(op, dependencies=[src], name=name or "dpc")


def idpc(
    field: Dataset4D | LazyResult,
    *,
    rotation_deg: float | str = "auto",
    transpose: bool | str = "auto",
    subtract: str = "mean",
    highpass: float = 0.0,
    name: str | None = None,
) -> LazyResult:
    """Integrated DPC phase by Fourier integration.

    Parameters
    ----------
    field
        A lazy centre of mass (rotated here), a lazy DPC field (used as it
        is), or a dataset (its default centre of mass).
    rotation_deg
        For a centre-of-mass input: ``"auto"`` (minimise the curl; recorded)
        or degrees, as :func:`dpc`.
    transpose
        For a centre-of-mass input: ``"auto"``, ``True`` (transpose the
        detector axes before rotating) or ``False``.
    subtract
        For a centre-of-mass input: ``"mean"`` (remove the field's mean
        first) or ``"none"``.
    highpass
        Regularising frequency in 1/(scan unit).
    name
        Label of the result (default ``"idpc"``).

    Returns
    -------
    LazyResult
        A lazy :class:`~quantem_flow.results.PhaseImage` in rad when the scan,
        the detector and (for mrad) the voltage are calibrated, else ``arb.``.
    """
    src = _as_field(field, "idpc")
    rot = DPC(rotation_deg=rotation_deg, transpose=transpose, subtract=subtract)
    return LazyResult(
        IDPC(rotation=rot, highpass=highpass), dependencies=[src], name=name or "idpc"
    )


_ = (Axis, CalibrationError)  # re-exported names used in docs
