"""Display math on computed results: contrast, colour wheels, PNG files.

These functions are eager and meant for small results (images over the
scan, diffraction patterns).  A PNG is a display product, not data: the
contrast limits, gamma and log choices that made it are written into the
PNG's text chunks (readable with ``PIL.Image.open(path).text``) together
with the result's operator, units and name, so an image never hides how it
was stretched.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ParameterError, ShapeError
from ..results import ComplexObject, DiffractionImage, Result, VectorField

__all__ = ["normalize", "normalize_with_limits", "save_png", "to_rgb_vector"]

#: Prefix of the PNG text keys written by :func:`save_png`.
PNG_KEY_PREFIX = "quantem_flow:"


def _check_percentiles(low: float, high: float) -> None:
    if not (0.0 <= low < high <= 100.0):
        raise ParameterError(
            "percentiles must satisfy 0 <= low_percentile < high_percentile <= 100, got "
            f"low_percentile={low!r}, high_percentile={high!r}"
        )


def normalize_with_limits(
    image: np.ndarray,
    *,
    low_percentile: float = 0.5,
    high_percentile: float = 99.5,
    gamma: float = 1.0,
    log: bool = False,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Like :func:`normalize`, also returning the limits used (for the record).

    Returns
    -------
    image : numpy.ndarray
        float64 values in [0, 1] (NaN where the input was not finite).
    record : dict
        The parameters and the values the percentiles resolved to
        (``low_value``, ``high_value``, in the units of the input, or of
        ``log1p(x - min)`` when ``log``), plus the count of non-finite pixels.
    """
    _check_percentiles(float(low_percentile), float(high_percentile))
    if not (math.isfinite(gamma) and gamma > 0):
        raise ParameterError(f"gamma must be > 0, got {gamma!r}")
    a = np.asarray(image)
    if a.dtype.kind == "c":
        raise ParameterError(
            "normalize needs real values; display np.abs() or np.angle() of complex data"
        )
    if a.dtype.kind not in "biuf":
        raise ParameterError(f"normalize needs numbers, got dtype {a.dtype}")
    x = a.astype(np.float64)
    finite = np.isfinite(x)
    record: dict[str, Any] = {
        "low_percentile": float(low_percentile),
        "high_percentile": float(high_percentile),
        "gamma": float(gamma),
        "log": bool(log),
        "non_finite_pixels": int(x.size - np.count_nonzero(finite)),
    }
    out = np.full(x.shape, np.nan)
    if not finite.any():
        record.update(low_value=None, high_value=None, note="no finite value")
        return out, record
    if log:
        shift = float(x[finite].min())
        x = np.where(finite, np.log1p(np.where(finite, x, shift) - shift), np.nan)
        record["log_transform"] = f"log1p(x - {shift:.6g}) (x - min is >= 0)"
    lo, hi = (float(v) for v in np.percentile(x[finite], [low_percentile, high_percentile]))
    record.update(low_value=lo, high_value=hi)
    if hi > lo:
        y = np.clip((x[finite] - lo) / (hi - lo), 0.0, 1.0)
    else:
        y = np.zeros(int(np.count_nonzero(finite)))
        record["note"] = "constant image: every finite pixel displayed as 0"
    if gamma != 1.0:
        y = y**gamma
    out[finite] = y
    return out, record


def normalize(
    image: np.ndarray,
    *,
    low_percentile: float = 0.5,
    high_percentile: float = 99.5,
    gamma: float = 1.0,
    log: bool = False,
) -> np.ndarray:
    """Stretch an image to [0, 1] between two percentiles (NaN-safe).

    Parameters
    ----------
    image
        Real values, any shape.
    low_percentile, high_percentile
        Percentiles of the finite values mapped to 0 and 1; values outside
        are clipped (for display only).
    gamma
        Exponent applied after stretching (``< 1`` brightens dark values).
    log
        Display ``log1p(x - min(x))`` instead of ``x`` (diffraction patterns).

    Returns
    -------
    numpy.ndarray
        float64 in [0, 1], the shape of ``image``; pixels that were NaN or
        infinite stay NaN and never affect the percentiles.  A constant
        image becomes all zeros.
    """
    out, _ = normalize_with_limits(
        image,
        low_percentile=low_percentile,
        high_percentile=high_percentile,
        gamma=gamma,
        log=log,
    )
    return out


def _hsv_to_rgb(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Vectorised HSV (each in [0, 1]) to RGB ``(..., 3)``."""
    h6 = (h % 1.0) * 6.0
    i = np.floor(h6).astype(np.int64) % 6
    f = h6 - np.floor(h6)
    p = v * (1 - s)
    q = v * (1 - s * f)
    t = v * (1 - s * (1 - f))
    choices_r = [v, q, p, p, t, v]
    choices_g = [t, v, v, q, p, p]
    choices_b = [p, p, t, v, v, q]
    r = np.choose(i, choices_r)
    g = np.choose(i, choices_g)
    b = np.choose(i, choices_b)
    return np.stack([r, g, b], axis=-1)


def _vector_rgb(
    field: VectorField | np.ndarray,
    high_percentile: float,
    subtract_mean: bool,
) -> tuple[np.ndarray, dict[str, Any]]:
    data = np.asarray(field.data if isinstance(field, VectorField) else field)
    if data.ndim != 3 or data.shape[0] != 2:
        raise ShapeError(
            f"a vector field must have shape (2, rows, cols) (row and column components), "
            f"got {data.shape}"
        )
    if data.dtype.kind not in "biuf":
        raise ParameterError(f"a vector field needs real components, got dtype {data.dtype}")
    if not 0 < high_percentile <= 100:
        raise ParameterError(f"high_percentile must be in (0, 100], got {high_percentile!r}")
    v = data.astype(np.float64)
    finite = np.isfinite(v[0]) & np.isfinite(v[1])
    record: dict[str, Any] = {
        "mapping": "HSV colour wheel",
        "hue": "direction atan2(row, col): 0 deg = +col (red), 90 deg = +row (down)",
        "saturation": 1.0,
        "value": f"magnitude / its {high_percentile} percentile, clipped to 1",
        "high_percentile": float(high_percentile),
        "subtract_mean": bool(subtract_mean),
        "non_finite_pixels": int(finite.size - np.count_nonzero(finite)),
    }
    if subtract_mean and finite.any():
        mean = v[:, finite].mean(axis=1)
        v = v - mean[:, None, None]
        record["subtracted_mean"] = [float(m) for m in mean]
    mag = np.hypot(v[0], v[1])
    scale = float(np.percentile(mag[finite], high_percentile)) if finite.any() else 0.0
    record["magnitude_at_full_value"] = scale
    value = np.clip(mag / scale, 0.0, 1.0) if scale > 0 else np.zeros_like(mag)
    hue = (np.arctan2(v[0], v[1]) / (2 * math.pi)) % 1.0
    value = np.where(finite, value, 0.0)
    hue = np.where(finite, hue, 0.0)
    return _hsv_to_rgb(hue, np.ones_like(hue), value), record


def to_rgb_vector(
    field: VectorField | np.ndarray,
    *,
    high_percentile: float = 99.5,
    subtract_mean: bool = False,
) -> np.ndarray:
    """Colour a vector field by direction (hue) and magnitude (brightness).

    Parameters
    ----------
    field
        A :class:`~quantem_flow.results.VectorField` or a ``(2, R, C)``
        array: component 0 along rows, 1 along columns.
    high_percentile
        Magnitudes at or above this percentile are shown at full
        brightness.
    subtract_mean
        Remove the mean vector first (a descan or origin offset would
        otherwise tint the whole image one hue).

    Returns
    -------
    numpy.ndarray
        ``(R, C, 3)`` float64 RGB in [0, 1].  Hue is the direction
        ``atan2(row, col)``: red points along +col, and hues turn towards
        +row (down the image) as the angle grows.  Non-finite vectors are
        black.
    """
    rgb, _ = _vector_rgb(field, float(high_percentile), bool(subtract_mean))
    return rgb


def _package_version() -> str:
    try:
        return importlib.metadata.version("quantem-flow")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def save_png(
    result_or_array: Result | np.ndarray,
    path: str | os.PathLike[str],
    *,
    low_percentile: float = 0.5,
    high_percentile: float = 99.5,
    gamma: float = 1.0,
    log: bool | None = None,
    subtract_mean: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write a result as an 8-bit PNG, recording how it was displayed.

    Parameters
    ----------
    result_or_array
        A :class:`~quantem_flow.results.Result` or an array.  Images
        (``ScanImage``, ``PhaseImage``, ``DiffractionImage``, 2-D arrays)
        become 8-bit greyscale; vector fields (``VectorField``, ``(2, R, C)``
        arrays) become RGB through :func:`to_rgb_vector`; a
        ``ComplexObject`` becomes RGB with hue = phase and brightness =
        stretched amplitude.
    path
        The ``.png`` file; missing parent folders are created.
    low_percentile, high_percentile, gamma
        Contrast, see :func:`normalize` (only ``high_percentile`` applies to
        vector and complex brightness).
    log
        Display on a log scale; ``None`` means true for diffraction
        patterns and false otherwise.
    subtract_mean
        For vector fields: remove the mean vector first.
    overwrite
        Replace an existing file.

    Returns
    -------
    pathlib.Path
        The absolute path written.

    Notes
    -----
    Pixel ``(row, col)`` of the data is pixel ``(row, col)`` of the PNG (row
    0 at the top), so the PNG is ``cols`` wide and ``rows`` high.  The PNG
    text chunks hold ``quantem_flow:name``, ``quantem_flow:kind``,
    ``quantem_flow:operator``, ``quantem_flow:units``, ``quantem_flow:shape``
    and ``quantem_flow:display`` (JSON of the normalisation, including the
    data values the percentiles resolved to), plus ``Software``.
    """
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    target = Path(path).expanduser().absolute()
    if target.suffix.lower() != ".png":
        raise ParameterError(f"save_png writes .png files, got the name {target.name!r}")
    if target.exists() and not overwrite:
        raise FileExistsError(
            f"{str(target)!r} already exists; pass overwrite=True to replace it or choose "
            "another name"
        )
    if overwrite:
        from ..io.results_store import check_replaceable

        check_replaceable(target)  # only a PNG quantem-flow wrote
    if isinstance(result_or_array, Result):
        result: Result | None = result_or_array
        data = np.asarray(result_or_array.data)
    elif isinstance(result_or_array, np.ndarray):
        result = None
        data = result_or_array
    else:
        raise ParameterError(
            f"save_png takes a quantem_flow Result or a NumPy array, got "
            f"{type(result_or_array).__name__}"
        )
    is_vector = isinstance(result, VectorField) or (
        result is None and data.ndim == 3 and data.shape[0] == 2
    )
    is_complex = isinstance(result, ComplexObject) or (
        result is None and data.ndim == 2 and data.dtype.kind == "c"
    )
    display: dict[str, Any]
    if is_vector:
        rgb, display = _vector_rgb(data, float(high_percentile), bool(subtract_mean))
        pixels = np.rint(rgb * 255).astype(np.uint8)
        mode = "RGB"
    elif is_complex:
        amp, display = normalize_with_limits(
            np.abs(data),
            low_percentile=low_percentile,
            high_percentile=high_percentile,
            gamma=gamma,
            log=bool(log),
        )
        hue = (np.angle(data) / (2 * math.pi)) % 1.0
        val = np.nan_to_num(amp, nan=0.0)
        rgb = _hsv_to_rgb(np.where(np.isfinite(hue), hue, 0.0), np.ones_like(val), val)
        display = {
            "mapping": "HSV: hue = phase (0 rad red), value = stretched amplitude",
            "amplitude": display,
        }
        pixels = np.rint(rgb * 255).astype(np.uint8)
        mode = "RGB"
    else:
        if data.ndim != 2:
            raise ShapeError(
                f"save_png writes 2-D images, (2, rows, cols) vector fields or 2-D complex "
                f"objects, got an array of shape {data.shape}"
            )
        use_log = isinstance(result, DiffractionImage) if log is None else bool(log)
        img, display = normalize_with_limits(
            data,
            low_percentile=low_percentile,
            high_percentile=high_percentile,
            gamma=gamma,
            log=use_log,
        )
        if log is None:
            display["log_chosen"] = (
                "automatically (diffraction pattern)"
                if use_log
                else ("automatically (not a diffraction pattern)")
            )
        display["mapping"] = "greyscale, 0 -> black, 1 -> white, non-finite -> black"
        pixels = np.rint(np.nan_to_num(img, nan=0.0) * 255).astype(np.uint8)
        mode = "L"
    info = PngInfo()
    info.add_text("Software", f"quantem-flow {_package_version()}")
    meta = {
        "name": result.name if result is not None else "",
        "kind": type(result).kind if result is not None else "array",
        "operator": result.provenance.operator if result is not None else "none (plain array)",
        "units": result.units if result is not None else "unknown (plain array)",
        "shape": json.dumps(list(data.shape)),
        "display": json.dumps(
            {**display, "product": "8-bit display image, not the data"},
            ensure_ascii=False,
        ),
    }
    for key, value in meta.items():
        info.add_itxt(PNG_KEY_PREFIX + key, str(value))
    target.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(np.ascontiguousarray(pixels))
    if image.mode != mode:  # pragma: no cover - Pillow maps uint8 (R, C[, 3]) to L / RGB
        image = image.convert(mode)
    image.save(target, pnginfo=info)
    return target
