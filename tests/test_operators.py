"""Every operator against an independent NumPy reference, on rectangular data."""

from __future__ import annotations

import math

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import CalibrationError, ParameterError, ShapeError
from tests.conftest import probe_data
from tests.reference import ref_annulus, ref_bin, ref_com, ref_virtual

SYNC = {"client": "synchronous"}


@pytest.fixture
def data(rng: np.random.Generator) -> np.ndarray:
    return probe_data(rng)


@pytest.mark.parametrize(
    "dtype", [np.uint8, np.uint16, np.uint32, np.int16, np.float32, np.float64]
)
def test_virtual_annular_matches_reference_for_every_dtype(
    rng: np.random.Generator, dtype: type
) -> None:
    data = probe_data(rng, dtype=dtype, bright=100)
    center = (float(rng.uniform(6, 11)), float(rng.uniform(10, 16)))
    inner, outer = float(rng.uniform(0, 3)), float(rng.uniform(5, 12))
    ds = qf.open(data, chunk_rows=int(rng.integers(1, 4)))
    (img,) = qf.compute(qf.virtual_annular(ds, inner=inner, outer=outer, center=center), **SYNC)
    mask = ref_annulus(ds.detector_shape, center, inner, outer)
    expected = ref_virtual(data, mask)
    assert img.shape == data.shape[:2]
    if np.dtype(dtype).kind in "ui":
        assert img.data.dtype == np.int64
        np.testing.assert_array_equal(img.data, expected)  # exact integer sums
    else:
        np.testing.assert_allclose(img.data, expected, rtol=1e-5)
    assert img.units == ("counts" if np.dtype(dtype).kind in "ui" else "intensity")


def test_bf_abf_adf_auto_geometry_follows_the_probe(data: np.ndarray) -> None:
    ds = qf.open(data, chunk_rows=3)
    bf, abf, adf = qf.compute(qf.virtual_bf(ds), qf.virtual_abf(ds), qf.virtual_adf(ds), **SYNC)
    probe = bf.provenance.parameters["probe"]
    cr, cc = probe["center"]
    # the disk in probe_data is centred at (8.6, 14.2), radius 4.5, with +-1 px jitter
    assert abs(cr - 8.6) < 1.0 and abs(cc - 14.2) < 1.0
    assert 3.5 < probe["radius"] < 5.5
    r = probe["radius"]
    for img, (inner, outer) in ((bf, (0, r)), (abf, (r / 2, r)), (adf, (1.5 * r, math.inf))):
        mask = ref_annulus(ds.detector_shape, (cr, cc), inner, outer)
        np.testing.assert_array_equal(img.data, ref_virtual(data, mask))
        assert img.provenance.parameters["center_from"] == "probe estimate"
    assert "sampled" in probe["pattern_from"]


def test_virtual_mask_bool_and_float_weights(rng: np.random.Generator, data: np.ndarray) -> None:
    ds = qf.open(data)
    m_bool = rng.random(ds.detector_shape) < 0.3
    m_float = rng.random(ds.detector_shape)
    a, b = qf.compute(qf.virtual_mask(ds, m_bool), qf.virtual_mask(ds, m_float, name="w"), **SYNC)
    np.testing.assert_array_equal(a.data, ref_virtual(data, m_bool))
    np.testing.assert_allclose(b.data, ref_virtual(data, m_float), rtol=1e-5)
    assert a.provenance.parameters["mask"]["sha256"] != b.provenance.parameters["mask"]["sha256"]
    assert b.name == "w"


def test_mask_with_swapped_detector_axes_is_refused(data: np.ndarray) -> None:
    ds = qf.open(data)
    kr, kc = ds.detector_shape
    with pytest.raises(ShapeError, match=r"\(20, 26\)"):
        qf.virtual_mask(ds, np.ones((kc, kr), dtype=bool))


def test_row_column_order_is_kept(rng: np.random.Generator) -> None:
    """A transposed reference must fail: the result is (R_r, R_c), not (R_c, R_r)."""
    data = probe_data(rng, scan=(5, 8))
    ds = qf.open(data)
    mask = np.zeros(ds.detector_shape, dtype=bool)
    mask[2:5, 7:19] = True  # asymmetric in k_r / k_c
    (img,) = qf.compute(qf.virtual_mask(ds, mask), **SYNC)
    assert img.shape == (5, 8)
    np.testing.assert_array_equal(img.data, ref_virtual(data, mask))
    swapped_mask = np.zeros(ds.detector_shape, dtype=bool)
    swapped_mask[7:19, 2:5] = True  # the same box with k_r and k_c exchanged
    assert not np.array_equal(img.data, ref_virtual(data, swapped_mask))


@pytest.mark.parametrize("reduction", ["mean", "max", "sum"])
def test_patterns(data: np.ndarray, reduction: str) -> None:
    ds = qf.open(data, chunk_rows=2)
    fn = {"mean": qf.mean_diffraction, "max": qf.max_diffraction, "sum": qf.sum_diffraction}
    (pat,) = qf.compute(fn[reduction](ds), **SYNC)
    if reduction == "sum":
        expected = data.sum(axis=(0, 1), dtype=np.int64)
        assert pat.data.dtype == np.int64
        np.testing.assert_array_equal(pat.data, expected)
    elif reduction == "max":
        np.testing.assert_array_equal(pat.data, data.max(axis=(0, 1)))
        assert pat.data.dtype == data.dtype
    else:
        np.testing.assert_allclose(pat.data, data.mean(axis=(0, 1), dtype=np.float64), rtol=1e-12)
    assert pat.shape == ds.detector_shape
    assert pat.axes[0].name == "k_row" and pat.axes[1].name == "k_col"


def test_max_pattern_propagates_nan_like_numpy(rng: np.random.Generator) -> None:
    data = rng.random((3, 4, 5, 6)).astype(np.float32)
    data[1, 2, 3, 4] = np.nan
    (pat,) = qf.compute(qf.max_diffraction(qf.open(data)), **SYNC)
    np.testing.assert_array_equal(pat.data, data.max(axis=(0, 1)))


def test_center_of_mass_matches_reference(rng: np.random.Generator, data: np.ndarray) -> None:
    ds = qf.open(data, chunk_rows=4)
    center = (float(rng.uniform(5, 12)), float(rng.uniform(9, 17)))
    (com,) = qf.compute(qf.center_of_mass(ds, center=center), **SYNC)
    np.testing.assert_allclose(com.data, ref_com(data, center), rtol=1e-5, atol=1e-9)
    assert com.units == "px"
    assert com.shape == (2, *data.shape[:2])


def test_center_of_mass_masked_and_calibrated(rng: np.random.Generator, data: np.ndarray) -> None:
    cal = qf.Calibration(detector_sampling=(0.7, 1.1), detector_units="mrad")
    ds = qf.open(data, calibration=cal)
    center = (8.0, 14.0)
    (com,) = qf.compute(
        qf.center_of_mass(ds, center=center, mask_radius=6.0, mask_units="px"), **SYNC
    )
    mask = ref_annulus(ds.detector_shape, center, 0, 6.0)
    ref = ref_com(data, center, mask)
    ref[0] *= 0.7
    ref[1] *= 1.1
    np.testing.assert_allclose(com.data, ref, rtol=1e-5, atol=1e-9)
    assert com.units == "mrad"


def test_empty_frames_give_nan_com_and_a_note(rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(3, 4))
    data[1, 2] = 0
    (com,) = qf.compute(qf.center_of_mass(qf.open(data), center=(8, 14)), **SYNC)
    assert np.isnan(com.data[:, 1, 2]).all()
    assert np.isfinite(np.delete(com.data.reshape(2, -1), 6, axis=1)).all()
    assert com.provenance.parameters["n_empty_frames"] == 1
    assert any("zero counts" in n for n in com.provenance.notes)


def test_mrad_radii_need_a_calibrated_detector(data: np.ndarray) -> None:
    ds = qf.open(data)
    with pytest.raises(CalibrationError, match="uncalibrated"):
        qf.virtual_annular(ds, inner=10, outer=20, units="mrad")
    with pytest.raises(CalibrationError, match="uncalibrated"):
        qf.center_of_mass(ds, units="mrad")


def test_mrad_geometry_on_calibrated_detector(data: np.ndarray) -> None:
    cal = qf.Calibration(detector_sampling=(0.5, 0.8), detector_units="mrad")
    ds = qf.open(data, calibration=cal)
    center = (8.6, 14.2)
    (img,) = qf.compute(
        qf.virtual_annular(ds, inner=1.0, outer=3.5, units="mrad", center=center), **SYNC
    )
    mask = ref_annulus(ds.detector_shape, center, 1.0, 3.5, (0.5, 0.8))
    np.testing.assert_array_equal(img.data, ref_virtual(data, mask))
    assert img.provenance.parameters["radii_units"] == "mrad"


def test_empty_detector_region_is_an_error(data: np.ndarray) -> None:
    ds = qf.open(data)
    with pytest.raises(ParameterError, match="selects no pixel"):
        qf.compute(qf.virtual_annular(ds, inner=100, outer=200, center=(8, 8)), **SYNC)


def test_binning_keeps_partial_edge_bins_and_widens(rng: np.random.Generator) -> None:
    data = probe_data(rng, det=(21, 26), dtype=np.uint16, bright=60000, background=5000)
    ds = qf.open(data).bin_detector((4, 3))
    assert ds.detector_shape == (6, 9)
    assert ds.dtype == np.uint32
    block = ds.load_block((0, ds.shape[0]))
    expected = ref_bin(data, (4, 3))
    np.testing.assert_array_equal(block, expected)
    assert block.sum(dtype=np.uint64) == data.sum(dtype=np.uint64)  # count-preserving
    (pat,) = qf.compute(qf.sum_diffraction(ds), **SYNC)
    np.testing.assert_array_equal(pat.data, expected.sum(axis=(0, 1), dtype=np.int64))
    p = pat.provenance
    assert p.flags == {"native": False, "cropped": False, "binned": True, "thresholded": False}
    assert p.transforms[0]["transform"] == "bin_detector"
    assert p.transforms[0]["factor"] == [4, 3]


def test_regions_compose_and_are_recorded(rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(9, 11), det=(20, 26))
    ds = (
        qf.open(data).crop_scan((1, 8, 2, 10)).crop_detector((2, 18, 3, 25)).crop_scan((1, 5, 0, 6))
    )
    assert ds.shape == (4, 6, 16, 22)
    np.testing.assert_array_equal(ds.load_block((0, 4)), data[2:6, 2:8, 2:18, 3:25])
    (img,) = qf.compute(qf.virtual_mask(ds, np.ones((16, 22), bool)), **SYNC)
    np.testing.assert_array_equal(img.data, data[2:6, 2:8, 2:18, 3:25].sum(axis=(2, 3)))
    assert img.provenance.flags["cropped"] and not img.provenance.native
    kinds = [t["transform"] for t in img.provenance.transforms]
    assert kinds == ["scan_region", "detector_region"]
    assert img.provenance.transforms[0]["region"] == [2, 6, 2, 8]


def test_crop_moves_the_calibrated_origin(data: np.ndarray) -> None:
    ds = qf.open(data, calibration=qf.Calibration(detector_origin=(8.6, 14.2)))
    cropped = ds.crop_detector((2, 20, 4, 26))
    assert cropped.calibration.detector_origin == pytest.approx((6.6, 10.2))
    binned = ds.bin_detector(2)
    assert binned.calibration.detector_origin == pytest.approx(((8.6 - 0.5) / 2, (14.2 - 0.5) / 2))


def test_bad_regions_raise(data: np.ndarray) -> None:
    ds = qf.open(data)
    with pytest.raises(ShapeError, match="half-open"):
        ds.crop_scan((3, 3, 0, 5))
    with pytest.raises(ShapeError):
        ds.crop_detector((0, 30, 0, 5))
    with pytest.raises(ParameterError):
        ds.bin_detector(0)


def test_operators_share_one_pass_and_read_each_chunk_once(data: np.ndarray) -> None:
    ds = qf.open(data, chunk_rows=2)
    out = qf.compute(
        qf.virtual_bf(ds, center=(8, 14), radius=4),
        qf.virtual_adf(ds, center=(8, 14), inner=6),
        qf.center_of_mass(ds, center=(8, 14)),
        qf.mean_diffraction(ds),
        **SYNC,
    )
    ex = out[0].provenance.execution
    assert ex["read_once"] is True
    assert ex["bytes_read"] == data.nbytes
    assert ex["n_chunks"] == 4 and len(ex["chunks"]) == 4
    assert {r["runtime"] for r in ex["chunks"]} == {"cpu"}
    assert ex["weights_in_pass"] == 5  # bf, adf and three CoM maps, one fused pass
    assert all(o.provenance.execution["bytes_read"] == data.nbytes for o in out)
