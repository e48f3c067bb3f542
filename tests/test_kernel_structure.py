"""The CPU runtime's structured frame pass (issue 14): mask and moment rows by detector cells.

The structured kernel must give the fused kernel's values: bit for bit on
integer data for mask rows and for moment rows with an integer or
half-integer centre (both exact), within a few ulps otherwise; general
real-valued rows keep the fused kernel; provenance names the variant.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.runtimes.cpu import CpuRuntime, structure
from quantem_flow.runtimes.cpu.kernels import frame_pass_variant
from quantem_flow.runtimes.nonfinite import supported_dot
from quantem_flow.synthetic import synthetic_dataset
from quantem_flow.testing.runtime_conformance import chunk_of, payload_for


def _disk(shape: tuple[int, int], center: tuple[float, float], r0: float, r1: float) -> np.ndarray:
    rr, cc = np.mgrid[: shape[0], : shape[1]]
    d = np.hypot(rr - center[0], cc - center[1])
    return ((d >= r0) & (d < r1)).astype(np.float64).ravel()


def _moments(mask: np.ndarray, shape: tuple[int, int], center: tuple[float, float]) -> np.ndarray:
    """The two maps center_of_mass builds: ``mask * (row - c_r)``, ``mask * (col - c_c)``."""
    m = mask.reshape(shape)
    rr = (np.arange(shape[0], dtype=np.float64) - center[0])[:, None] * np.ones(shape[1])
    cc = np.ones(shape[0])[:, None] * (np.arange(shape[1], dtype=np.float64) - center[1])
    return np.stack([(m * rr).ravel(), (m * cc).ravel()])


def _frames(dtype: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal((n, k)) * 50 + 20).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=(n, k), endpoint=True, dtype=dtype)


def _both(frames: np.ndarray, weights: np.ndarray, shape: tuple[int, int], **kw: Any) -> Any:
    new = frame_pass_variant(frames, weights, want_sum=True, want_max=True, frame_shape=shape, **kw)
    old = frame_pass_variant(
        frames, weights, want_sum=True, want_max=True, frame_shape=shape, structured=False
    )
    return new, old


def _assert_same(new: Any, old: Any) -> None:
    np.testing.assert_array_equal(new[0], old[0])
    np.testing.assert_array_equal(new[1], old[1])
    np.testing.assert_array_equal(new[2], old[2])
    assert new[1].dtype == old[1].dtype and new[2].dtype == old[2].dtype


SHAPES = [(37, 45), (64, 64), (1, 33), (33, 1), (3, 700)]  # (3, 700): runs split at 256


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "int16", "int32"])
@pytest.mark.parametrize("shape", SHAPES)
def test_masks_and_moments_equal_the_fused_kernel_bit_for_bit(
    dtype: str, shape: tuple[int, int]
) -> None:
    """BF, ABF, ADF to the edge (corners too), an annulus, overlapping, CoM on 0.5-grid centres."""
    k = shape[0] * shape[1]
    c = ((shape[0] - 1) / 2, (shape[1] - 1) / 2 + 0.5)  # half-integer / integer centres
    bf = _disk(shape, c, 0, 6)
    abf = _disk(shape, c, 3, 6)  # overlaps BF
    adf = _disk(shape, c, 9, 1e9)  # to the detector's edge
    ann = _disk(shape, (c[0] + 2, c[1] - 3), 4, 12)  # off-centre: crosses the others
    com_mask = np.ones(k)
    com_disk = _disk(shape, c, 0, 11)
    weights = np.concatenate(
        [
            np.stack([bf, abf, adf, ann, com_mask]),
            _moments(com_mask, shape, c),
            com_disk[None],
            _moments(com_disk, shape, (c[0] - 1.5, c[1] + 2.0)),
        ]
    )
    frames = _frames(dtype, 23, k)  # not a multiple of 4: the tail frames too
    new, old = _both(frames, weights, shape, structured=True)
    assert old[3]["variant"] == "fused"
    _assert_same(new, old)
    plan = structure.analyse_weights(weights, frame_shape=shape, force=True)
    if not plan.applicable(np.dtype(dtype))[0]:  # (3, 700) uint32: 2**32 * 2100 * 1400 >= 2**53
        assert np.dtype(dtype).itemsize == 4 and shape == (3, 700)
        assert new[3]["variant"] == "fused" and "2**53" in new[3]["why"], new[3]
        return
    assert new[3]["variant"] == "structured", new[3]
    if shape[0] > 1 and shape[1] > 1:
        assert new[3]["rows"].count("row moment") == 2, new[3]
        assert new[3]["rows"].count("column moment") == 2, new[3]


@pytest.mark.parametrize("dtype", ["uint16", "int16", "uint8"])
def test_extreme_values_on_long_runs_stay_exact(dtype: str) -> None:
    """Every pixel at the dtype's extreme on 256-pixel runs: the int32 run sums do not wrap."""
    shape = (2, 1024)
    k = shape[0] * shape[1]
    ones = np.ones(k)
    weights = np.concatenate([ones[None], _moments(ones, shape, (0.5, 511.5))])
    info = np.iinfo(dtype)
    for value in (info.max, info.min):
        frames = np.full((9, k), value, dtype=dtype)
        new, old = _both(frames, weights, shape)
        assert new[3]["variant"] == "structured", new[3]
        _assert_same(new, old)
        expected_col = float(value) * (np.arange(1024) - 511.5).sum() * 2
        np.testing.assert_array_equal(new[0][:, 2], expected_col)


def test_moment_rows_with_any_centre_are_within_a_few_ulps() -> None:
    """A centre off the 0.5 grid: both kernels round the same exact sum; the new one less."""
    shape = (48, 52)
    c = (23.317, 26.0711)
    mask = _disk(shape, c, 0, 20)
    weights = np.concatenate([mask[None], _moments(mask, shape, c)])
    frames = _frames("uint16", 16, mask.size)
    new, old = _both(frames, weights, shape, structured=True)
    assert new[3]["variant"] == "structured"
    exact = frames.astype(np.float64) @ weights.T  # a third rounding of the same sums
    scale = frames.astype(np.float64) @ np.abs(weights).T
    assert np.all(np.abs(new[0] - old[0]) <= 1e-14 * scale)
    assert np.all(np.abs(new[0] - exact) <= 1e-14 * scale)
    np.testing.assert_array_equal(new[0][:, 0], old[0][:, 0])  # the mask row is exact


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_real_data_within_the_declared_tolerance(dtype: str) -> None:
    shape = (40, 44)
    c = (19.5, 21.5)
    bf = _disk(shape, c, 0, 8)
    adf = _disk(shape, c, 12, 1e9)
    com = np.ones(bf.size)
    weights = np.concatenate([np.stack([bf, adf, com]), _moments(com, shape, c)])
    frames = _frames(dtype, 21, bf.size)
    new, old = _both(frames, weights, shape, structured=True)
    assert new[3]["variant"] == "structured"
    scale = np.abs(frames.astype(np.float64)) @ np.abs(weights).T
    assert np.all(np.abs(new[0] - old[0]) <= 1e-12 * scale)
    np.testing.assert_array_equal(new[2], old[2])
    np.testing.assert_allclose(new[1], old[1], rtol=1e-12)


def test_general_real_weights_take_the_fused_kernel() -> None:
    rng = np.random.default_rng(1)
    shape = (16, 20)
    weights = rng.standard_normal((3, 320))
    frames = _frames("uint16", 9, 320)
    new, old = _both(frames, weights, shape, structured=True)
    assert new[3]["variant"] == "fused", new[3]
    assert "no mask or moment rows" in new[3]["why"]
    _assert_same(new, old)


def test_a_scaled_mask_is_a_general_row() -> None:
    """0/2 weights are not a mask: they keep the fused kernel (no silent reinterpretation)."""
    shape = (16, 16)
    weights = 2.0 * _disk(shape, (7.5, 7.5), 0, 5)[None]
    plan = structure.analyse_weights(weights, frame_shape=shape, force=True)
    assert plan.kinds == ("general",)


def test_mixed_plans_structured_and_general_rows() -> None:
    rng = np.random.default_rng(2)
    shape = (30, 34)
    k = shape[0] * shape[1]
    c = (14.5, 16.5)
    bf = _disk(shape, c, 0, 7)
    real = rng.standard_normal((3, k)) * _disk(shape, c, 0, 12)
    weights = np.concatenate(
        [bf[None], real[:1], _moments(bf, shape, c), real[1:], _disk(shape, c, 9, 1e9)[None]]
    )
    for dtype in ("uint16", "float32"):
        frames = _frames(dtype, 27, k)
        new, old = _both(frames, weights, shape, structured=True)
        info = new[3]
        assert info["variant"] == "structured", info
        assert info["rows"] == [
            "mask",
            "general",
            "row moment",
            "column moment",
            "general",
            "general",
            "mask",
        ]
        assert "general rows: 3" in info["summary"]
        # general rows go through the same fused kernel in the same groups of four frames
        gen = [1, 4, 5]
        np.testing.assert_array_equal(new[0][:, gen], old[0][:, gen])
        if dtype == "uint16":
            _assert_same(new, old)


def test_fragmented_masks_stay_fused_unless_forced() -> None:
    rng = np.random.default_rng(3)
    shape = (32, 32)
    weights = (rng.random((2, 1024)) < 0.4).astype(np.float64)
    frames = _frames("uint16", 12, 1024)
    auto, old = _both(frames, weights, shape)
    assert auto[3]["variant"] == "fused"
    assert "fragmented" in auto[3]["why"]
    forced, _ = _both(frames, weights, shape, structured=True)
    assert forced[3]["variant"] == "structured"
    _assert_same(forced, old)


def test_64_bit_integers_keep_the_fused_kernel_by_the_exactness_bound() -> None:
    shape = (16, 16)
    weights = _disk(shape, (7.5, 7.5), 0, 6)[None]
    frames = _frames("uint16", 8, 256).astype(np.int64)
    new, old = _both(frames, weights, shape, structured=True)
    assert new[3]["variant"] == "fused"
    assert "2**53" in new[3]["why"]
    _assert_same(new, old)


def test_nonfinite_pixels_outside_a_support_do_not_touch_its_rows() -> None:
    shape = (24, 24)
    c = (11.5, 11.5)
    bf = _disk(shape, c, 0, 5)
    ring = _disk(shape, c, 5, 8)
    com = _disk(shape, c, 0, 10)
    weights = np.concatenate([np.stack([bf, ring, com]), _moments(com, shape, c)])
    frames = _frames("float32", 10, bf.size)
    outside = int(np.flatnonzero(_disk(shape, c, 10, 1e9))[0])  # in no support
    inside = 11 * 24 + 2  # row 11, column 2: inside the CoM support only
    frames[2, outside] = np.nan
    frames[5, outside] = np.inf
    frames[7, inside] = -np.inf
    new = frame_pass_variant(
        frames, weights, want_sum=False, want_max=False, frame_shape=shape, structured=True
    )
    assert new[3]["variant"] == "structured"
    ref = supported_dot(frames, weights)
    assert np.isfinite(new[0][[2, 5]]).all()
    np.testing.assert_array_equal(np.isfinite(new[0]), np.isfinite(ref))
    both = np.isfinite(ref)
    np.testing.assert_array_equal(new[0][~both], ref[~both])
    scale = np.nan_to_num(np.abs(frames.astype(np.float64)), posinf=0) @ np.abs(weights).T
    assert np.all(np.abs(new[0][both] - ref[both]) <= 1e-12 * scale[both])


def test_a_nan_on_the_centre_line_leaves_the_moment_finite() -> None:
    """The moment map is 0 on the centre row, inside the mask: a NaN there must not count."""
    shape = (21, 21)
    c = (10.0, 10.0)  # integer centre: row 10 and column 10 have weight 0 in the moments
    mask = _disk(shape, c, 0, 8)
    weights = np.concatenate([mask[None], _moments(mask, shape, c)])
    frames = _frames("float64", 4, mask.size)
    frames[1, 10 * 21 + 4] = np.nan  # row 10, column 4: in the mask and the column map
    got = frame_pass_variant(
        frames, weights, want_sum=False, want_max=False, frame_shape=shape, structured=True
    )
    assert got[3]["variant"] == "structured"
    assert np.isnan(got[0][1, 0]) and np.isnan(got[0][1, 2])
    assert np.isfinite(got[0][1, 1])  # the row moment's weight there is 0
    np.testing.assert_allclose(got[0][1, 1], supported_dot(frames, weights)[1, 1], rtol=1e-12)


@pytest.fixture
def cheap_runs() -> Iterator[None]:
    """Runs cost nothing in the estimate: small test detectors take the structured kernel."""
    saved = structure.RUN_OVERHEAD_PIXELS
    structure._CACHE.clear()
    structure.RUN_OVERHEAD_PIXELS = 0
    try:
        yield
    finally:
        structure.RUN_OVERHEAD_PIXELS = saved
        structure._CACHE.clear()


def test_the_cost_estimate_picks_the_cheaper_kernel() -> None:
    """128 x 128: BF, BF+ADF, BF+ADF+CoM structured; 2-pixel stripes fused (measured 0.17x)."""
    shape = (128, 128)
    c = (63.7, 64.2)
    bf = _disk(shape, c, 0, 20)
    adf = _disk(shape, c, 30, 1e9)
    ones = np.ones(bf.size)
    com = np.concatenate([ones[None], _moments(ones, shape, c)])
    for weights in (bf[None], np.stack([bf, adf]), np.concatenate([np.stack([bf, adf]), com])):
        plan = structure.analyse_weights(weights, frame_shape=shape)
        assert plan.structured, plan.reason
    stripes = (np.arange(bf.size) // 2) % 2 == 0
    plan = structure.analyse_weights(np.stack([stripes, ~stripes]).astype(float), frame_shape=shape)
    assert not plan.structured and "fragmented" in plan.reason, plan.reason


@pytest.mark.usefixtures("cheap_runs")
@pytest.mark.parametrize("representation", ["dense", "encoded", "packed"])
def test_runtime_records_the_variant_and_representations_agree(representation: str) -> None:
    shape = (20, 22)
    c = (9.5, 10.5)
    bf = _disk(shape, c, 0, 5)
    weights = np.concatenate([bf[None], _disk(shape, c, 7, 1e9)[None], _moments(bf, shape, c)])
    frames = _frames("uint16", 30, bf.size) // 64
    rt = CpuRuntime()
    dense = rt.run_frame_pass(
        chunk_of("dense", frames.reshape(1, 30, *shape)), weights, want_sum=True, want_max=True
    )
    got = rt.run_frame_pass(
        payload_for(representation, frames, shape), weights, want_sum=True, want_max=True
    )
    assert got.variant is not None and got.variant["variant"] == "structured", got.variant
    assert "2 mask rows, 2 moment rows" in got.variant["summary"]
    np.testing.assert_array_equal(got.per_frame, dense.per_frame)
    fused = frame_pass_variant(
        frames, weights, want_sum=True, want_max=True, frame_shape=shape, structured=False
    )
    np.testing.assert_array_equal(got.per_frame, fused[0])
    np.testing.assert_array_equal(got.pattern_sum, fused[1])
    np.testing.assert_array_equal(got.pattern_max, fused[2])


@pytest.fixture
def fused_only() -> Iterator[Any]:
    """A context that turns the structured kernel off (no plan may have cells)."""
    import contextlib

    @contextlib.contextmanager
    def off() -> Iterator[None]:
        saved = structure.MAX_CELLS
        structure._CACHE.clear()
        structure.MAX_CELLS = -1
        try:
            yield
        finally:
            structure.MAX_CELLS = saved
            structure._CACHE.clear()

    return off


@pytest.mark.usefixtures("cheap_runs")
@pytest.mark.parametrize("calibrated", [False, True])
def test_operators_equal_the_fused_kernel_with_detector_crop_and_bin(
    fused_only: Any, calibrated: bool
) -> None:
    data, _ = synthetic_dataset(scan_shape=(6, 7), detector_shape=(70, 77), probe_radius_px=9)
    cal = (
        qf.Calibration(detector_sampling=(0.5, 0.5), detector_units="mrad")
        if calibrated
        else qf.Calibration()
    )
    ds = qf.open(data, calibration=cal).crop_detector((2, 69, 1, 76)).bin_detector(2)
    u = "mrad" if calibrated else "px"  # 1 mrad per binned pixel: the same radii either way
    centre = (16.5, 18.0)
    ops = {
        "bf": qf.virtual_bf(ds, radius=4.5, units=u, center=centre),
        "abf": qf.virtual_abf(ds, inner=2, outer=4.5, units=u, center=centre),
        "adf": qf.virtual_adf(ds, inner=7, units=u, center=centre),
        "annular": qf.virtual_annular(ds, inner=3, outer=9, units=u, center=(15.0, 20.5)),
        "com": qf.center_of_mass(ds, center=centre),
        "com_masked": qf.center_of_mass(ds, center=centre, mask_radius=6, mask_units=u),
        "com_auto": qf.center_of_mass(ds),
    }
    # the compiled kernel in the foreground: its variant, whatever this process ran before
    with qf.config.set(jit_in_background=False):
        new = dict(zip(ops, qf.compute(*ops.values(), client="synchronous"), strict=True))
    with fused_only():
        old = dict(zip(ops, qf.compute(*ops.values(), client="synchronous"), strict=True))
    for name in ops:
        if name == "com_auto":  # a fitted centre: both kernels round the same sums
            np.testing.assert_allclose(new[name].data, old[name].data, rtol=1e-13, atol=1e-13)
        else:
            np.testing.assert_array_equal(new[name].data, old[name].data, err_msg=name)
    chunks = new["bf"].provenance.execution["chunks"]
    variants = {c["frame_pass_variant"]["variant"] for c in chunks}
    assert variants == {"structured"}, chunks[0].get("frame_pass_variant")
    summary = chunks[0]["frame_pass_variant"]["summary"]
    assert "moment rows" in summary and "general rows: 0" in summary, summary
    old_chunks = old["bf"].provenance.execution["chunks"]
    assert {c["frame_pass_variant"]["variant"] for c in old_chunks} == {"fused"}


def _runs_only(plan: structure.WeightPlan) -> structure.WeightPlan:
    """``plan`` without its segments: the per-cell-run moment kernel."""
    import dataclasses

    return dataclasses.replace(plan, seg_arrays=(), n_segments=0, n_subruns=0, subrun_pixels=0)


def _structured_out(frames: np.ndarray, plan: structure.WeightPlan) -> np.ndarray:
    out = np.full((frames.shape[0], plan.n_out), np.nan)  # moment rows' sums after the rows
    acc_sum = np.zeros(frames.shape[1], dtype=np.int64)
    acc_max = np.zeros(frames.shape[1], dtype=frames.dtype)
    structure.structured_pass(frames, plan, out, acc_sum, acc_max, do_sum=False, do_max=False)
    return out[:, : plan.n_rows]


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int16"])
@pytest.mark.parametrize("shape", [(37, 45), (64, 64), (3, 700), (40, 600)])
def test_segments_equal_the_run_kernel_and_the_fused_kernel_bit_for_bit(
    dtype: str, shape: tuple[int, int]
) -> None:
    """Two moment classes, cells in no moment support, rows cut at 256 pixels, 4k + 3 frames."""
    k = shape[0] * shape[1]
    c = ((shape[0] - 1) / 2, (shape[1] - 1) / 2 + 0.5)
    bf = _disk(shape, c, 0, 6)
    adf = _disk(shape, c, 9, 1e9)
    ann = _disk(shape, (c[0] + 2, c[1] - 3), 4, 12)  # sums only, crosses the others
    com = _disk(shape, c, 0, 15)  # CoM over a disk: the ADF outside it has no moments
    com2 = _disk(shape, (c[0] - 1, c[1] + 2), 3, 9)  # a second moment support
    weights = np.concatenate(
        [
            np.stack([bf, adf, ann, com, com2]),
            _moments(com, shape, c),
            _moments(com2, shape, (c[0] - 1.5, c[1] + 2.0)),
        ]
    )
    frames = _frames(dtype, 11, k)
    plan = structure.analyse_weights(weights, frame_shape=shape, force=True)
    assert structure.integer_mode(np.dtype(dtype), plan) == 3
    assert plan.n_segments < plan.n_runs and plan.subrun_pixels < plan.touched
    assert int(plan.seg_arrays[1].max()) <= structure.MAX_RUN
    assert (plan.seg_arrays[2] < 0).any() and len(
        set(plan.seg_arrays[2][plan.seg_arrays[2] >= 0])
    ) == 2
    new = _structured_out(frames, plan)
    np.testing.assert_array_equal(new, _structured_out(frames, _runs_only(plan)))
    got, old = _both(frames, weights, shape, structured=True)
    assert got[3]["moments"].startswith("segments"), got[3]
    _assert_same(got, old)
    np.testing.assert_array_equal(got[0], new)


@pytest.mark.parametrize("dtype", ["uint16", "int16", "uint8"])
def test_segments_at_the_dtype_extremes_do_not_wrap(dtype: str) -> None:
    """Every pixel at the dtype's extreme, segments of 256 pixels: int32 sums and moments exact."""
    shape = (4, 1024)
    k = shape[0] * shape[1]
    ones = np.ones(k)
    mid = _disk(shape, (1.5, 511.5), 0, 300)  # cuts each row into three cells of one class
    weights = np.concatenate([np.stack([ones, mid]), _moments(ones, shape, (1.5, 511.5))])
    plan = structure.analyse_weights(weights, frame_shape=shape, force=True)
    assert int(plan.seg_arrays[1].max()) == structure.MAX_RUN
    info = np.iinfo(dtype)
    for value in (info.max, info.min):
        frames = np.full((7, k), value, dtype=dtype)
        new, old = _both(frames, weights, shape, structured=True)
        assert new[3]["moments"].startswith("segments"), new[3]
        _assert_same(new, old)


def test_32_bit_integers_and_real_data_keep_the_run_kernel_and_say_why() -> None:
    """Segments need int32 sums of 8/16-bit values; 32-bit integers and reals keep the runs."""
    shape = (32, 32)
    c = (15.5, 15.5)
    weights = np.concatenate([_disk(shape, c, 0, 5)[None], np.ones((1, 1024))])
    weights = np.concatenate([weights, _moments(np.ones(1024), shape, c)])
    plan = structure.analyse_weights(weights, frame_shape=shape)
    assert plan.n_segments > 0
    for dtype, words in (("uint32", "8/16-bit"), ("float32", "real data")):
        frames = _frames(dtype, 9, 1024)
        assert structure.integer_mode(np.dtype(dtype), plan) < 3
        new, old = _both(frames, weights, shape, structured=True)
        assert new[3]["variant"] == "structured", new[3]
        assert new[3]["moments"].startswith("per cell run") and words in new[3]["moments"]
        if dtype == "uint32":
            _assert_same(new, old)
