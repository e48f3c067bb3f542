"""Checking and parsing the parameters of SSB (scalar pairs, aberration names, fit names)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from ...errors import ParameterError

__all__ = ["FIT_NAMES", "SEMIANGLE_RTOL", "Pair"]

#: Names accepted by ``fit_aberrations`` and their canonical coefficient.
FIT_NAMES: dict[str, str] = {
    "C10": "C10",
    "defocus_A": "C10",
    "C12": "C12",
    "astigmatism_A": "C12",
    "phi12": "phi12",
    "astigmatism_angle_deg": "phi12",
}

_COEFF = re.compile(r"^C(\d)(\d)$")
_ANGLE = re.compile(r"^phi(\d)(\d)_deg$")
_RTOL = 1e-6

#: ``semiangle_mrad`` must agree with the bright-field disk radius measured from
#: the data (probe estimate x detector sampling) within this relative
#: tolerance of the measured radius plus one detector pixel: the segmented
#: radius of a sharp aperture disk is within half a pixel; 20 % covers a disk
#: blurred by deflections, and anything beyond is a wrong semiangle or a wrong
#: detector calibration.
SEMIANGLE_RTOL = 0.2

Pair = float | tuple[float, float] | Sequence[float]


def _pair(value: Pair, name: str) -> tuple[float, float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out = (float(value), float(value))
    else:
        try:
            seq = [float(v) for v in value]  # type: ignore[union-attr]
        except (TypeError, ValueError) as exc:
            raise ParameterError(f"{name} must be one number or (row, col), got {value!r}") from exc
        if len(seq) != 2:
            raise ParameterError(f"{name} must be one number or (row, col), got {value!r}")
        out = (seq[0], seq[1])
    if not all(math.isfinite(v) and v > 0 for v in out):
        raise ParameterError(f"{name} must be finite and > 0, got {value!r}")
    return out


def _finite(value: float, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"{name} must be a number, got {value!r}") from exc
    if not math.isfinite(v):
        raise ParameterError(f"{name} must be finite, got {value!r}")
    return v


def _close(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return all(math.isclose(x, y, rel_tol=_RTOL) for x, y in zip(a, b, strict=True))


def _parse_aberrations(
    aberrations: Mapping[str, float] | None,
) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]]:
    """Validate extra aberrations: ``{"C30": Å, "phi32_deg": deg, ...}``."""
    coeffs: dict[tuple[int, int], float] = {}
    angles: dict[tuple[int, int], float] = {}
    if aberrations is None:
        return coeffs, angles
    if not isinstance(aberrations, Mapping):
        raise ParameterError(
            f"aberrations must be a mapping like {{'C30': 1.2e4}}, got {type(aberrations).__name__}"
        )
    for key, value in aberrations.items():
        mc, ma = _COEFF.match(str(key)), _ANGLE.match(str(key))
        m = mc or ma
        if m is None:
            raise ParameterError(
                f"unknown aberration {key!r}; expected 'Cnm' (Å, e.g. 'C30', 'C23') or "
                "'phinm_deg' (degrees, e.g. 'phi23_deg')"
            )
        n, mm = int(m.group(1)), int(m.group(2))
        if not (n >= 1 and mm <= n + 1 and (n + 1 - mm) % 2 == 0):
            raise ParameterError(
                f"{key!r} is not an axial aberration: C_nm needs n >= 1, m <= n + 1 and "
                "n + 1 - m even (C10, C12, C21, C23, C30, C32, C34, ...)"
            )
        if (n, mm) in ((1, 0), (1, 2)):
            raise ParameterError(
                f"{key!r} is set by defocus_A / astigmatism_A / astigmatism_angle_deg; pass it "
                "there, not in aberrations="
            )
        if (n, mm) == (0, 1) or (n == 1 and mm == 1):
            raise ParameterError(f"{key!r}: image shifts (C01) are not aberrations of SSB")
        v = _finite(value, f"aberrations[{key!r}]")
        if ma is not None:
            if mm == 0:
                raise ParameterError(f"{key!r}: a round aberration (m = 0) has no angle")
            angles[(n, mm)] = v
        else:
            coeffs[(n, mm)] = v
    orphan = sorted(set(angles) - set(coeffs))
    if orphan:
        raise ParameterError(
            f"angle(s) given without a coefficient: {[f'phi{n}{m}_deg' for n, m in orphan]}; "
            "add the matching 'Cnm'"
        )
    return coeffs, angles


def _fit_names(fit: bool | Sequence[str]) -> tuple[str, ...]:
    if isinstance(fit, bool):
        return ("C10", "C12", "phi12") if fit else ()
    if isinstance(fit, str):
        fit = [fit]
    names: list[str] = []
    for name in fit:
        canon = FIT_NAMES.get(str(name))
        if canon is None:
            raise ParameterError(
                f"cannot fit {name!r}; fit_aberrations takes True, False or names among "
                f"{sorted(FIT_NAMES)}"
            )
        if canon not in names:
            names.append(canon)
    return tuple(n for n in ("C10", "C12", "phi12") if n in names)
