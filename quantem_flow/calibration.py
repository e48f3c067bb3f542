"""Axes, sampling, units and conversions.

Conventions
-----------
* Axes are ``(row, column)``.  Pixel ``i`` has its centre at coordinate
  ``i``; the calibrated position of pixel ``i`` on an axis is
  ``(i - origin) * sampling``.
* Scan axes are in ``px`` (a scan index, never a length) until a scan
  sampling with a length unit (``Å``, ``nm``, ``pm``) is given.
* Detector axes are in ``px`` until a sampling in ``mrad`` or ``1/Å`` is
  given.  An uncalibrated detector pixel is never called mrad:
  :meth:`Calibration.detector_scale` raises :class:`CalibrationError`.
* ``1/Å`` and ``mrad`` convert into each other only when the accelerating
  voltage is known (small-angle relation ``theta = lambda * k``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from .errors import CalibrationError, ParameterError, UnitsError

__all__ = [
    "DETECTOR_UNITS",
    "SCAN_UNITS",
    "Axis",
    "Calibration",
    "electron_wavelength_angstrom",
    "length_scale",
    "normalize_units",
]

SCAN_UNITS = ("px", "Å", "nm", "pm")
DETECTOR_UNITS = ("px", "mrad", "1/Å")

_ALIASES: dict[str, str] = {
    "px": "px",
    "pixel": "px",
    "pixels": "px",
    "pix": "px",
    "a": "Å",
    "å": "Å",
    "angstrom": "Å",
    "angstroms": "Å",
    "ang": "Å",
    "nm": "nm",
    "nanometer": "nm",
    "nanometers": "nm",
    "pm": "pm",
    "mrad": "mrad",
    "milliradian": "mrad",
    "milliradians": "mrad",
    "1/a": "1/Å",
    "1/å": "1/Å",
    "a^-1": "1/Å",
    "å^-1": "1/Å",
    "1/angstrom": "1/Å",
}

_LENGTH_IN_ANGSTROM = {"Å": 1.0, "nm": 10.0, "pm": 0.01}


def normalize_units(units: str, *, kind: str) -> str:
    """Return the canonical spelling of a unit.

    Parameters
    ----------
    units
        A unit such as ``"A"``, ``"Å"``, ``"nm"``, ``"px"``, ``"mrad"``,
        ``"1/A"``.
    kind
        ``"scan"`` or ``"detector"``: which axis the unit is for.

    Returns
    -------
    str
        One of :data:`SCAN_UNITS` or :data:`DETECTOR_UNITS`.

    Raises
    ------
    UnitsError
        If the unit is unknown or not valid for that kind of axis.
    """
    allowed = SCAN_UNITS if kind == "scan" else DETECTOR_UNITS
    if kind not in ("scan", "detector"):
        raise ParameterError(f"kind must be 'scan' or 'detector', got {kind!r}")
    canonical = _ALIASES.get(str(units).strip().lower())
    if canonical is None or canonical not in allowed:
        raise UnitsError(
            f"unknown {kind} unit {units!r}; expected one of {list(allowed)} "
            f"(a scan step is a length or 'px', a detector pixel is 'px', 'mrad' or '1/Å')"
        )
    return canonical


def length_scale(from_units: str, to_units: str) -> float:
    """Return the factor converting a length from one unit to another.

    Parameters
    ----------
    from_units, to_units
        Length units (``Å``, ``nm``, ``pm`` or aliases).

    Returns
    -------
    float
        ``value_in_to_units = value_in_from_units * factor``.
    """
    a = normalize_units(from_units, kind="scan")
    b = normalize_units(to_units, kind="scan")
    if "px" in (a, b):
        if a == b:
            return 1.0
        raise CalibrationError(
            f"cannot convert scan {a!r} to {b!r}: a scan index (px) is not a length; "
            "give the scan step in Å or nm through Calibration(scan_sampling=..., scan_units=...)"
        )
    return _LENGTH_IN_ANGSTROM[a] / _LENGTH_IN_ANGSTROM[b]


def electron_wavelength_angstrom(voltage_kV: float) -> float:
    """Return the relativistic electron wavelength.

    Parameters
    ----------
    voltage_kV
        Accelerating voltage in kilovolts (must be positive).

    Returns
    -------
    float
        Wavelength in Å.
    """
    if not voltage_kV > 0:
        raise ParameterError(f"accelerating voltage must be > 0 kV, got {voltage_kV!r}")
    # h / sqrt(2 m0 e V (1 + e V / (2 m0 c^2))), with constants from CODATA 2018.
    h = 6.62607015e-34
    m0 = 9.1093837015e-31
    e = 1.602176634e-19
    c = 299792458.0
    volts = voltage_kV * 1e3
    lam_m = h / math.sqrt(2 * m0 * e * volts * (1 + e * volts / (2 * m0 * c**2)))
    return lam_m * 1e10


@dataclasses.dataclass(frozen=True)
class Axis:
    """One calibrated axis of a result.

    Attributes
    ----------
    name
        ``"scan_row"``, ``"scan_col"``, ``"k_row"`` or ``"k_col"``.
    size
        Number of samples.
    sampling
        Step between samples, in ``units``.
    units
        Unit of a step (``px`` when uncalibrated).
    origin
        Pixel coordinate of the calibrated zero.
    """

    name: str
    size: int
    sampling: float = 1.0
    units: str = "px"
    origin: float = 0.0

    def coordinates(self) -> list[float]:
        """Return the calibrated coordinate of every sample, in ``units``."""
        return [(i - self.origin) * self.sampling for i in range(self.size)]

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Axis:
        """Build an axis from :meth:`to_dict` output."""
        return cls(
            name=str(d["name"]),
            size=int(d["size"]),
            sampling=float(d["sampling"]),
            units=str(d["units"]),
            origin=float(d["origin"]),
        )


def _pair(value: float | tuple[float, float] | list[float], name: str) -> tuple[float, float]:
    if isinstance(value, (int, float)):
        pair = (float(value), float(value))
    else:
        seq = list(value)
        if len(seq) != 2:
            raise ParameterError(f"{name} must be one number or (row, col), got {value!r}")
        pair = (float(seq[0]), float(seq[1]))
    if not all(math.isfinite(v) and v > 0 for v in pair):
        raise ParameterError(f"{name} must be finite and > 0, got {value!r}")
    return pair


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Calibration of the four axes ``I[R_r, R_c, k_r, k_c]``.

    Parameters
    ----------
    scan_sampling
        Scan step (row, col), or one number for both, in ``scan_units``.
    scan_units
        ``"px"`` (uncalibrated scan index), ``"Å"``, ``"nm"`` or ``"pm"``.
    detector_sampling
        Detector pixel size (row, col), or one number, in ``detector_units``.
    detector_units
        ``"px"`` (uncalibrated), ``"mrad"`` or ``"1/Å"``.
    detector_origin
        Pixel coordinate (row, col) of the optical axis (usually the probe
        centre), or ``None`` when unknown.
    accelerating_voltage_kV
        Beam energy in kV, needed to convert ``1/Å`` to ``mrad`` and for
        phase in radians.
    scan_step_signs
        Direction of the scan steps (row, col): ``-1`` where the file records
        positions that decrease with the index (a negative step), whose
        magnitude is ``scan_sampling``.  A DPC with a fixed ``rotation_deg``
        maps the field into the scan's index frame with it.
    """

    scan_sampling: tuple[float, float] = (1.0, 1.0)
    scan_units: str = "px"
    detector_sampling: tuple[float, float] = (1.0, 1.0)
    detector_units: str = "px"
    detector_origin: tuple[float, float] | None = None
    accelerating_voltage_kV: float | None = None
    scan_step_signs: tuple[int, int] = (1, 1)

    def __post_init__(self) -> None:
        signs = tuple(self.scan_step_signs)
        if len(signs) != 2 or any(v not in (1, -1) for v in signs):
            raise ParameterError(
                f"scan_step_signs must be (row, col) of +1 or -1, got {self.scan_step_signs!r}"
            )
        object.__setattr__(self, "scan_step_signs", (int(signs[0]), int(signs[1])))
        object.__setattr__(self, "scan_sampling", _pair(self.scan_sampling, "scan_sampling"))
        object.__setattr__(
            self, "detector_sampling", _pair(self.detector_sampling, "detector_sampling")
        )
        object.__setattr__(self, "scan_units", normalize_units(self.scan_units, kind="scan"))
        object.__setattr__(
            self, "detector_units", normalize_units(self.detector_units, kind="detector")
        )
        if self.detector_origin is not None:
            o = tuple(float(v) for v in self.detector_origin)
            if len(o) != 2 or not all(math.isfinite(v) for v in o):
                raise ParameterError(
                    "detector_origin must be finite (row, col) pixels, got "
                    f"{self.detector_origin!r}"
                )
            object.__setattr__(self, "detector_origin", (o[0], o[1]))
        if self.accelerating_voltage_kV is not None:
            electron_wavelength_angstrom(float(self.accelerating_voltage_kV))
            object.__setattr__(self, "accelerating_voltage_kV", float(self.accelerating_voltage_kV))

    # -- queries -----------------------------------------------------------------
    @property
    def scan_is_calibrated(self) -> bool:
        """Whether the scan step is a length."""
        return self.scan_units != "px"

    @property
    def detector_is_calibrated(self) -> bool:
        """Whether the detector pixel has an angular or reciprocal size."""
        return self.detector_units != "px"

    def detector_scale(self, units: str) -> tuple[float, float]:
        """Return the size of one detector pixel (row, col) in ``units``.

        Parameters
        ----------
        units
            ``"px"``, ``"mrad"`` or ``"1/Å"``.

        Returns
        -------
        tuple of float
            Row and column pixel size in the requested units.

        Raises
        ------
        CalibrationError
            If the detector is uncalibrated and ``units`` is not ``"px"``, or
            a reciprocal/angle conversion needs the missing voltage.
        """
        target = normalize_units(units, kind="detector")
        if target == "px":
            return (1.0, 1.0)
        if self.detector_units == "px":
            raise CalibrationError(
                f"a detector size in {target!r} was requested but the detector is uncalibrated "
                f"(detector_units='px', sampling {self.detector_sampling}); give "
                "Calibration(detector_sampling=..., detector_units='mrad') to open() or "
                "ds.with_calibration(...), or give sizes in 'px'"
            )
        if target == self.detector_units:
            return self.detector_sampling
        if self.accelerating_voltage_kV is None:
            raise CalibrationError(
                f"converting detector {self.detector_units!r} to {target!r} needs the "
                "accelerating voltage; set Calibration(accelerating_voltage_kV=...)"
            )
        lam = electron_wavelength_angstrom(self.accelerating_voltage_kV)
        sr, sc = self.detector_sampling
        if target == "mrad":  # from 1/Å
            return (sr * lam * 1e3, sc * lam * 1e3)
        return (sr / (lam * 1e3), sc / (lam * 1e3))  # from mrad to 1/Å

    def require_origin(self) -> tuple[float, float]:
        """Return the detector origin or raise a clear error if unknown."""
        if self.detector_origin is None:
            raise CalibrationError(
                "the detector origin (probe centre) is unknown; pass center=(row, col) in px, "
                "use center='auto' to find it from the mean pattern, or set "
                "Calibration(detector_origin=...)"
            )
        return self.detector_origin

    # -- derived calibrations ----------------------------------------------------
    def replace(self, **changes: Any) -> Calibration:
        """Return a copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def detector_cropped(self, row_start: int, col_start: int) -> Calibration:
        """Return the calibration after cropping the detector at (row_start, col_start)."""
        origin = self.detector_origin
        if origin is not None:
            origin = (origin[0] - row_start, origin[1] - col_start)
        return self.replace(detector_origin=origin)

    def detector_binned(self, factor: tuple[int, int]) -> Calibration:
        """Return the calibration after binning the detector by (row, col) factors.

        Bin ``j`` holds original pixels ``[j*f, (j+1)*f)``; its centre is at
        original coordinate ``j*f + (f-1)/2``.
        """
        fr, fc = factor
        origin = self.detector_origin
        if origin is not None:
            origin = ((origin[0] - (fr - 1) / 2) / fr, (origin[1] - (fc - 1) / 2) / fc)
        sr, sc = self.detector_sampling
        return self.replace(detector_origin=origin, detector_sampling=(sr * fr, sc * fc))

    # -- axes --------------------------------------------------------------------
    def scan_axes(self, shape: tuple[int, int]) -> tuple[Axis, Axis]:
        """Return the (row, col) scan axes for a scan of ``shape``."""
        return (
            Axis("scan_row", int(shape[0]), self.scan_sampling[0], self.scan_units, 0.0),
            Axis("scan_col", int(shape[1]), self.scan_sampling[1], self.scan_units, 0.0),
        )

    def detector_axes(self, shape: tuple[int, int]) -> tuple[Axis, Axis]:
        """Return the (row, col) detector axes for a detector of ``shape``."""
        o = self.detector_origin or (0.0, 0.0)
        return (
            Axis("k_row", int(shape[0]), self.detector_sampling[0], self.detector_units, o[0]),
            Axis("k_col", int(shape[1]), self.detector_sampling[1], self.detector_units, o[1]),
        )

    # -- serialisation -----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        d = dataclasses.asdict(self)
        d["scan_sampling"] = list(self.scan_sampling)
        d["detector_sampling"] = list(self.detector_sampling)
        d["detector_origin"] = None if self.detector_origin is None else list(self.detector_origin)
        d["scan_step_signs"] = list(self.scan_step_signs)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Calibration:
        """Build a calibration from :meth:`to_dict` output (or a YAML mapping)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ParameterError(
                f"unknown calibration field(s) {unknown}; expected some of {sorted(known)}"
            )
        kwargs: dict[str, Any] = dict(d)
        if kwargs.get("detector_origin") is not None:
            kwargs["detector_origin"] = tuple(kwargs["detector_origin"])
        for name in ("scan_sampling", "detector_sampling", "scan_step_signs"):
            if isinstance(kwargs.get(name), list):
                kwargs[name] = tuple(kwargs[name])
        return cls(**kwargs)
