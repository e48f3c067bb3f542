from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from quantem_flow import Calibration, Provenance
from quantem_flow.calibration import Axis
from quantem_flow.errors import ParameterError, ShapeError
from quantem_flow.operators.display import (
    PNG_KEY_PREFIX,
    normalize,
    normalize_with_limits,
    save_png,
    to_rgb_vector,
)
from quantem_flow.results import ComplexObject, DiffractionImage, ScanImage, VectorField

CAL = Calibration(scan_sampling=(0.5, 0.5), scan_units="Å")


def scan_image(data: np.ndarray, units: str = "counts") -> ScanImage:
    return ScanImage(
        data=data,
        units=units,
        axes=CAL.scan_axes(data.shape),
        provenance=Provenance(operator="virtual_bf"),
        name="bf",
    )


def vector_field(data: np.ndarray) -> VectorField:
    return VectorField(
        data=data,
        units="px",
        axes=(Axis("component", 2, 1.0, "row,col", 0.0), *CAL.scan_axes(data.shape[1:])),
        provenance=Provenance(operator="center_of_mass"),
        name="com",
    )


def png_text(path: Path) -> dict[str, str]:
    with Image.open(path) as im:
        return dict(im.text)  # type: ignore[attr-defined]


# -- normalize ----------------------------------------------------------------------------------
def test_normalize_range_and_percentiles() -> None:
    x = np.arange(1000, dtype=float).reshape(20, 50)
    y = normalize(x, low_percentile=10, high_percentile=90)
    assert y.shape == x.shape and y.dtype == np.float64
    assert y.min() == 0.0 and y.max() == 1.0
    # 10 % of the pixels at or below the low limit, 10 % at or above the high one
    assert np.count_nonzero(y == 0) == pytest.approx(100, abs=2)
    assert np.count_nonzero(y == 1) == pytest.approx(100, abs=2)
    full = normalize(x, low_percentile=0, high_percentile=100)
    np.testing.assert_allclose(full, x / 999)


def test_normalize_is_nan_safe() -> None:
    x = np.arange(16, dtype=float).reshape(4, 4)
    x[0, 0] = np.nan
    x[1, 1] = np.inf
    x[2, 2] = -np.inf
    y, record = normalize_with_limits(x, low_percentile=0, high_percentile=100)
    assert np.isnan(y[0, 0]) and np.isnan(y[1, 1]) and np.isnan(y[2, 2])
    finite = np.isfinite(y)
    assert np.nanmin(y) == 0 and np.nanmax(y) == 1
    assert finite.sum() == 13
    assert record["non_finite_pixels"] == 3
    assert record["low_value"] == 1.0 and record["high_value"] == 15.0
    all_nan = normalize(np.full((2, 2), np.nan))
    assert np.isnan(all_nan).all()


def test_normalize_constant_gamma_and_log() -> None:
    np.testing.assert_array_equal(normalize(np.full((3, 3), 7.0)), np.zeros((3, 3)))
    x = np.linspace(0, 1, 11)
    np.testing.assert_allclose(normalize(x, low_percentile=0, high_percentile=100, gamma=2), x**2)
    counts = np.array([0.0, 9.0, 99.0, 999.0])
    logged = normalize(counts, low_percentile=0, high_percentile=100, log=True)
    np.testing.assert_allclose(logged, np.log1p(counts) / np.log1p(999.0))
    # integers and booleans are fine
    assert normalize(np.array([[0, 1], [2, 3]], dtype=np.uint16)).max() == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"low_percentile": 50, "high_percentile": 50},
        {"low_percentile": -1},
        {"high_percentile": 101},
        {"gamma": 0},
        {"gamma": float("nan")},
    ],
)
def test_normalize_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ParameterError):
        normalize(np.ones((2, 2)), **kwargs)  # type: ignore[arg-type]


def test_normalize_refuses_complex() -> None:
    with pytest.raises(ParameterError, match="complex"):
        normalize(np.ones((2, 2), dtype=complex))


# -- vector colours -------------------------------------------------------------------------------
def test_to_rgb_vector_directions() -> None:
    field = np.zeros((2, 1, 5))
    field[:, 0, 0] = (0.0, 1.0)  # +col: hue 0, red
    field[:, 0, 1] = (1.0, 0.0)  # +row: hue 0.25
    field[:, 0, 2] = (0.0, -1.0)  # -col: hue 0.5, cyan
    field[:, 0, 3] = (0.0, 0.0)  # zero: black
    field[:, 0, 4] = (np.nan, 1.0)  # not finite: black
    rgb = to_rgb_vector(field, high_percentile=100)
    assert rgb.shape == (1, 5, 3)
    np.testing.assert_allclose(rgb[0, 0], (1, 0, 0))
    np.testing.assert_allclose(rgb[0, 1], (0.5, 1, 0))
    np.testing.assert_allclose(rgb[0, 2], (0, 1, 1))
    np.testing.assert_allclose(rgb[0, 3], (0, 0, 0))
    np.testing.assert_allclose(rgb[0, 4], (0, 0, 0))
    assert rgb.min() >= 0 and rgb.max() <= 1


def test_to_rgb_vector_magnitude_and_mean() -> None:
    field = np.zeros((2, 2, 2))
    field[1] = [[1.0, 2.0], [3.0, 4.0]]
    rgb = to_rgb_vector(vector_field(field), high_percentile=100)
    np.testing.assert_allclose(rgb[..., 0], [[0.25, 0.5], [0.75, 1.0]])
    offset = field + np.array([5.0, 5.0])[:, None, None]
    rgb_sub = to_rgb_vector(offset, high_percentile=100, subtract_mean=True)
    rgb_ref = to_rgb_vector(field - field.mean(axis=(1, 2), keepdims=True), high_percentile=100)
    np.testing.assert_allclose(rgb_sub, rgb_ref)
    with pytest.raises(ShapeError):
        to_rgb_vector(np.zeros((3, 4, 4)))


# -- PNG ------------------------------------------------------------------------------------------
def test_save_png_scan_image(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    img = scan_image(rng.poisson(100, size=(6, 9)).astype(np.int64), units="counts")
    path = save_png(img, tmp_path / "sub" / "bf.png", gamma=0.5)
    assert path == (tmp_path / "sub" / "bf.png").absolute()
    with Image.open(path) as im:
        assert im.size == (9, 6)  # width = columns, height = rows
        assert im.mode == "L"
        pixels = np.asarray(im)
    text = png_text(path)
    assert text[PNG_KEY_PREFIX + "operator"] == "virtual_bf"
    assert text[PNG_KEY_PREFIX + "units"] == "counts"
    assert text[PNG_KEY_PREFIX + "name"] == "bf"
    assert text[PNG_KEY_PREFIX + "kind"] == "ScanImage"
    assert json.loads(text[PNG_KEY_PREFIX + "shape"]) == [6, 9]
    display = json.loads(text[PNG_KEY_PREFIX + "display"])
    assert display["gamma"] == 0.5
    assert display["low_percentile"] == 0.5 and display["high_percentile"] == 99.5
    assert display["log"] is False
    assert display["low_value"] <= display["high_value"]
    assert text["Software"].startswith("quantem-flow")
    expected = np.rint(normalize(img.data, gamma=0.5) * 255).astype(np.uint8)
    np.testing.assert_array_equal(pixels, expected)


def test_save_png_units_with_non_ascii(tmp_path: Path) -> None:
    img = scan_image(np.arange(12.0).reshape(3, 4), units="1/Å")
    path = save_png(img, tmp_path / "x.png")
    assert png_text(path)[PNG_KEY_PREFIX + "units"] == "1/Å"


def test_save_png_vector_field_is_rgb(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    com = vector_field(rng.normal(size=(2, 5, 7)))
    path = save_png(com, tmp_path / "com.png", subtract_mean=True)
    with Image.open(path) as im:
        assert im.size == (7, 5) and im.mode == "RGB"
    display = json.loads(png_text(path)[PNG_KEY_PREFIX + "display"])
    assert display["mapping"] == "HSV colour wheel"
    assert display["subtract_mean"] is True
    assert len(display["subtracted_mean"]) == 2
    # a plain (2, R, C) array is a vector field too
    path2 = save_png(com.data, tmp_path / "com2.png")
    with Image.open(path2) as im:
        assert im.mode == "RGB"
    assert png_text(path2)[PNG_KEY_PREFIX + "units"].startswith("unknown")


def test_save_png_diffraction_pattern_uses_log(tmp_path: Path) -> None:
    pattern = np.ones((8, 10))
    pattern[3:5, 4:6] = 1000.0
    dp = DiffractionImage(
        data=pattern,
        units="counts per frame",
        axes=Calibration().detector_axes((8, 10)),
        provenance=Provenance(operator="mean_diffraction"),
        name="mean",
    )
    display = json.loads(png_text(save_png(dp, tmp_path / "m.png"))[PNG_KEY_PREFIX + "display"])
    assert display["log"] is True
    assert "automatically" in display["log_chosen"]
    display = json.loads(
        png_text(save_png(dp, tmp_path / "n.png", log=False))[PNG_KEY_PREFIX + "display"]
    )
    assert display["log"] is False and "log_chosen" not in display


def test_save_png_complex_object(tmp_path: Path) -> None:
    obj = np.exp(1j * np.linspace(0, 3, 12)).reshape(3, 4) * 2
    res = ComplexObject(
        data=obj,
        units="1",
        axes=CAL.scan_axes((3, 4)),
        provenance=Provenance(operator="ptychography"),
        name="obj",
    )
    path = save_png(res, tmp_path / "o.png")
    with Image.open(path) as im:
        assert im.mode == "RGB" and im.size == (4, 3)


def test_save_png_nan_pixels_are_black(tmp_path: Path) -> None:
    x = np.arange(12.0).reshape(3, 4)
    x[1, 2] = np.nan
    path = save_png(x, tmp_path / "nan.png", low_percentile=0, high_percentile=100)
    with Image.open(path) as im:
        pixels = np.asarray(im)
    assert pixels[1, 2] == 0 and pixels[2, 3] == 255
    assert json.loads(png_text(path)[PNG_KEY_PREFIX + "display"])["non_finite_pixels"] == 1


def test_save_png_errors(tmp_path: Path) -> None:
    path = save_png(np.ones((2, 2)), tmp_path / "a.png")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_png(np.ones((2, 2)), path)
    save_png(np.zeros((3, 3)), path, overwrite=True)
    with Image.open(path) as im:
        assert im.size == (3, 3)
    with pytest.raises(ParameterError, match=r"\.png"):
        save_png(np.ones((2, 2)), tmp_path / "a.jpg")
    with pytest.raises(ShapeError):
        save_png(np.ones(5), tmp_path / "b.png")
    with pytest.raises(ParameterError):
        save_png([[1, 2]], tmp_path / "c.png")  # type: ignore[arg-type]
