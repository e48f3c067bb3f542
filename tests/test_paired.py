"""The paired representation, its CPU kernel and the electron-counted (stempy) reader.

Inputs are fresh random arrays each run (the ``rng`` fixture prints the seed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.dataset import DetectorOp
from quantem_flow.errors import (
    ConversionError,
    CorruptChunkError,
    FormatError,
    ParameterError,
    ScanShapeError,
    ShapeError,
    UnsupportedOperationError,
)
from quantem_flow.io.counted import CountedSource, write_counted
from quantem_flow.representations import Chunk, chunk_of, get_representation
from quantem_flow.representations.paired import (
    PAIRED_SCHEMA,
    Paired,
    PairedPayload,
    bin_pairs,
    counts_dtype_for,
    pairs_from_events,
    threshold_pairs,
)
from quantem_flow.runtimes.cpu import CpuRuntime
from tests.conftest import probe_data
from tests.io.writers import write_hdf5, write_npy, write_stempy
from tests.representation_parity import assert_operator_parity

REP = Paired()

# ----------------------------------------------------------------------------- data


def low_dose(
    rng: np.random.Generator,
    scan: tuple[int, int] = (5, 7),
    det: tuple[int, int] = (13, 22),
    *,
    per_100: float = 1.0,
    dtype: Any = np.uint16,
) -> np.ndarray:
    """Sparse counted frames: ~``per_100`` electrons per 100 pixels, more in a probe disk."""
    rr, cc = np.indices(det)
    disk = (rr - det[0] * 0.45) ** 2 + (cc - det[1] * 0.55) ** 2 < (min(det) / 4) ** 2
    lam = np.where(disk, 8.0, 0.3)
    lam *= per_100 / 100.0 / lam.mean()
    return rng.poisson(lam, size=(*scan, *det)).astype(dtype)


def events_of(frame: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One flat index per electron, in random order (as a counting pipeline may emit them)."""
    flat = frame.ravel()
    nz = np.flatnonzero(flat)
    ev = np.repeat(nz, flat[nz].astype(np.int64))
    rng.shuffle(ev)
    return ev


def stempy_file(path: Path, dense: np.ndarray, rng: np.random.Generator, **kwargs: Any) -> Path:
    R, C, kr, kc = dense.shape
    frames = dense.reshape(R * C, kr, kc)
    return write_stempy(path, [events_of(f, rng) for f in frames], (R, C), (kr, kc), **kwargs)


def _datasets(rng: np.random.Generator) -> dict[str, np.ndarray]:
    sat8 = low_dose(rng, dtype=np.uint8, per_100=30)
    sat8.flat[rng.integers(0, sat8.size, 20)] = 255
    sat16 = probe_data(rng)
    sat16.flat[rng.integers(0, sat16.size, 20)] = 65535
    sat32 = low_dose(rng, dtype=np.uint32)
    sat32.flat[rng.integers(0, sat32.size, 5)] = 2**32 - 1
    sat64 = low_dose(rng, dtype=np.uint64)
    sat64.flat[rng.integers(0, sat64.size, 5)] = 2**64 - 1
    empty_frames = low_dose(rng, per_100=2)
    empty_frames[1] = 0
    empty_frames[3, 2:5] = 0
    return {
        "low dose 0.5/100 u16": low_dose(rng, per_100=0.5),
        "low dose 2/100 u8": low_dose(rng, per_100=2, dtype=np.uint8),
        "high dose u16": probe_data(rng, bright=400, background=40.0),
        "saturated u8": sat8,
        "saturated u16": sat16,
        "saturated u32": sat32,
        "saturated u64": sat64,
        "non-negative int16": low_dose(rng, dtype=np.int16, per_100=5),
        "non-negative int64": low_dose(rng, dtype=np.int64, per_100=5),
        "empty frames": empty_frames,
        "all zero": np.zeros((3, 4, 9, 11), dtype=np.uint16),
        "one frame 1 x 1 scan": low_dose(rng, scan=(1, 1), per_100=20),
        "one detector row": low_dose(rng, scan=(2, 3), det=(1, 17), per_100=20),
        "odd rectangular": low_dose(rng, scan=(3, 11), det=(31, 7), per_100=10),
        "wide detector (uint32 indices)": low_dose(rng, scan=(2, 2), det=(257, 256), per_100=1),
    }


# ----------------------------------------------------------------------------- round trips


def test_round_trips_are_exact(rng: np.random.Generator) -> None:
    for name, block in _datasets(rng).items():
        p = REP.from_dense(block)
        assert isinstance(p, PairedPayload)
        assert p.scan_shape == block.shape[:2] and p.frame_shape == block.shape[2:], name
        assert p.value_dtype == block.dtype and p.dtype == block.dtype, name
        assert p.indptr.dtype == np.int64 and p.indptr.shape == (p.n_frames + 1,)
        k = block.shape[2] * block.shape[3]
        assert p.indices.dtype == (np.uint16 if k <= 65536 else np.uint32), name
        vmax = int(block.max()) if block.size else 0
        assert p.counts.dtype == counts_dtype_for(vmax), (name, p.counts.dtype, vmax)
        assert p.n_events == int(np.count_nonzero(block)), name
        assert p.total_counts == int(block.sum(dtype=np.uint64)) or vmax >= 2**32, name
        assert p.occupancy == pytest.approx(np.count_nonzero(block) / block.size)
        assert p.nbytes == p.indptr.nbytes + p.indices.nbytes + p.counts.nbytes
        assert (p.counts >= 1).all()
        p.validate()
        back = REP.to_dense(p)
        assert back.dtype == block.dtype and back.shape == block.shape, name
        np.testing.assert_array_equal(back, block, err_msg=name)
        assert REP.check(block, p, full=True) == {
            "check": "full",
            "values": block.size,
            "lossless": True,
        }
        assert REP.check(block, p, full=False)["check"] == "totals"


def test_counts_dtype_is_the_smallest_that_holds_the_maximum() -> None:
    for vmax, dt in (
        (1, np.uint8),
        (255, np.uint8),
        (256, np.uint16),
        (65535, np.uint16),
        (65536, np.uint32),
        (2**32, np.uint64),
    ):
        block = np.zeros((1, 2, 3, 4), dtype=np.uint64)
        block[0, 1, 2, 3] = vmax
        block[0, 0, 0, 0] = 1
        p = REP.from_dense(block)
        assert p.counts.dtype == dt, (vmax, p.counts.dtype)
        np.testing.assert_array_equal(REP.to_dense(p), block)


def test_low_dose_is_much_smaller_than_dense(rng: np.random.Generator) -> None:
    block = low_dose(rng, scan=(8, 8), det=(64, 64), per_100=1.0)
    p = REP.from_dense(block)
    # ~1 pair per 100 pixels at 3 bytes a pair plus 8 bytes a frame vs 2 bytes a pixel
    assert p.nbytes * 20 < block.nbytes, (p.nbytes, block.nbytes)


def test_check_detects_a_wrong_payload(rng: np.random.Generator) -> None:
    block = low_dose(rng, per_100=20)
    p = REP.from_dense(block)
    wrong = block.copy()
    i = np.flatnonzero(wrong)[0]
    wrong.flat[i] += 1
    with pytest.raises(ConversionError, match="1 of"):
        REP.check(wrong, p)
    with pytest.raises(ConversionError, match="totals"):
        REP.check(wrong, p, full=False)
    with pytest.raises(ConversionError, match="value dtype"):
        REP.check(block.astype(np.uint32), p)


def test_payload_invariants_are_enforced() -> None:
    ok = dict(
        scan_shape=(1, 2),
        frame_shape=(2, 3),
        indptr=np.array([0, 1, 2], dtype=np.int64),
        indices=np.array([4, 1], dtype=np.uint16),
        counts=np.array([1, 2], dtype=np.uint8),
        value_dtype=np.dtype(np.uint16),
    )
    PairedPayload(**ok).validate()  # type: ignore[arg-type]
    for change, match in (
        ({"indptr": np.array([0, 1, 2], dtype=np.int32)}, "int64"),
        ({"indptr": np.array([0, 1], dtype=np.int64)}, "int64"),
        ({"indices": np.array([4, 1], dtype=np.uint32)}, "uint16"),
        ({"counts": np.array([1, 2], dtype=np.int8)}, "unsigned"),
        ({"value_dtype": np.dtype(np.float32)}, "integer"),
        ({"indptr": np.array([0, 1, 1], dtype=np.int64)}, "from 0 to 2"),
    ):
        with pytest.raises(ShapeError, match=match):
            PairedPayload(**{**ok, **change})  # type: ignore[arg-type]
    for change in (
        {"indices": np.array([6, 1], dtype=np.uint16)},  # out of range
        {"counts": np.array([0, 2], dtype=np.uint8)},  # a stored zero
        {
            "indptr": np.array([0, 2, 2], dtype=np.int64),
            "indices": np.array([4, 1], dtype=np.uint16),  # unsorted within the frame
        },
    ):
        with pytest.raises(ConversionError, match="frame 0"):
            PairedPayload(**{**ok, **change}).validate()  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- admission


def test_admission_refuses_real_and_negative_data(rng: np.random.Generator) -> None:
    counts = low_dose(rng, per_100=10)
    for dt in (np.float32, np.float64, np.float16):
        with pytest.raises(
            ParameterError, match=r"non-negative integer counts.*Convert explicitly"
        ):
            REP.from_dense(counts.astype(dt))
    signed = counts.astype(np.int16)
    signed[2, 3, 4, 5] = -3
    signed[0, 0, 0, 0] = -1
    with pytest.raises(ParameterError, match="2 negative values"):
        REP.from_dense(signed)
    with pytest.raises(ParameterError, match="unknown option"):
        REP.from_dense(counts, codec="lz4")
    with pytest.raises(ShapeError):
        REP.from_dense(counts[0])
    ds = qf.open(counts.astype(np.float32), chunk_rows=2)
    with pytest.raises(ParameterError, match="non-negative integer counts"):
        qf.compute(qf.sum_diffraction(ds.to_representation("paired")), client="synchronous")


# ----------------------------------------------------------------------------- threshold


def test_threshold_drops_values_below_it_and_says_so(rng: np.random.Generator) -> None:
    block = probe_data(rng, bright=6, background=1.0)
    p = REP.from_dense(block, threshold=3)
    assert p.threshold == 3
    expected = np.where(block >= 3, block, 0)
    np.testing.assert_array_equal(REP.to_dense(p), expected)
    assert not np.array_equal(REP.to_dense(p), block)  # not lossless
    rec = REP.check(block, p)
    below = (block > 0) & (block < 3)
    assert rec["threshold"] == 3 and rec["lossless"] is False
    assert rec["dropped_values"] == int(below.sum())
    assert rec["dropped_total"] == float(block[below].sum())
    assert "dropped" in rec["note"]
    assert REP.check(block, p, full=False)["lossless"] is False
    with pytest.raises(ConversionError, match="thresholded at 3"):
        wrong = block.copy()
        wrong.flat[np.flatnonzero(block < 3)[0]] = 5  # above the threshold, not in the payload
        REP.check(wrong, p)
    # negatives are dropped by a threshold (asked for), not refused
    signed = block.astype(np.int16)
    signed[0, 0, 0, 0] = -5
    q = REP.from_dense(signed, threshold=1)
    np.testing.assert_array_equal(REP.to_dense(q), np.where(signed >= 1, signed, 0))
    assert REP.check(signed, q)["dropped_values"] == 1
    # above the dtype's range: everything is dropped
    r = REP.from_dense(block.astype(np.uint8), threshold=1000)
    assert r.n_events == 0
    assert REP.check(block.astype(np.uint8), r)["dropped_values"] == int(np.count_nonzero(block))
    for bad in (0, -1, 2.5, "3", True):
        with pytest.raises(ParameterError, match="threshold"):
            REP.from_dense(block, threshold=bad)
    assert REP.from_dense(block, threshold=2.0).threshold == 2


def test_threshold_is_recorded_in_provenance(rng: np.random.Generator) -> None:
    data = probe_data(rng, bright=6, background=1.0)
    ds = qf.open(data, chunk_rows=3)
    thr = ds.to_representation("paired", threshold=2)
    assert thr.representation_options["threshold"] == 2
    (s,) = qf.compute(qf.sum_diffraction(thr), client="synchronous")
    np.testing.assert_array_equal(
        s.data, np.where(data >= 2, data, 0).sum(axis=(0, 1), dtype=np.int64)
    )
    assert s.provenance.dataset["representation_options"]["threshold"] == 2
    chunks = s.provenance.execution["chunks"]
    assert len(chunks) == 3
    for rec in chunks:
        assert rec["check"]["threshold"] == 2 and rec["check"]["lossless"] is False
    (exact,) = qf.compute(qf.sum_diffraction(ds.to_representation("paired")), client="synchronous")
    assert all(r["check"]["lossless"] is True for r in exact.provenance.execution["chunks"])


# ----------------------------------------------------------------------------- detector ops


def _dense_ops(block: np.ndarray, ops: tuple[DetectorOp, ...]) -> np.ndarray:
    for op in ops:
        block = op.apply(block)
    return np.ascontiguousarray(block)


def test_crop_and_bin_on_pairs_equal_dense(rng: np.random.Generator) -> None:
    cases: list[tuple[DetectorOp, ...]] = [
        (DetectorOp("crop", (2, 11, 3, 21)),),
        (DetectorOp("crop", (0, 13, 0, 22)),),
        (DetectorOp("crop", (12, 13, 21, 22)),),
        (DetectorOp("bin", (2, 2)),),
        (DetectorOp("bin", (4, 5)),),  # partial edge bins on both axes (13 = 3*4+1, 22 = 4*5+2)
        (DetectorOp("bin", (13, 22)),),  # one bin
        (DetectorOp("bin", (1, 3)),),
        (DetectorOp("bin", (20, 30)),),  # bigger than the frame: one partial bin
        (DetectorOp("crop", (1, 12, 2, 19)), DetectorOp("bin", (3, 4))),
        (DetectorOp("bin", (2, 3)), DetectorOp("crop", (1, 6, 2, 7)), DetectorOp("bin", (2, 2))),
    ]
    blocks = {
        "low dose": low_dose(rng, per_100=2),
        "high dose": probe_data(rng, scan=(4, 5), det=(13, 22), bright=300, background=20),
        "saturated u8": np.full((2, 3, 13, 22), 255, dtype=np.uint8),
        "u32": low_dose(rng, dtype=np.uint32, per_100=50) * np.uint32(2**26),
        "int16": low_dose(rng, dtype=np.int16, per_100=30),
    }
    for name, block in blocks.items():
        p = REP.from_dense(block)
        for ops in cases:
            got = REP.apply_detector_ops(p, ops)
            want = _dense_ops(block, ops)
            got.validate()
            assert got.frame_shape == want.shape[2:], (name, ops)
            assert got.value_dtype == want.dtype, (name, ops, got.value_dtype, want.dtype)
            np.testing.assert_array_equal(REP.to_dense(got), want, err_msg=f"{name} {ops}")
            vmax = int(want.max()) if want.size else 0
            assert got.counts.dtype == counts_dtype_for(vmax), (name, ops, got.counts.dtype)
    # saturated u8 binned 2x2 sums to 1020: the counts widen to uint16, the values to uint32
    b = REP.apply_detector_ops(REP.from_dense(blocks["saturated u8"]), (DetectorOp("bin", (2, 2)),))
    assert b.counts.dtype == np.uint16 and b.value_dtype == np.uint32
    assert int(b.counts.max()) == 1020


def test_detector_ops_never_densify(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = low_dose(rng, per_100=5)
    p = REP.from_dense(block)
    want = _dense_ops(block, (DetectorOp("crop", (1, 12, 0, 20)), DetectorOp("bin", (3, 3))))

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("densified")

    monkeypatch.setattr(Paired, "to_dense", boom)
    got = REP.apply_detector_ops(p, (DetectorOp("crop", (1, 12, 0, 20)), DetectorOp("bin", (3, 3))))
    monkeypatch.undo()
    np.testing.assert_array_equal(REP.to_dense(got), want)
    with pytest.raises(ShapeError):
        REP.apply_detector_ops(p, (DetectorOp("crop", (0, 14, 0, 5)),))
    with pytest.raises(ParameterError):
        bin_pairs(p, (0, 2))


def test_binning_dense_frames_walks_every_bin(rng: np.random.Generator) -> None:
    """Nearly full frames take the in-order walk instead of sorting the touched bins."""
    block = rng.integers(1, 9, size=(3, 2, 40, 33), dtype=np.uint8)
    block[0, 0, :20] = 0
    for f in ((1, 1), (2, 2), (3, 7), (40, 1)):
        got = REP.to_dense(bin_pairs(REP.from_dense(block), f))
        np.testing.assert_array_equal(got, _dense_ops(block, (DetectorOp("bin", f),)))


# ----------------------------------------------------------------------------- kernel


def test_kernel_matches_dense_kernel_on_low_dose_frames(rng: np.random.Generator) -> None:
    block = low_dose(rng, scan=(9, 13), det=(24, 30), per_100=1.5, dtype=np.uint8)
    p = REP.from_dense(block)
    frames = block.reshape(p.n_frames, -1)
    rt = CpuRuntime()
    K = frames.shape[1]
    weights = np.concatenate(
        [(rng.random((3, K)) < 0.3).astype(float), rng.standard_normal((2, K))]
    )
    for want_sum, want_max in ((True, True), (False, False), (True, False)):
        ref = rt.frame_pass(frames, weights, want_sum=want_sum, want_max=want_max)
        chunk = chunk_of("paired", p)
        got = rt.run_frame_pass(chunk, weights, want_sum=want_sum, want_max=want_max)
        np.testing.assert_array_equal(got.per_frame[:, :3], ref.per_frame[:, :3])  # exact
        np.testing.assert_allclose(got.per_frame, ref.per_frame, rtol=1e-12, atol=1e-12)
        for a, b in ((got.pattern_sum, ref.pattern_sum), (got.pattern_max, ref.pattern_max)):
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(a, b)


def test_kernel_blocks_of_weight_rows(rng: np.random.Generator) -> None:
    """Every block width (1..8) and more rows than one block (8 + 8 + 3)."""
    block = low_dose(rng, scan=(3, 7), det=(9, 11), per_100=20, dtype=np.uint16)
    p = REP.from_dense(block)
    frames = block.reshape(p.n_frames, -1)
    rt = CpuRuntime()
    for m in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 19):
        w = (rng.random((m, frames.shape[1])) < 0.5).astype(float)
        got = rt.run_frame_pass(chunk_of("paired", p), w, want_sum=False, want_max=False)
        ref = rt.frame_pass(frames, w, want_sum=False, want_max=False)
        assert got.per_frame.shape == (p.n_frames, m)
        np.testing.assert_array_equal(got.per_frame, ref.per_frame, err_msg=f"m={m}")


def test_kernel_non_finite_weights_behave_like_dense(rng: np.random.Generator) -> None:
    block = low_dose(rng, per_100=20)
    p = REP.from_dense(block)
    frames = block.reshape(p.n_frames, -1)
    K = frames.shape[1]
    w = np.ones((3, K))
    hit = int(np.flatnonzero(frames[0])[0])
    w[0, hit] = np.inf  # frame 0 hits it: inf; frames missing it: 0 * inf = nan
    w[1, 5] = np.nan
    ref = CpuRuntime().frame_pass(frames, w, want_sum=False, want_max=False)
    got = CpuRuntime().run_frame_pass(chunk_of("paired", p), w, want_sum=False, want_max=False)
    np.testing.assert_array_equal(got.per_frame, ref.per_frame)  # NaN == NaN positions too


def test_kernel_rejects_wrong_weights(rng: np.random.Generator) -> None:
    p = REP.from_dense(low_dose(rng))
    rt = CpuRuntime()
    with pytest.raises(ShapeError, match="weights"):
        rt.run_frame_pass(chunk_of("paired", p), np.ones((2, 5)), want_sum=False, want_max=False)
    not_pairs = Chunk("paired", "host", ((0, 1), (0, 3)), np.ones(3, np.uint16), PAIRED_SCHEMA)
    with pytest.raises(ParameterError, match="PairedPayload"):
        rt.run_frame_pass(not_pairs, np.ones((2, 5)), want_sum=False, want_max=False)
    real = Chunk("paired", "host", ((0, 1), (0, 3)), np.ones(3), PAIRED_SCHEMA)
    with pytest.raises(UnsupportedOperationError, match=r"'paired' float64 payloads.*uint16"):
        rt.run_frame_pass(real, np.ones((2, 5)), want_sum=False, want_max=False)


# ----------------------------------------------------------------------------- operator parity

CENTER = (5.6, 10.2)
RADIUS = 3.5


def test_parity_in_memory_several_chunks(rng: np.random.Generator) -> None:
    for data in (
        low_dose(rng, scan=(7, 9), det=(13, 22), per_100=1.0),
        probe_data(rng, scan=(7, 9), det=(13, 22), center=CENTER, radius=RADIUS),
    ):
        ds = qf.open(data, chunk_rows=2)
        assert len(ds.chunks) == 4
        paired = ds.to_representation("paired")
        results = assert_operator_parity(ds, paired, center=CENTER, radius=RADIUS)
        ex = results[0].provenance.execution
        assert ex["storage_schema"] == PAIRED_SCHEMA
        assert ex["payloads_made_by"] == ["converted from dense"]
        assert ex["conversion_checks"] == ["full"]


def test_parity_npy_with_crops_and_binning(tmp_path: Path, rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(8, 9), det=(21, 26), center=(9.3, 12.1), radius=4.0)
    path = write_npy(tmp_path / "data.npy", data)
    ds = qf.open(path, chunk_rows=3)
    assert len(ds.chunks) == 3
    views = [
        ds,
        ds.crop_scan((1, 7, 2, 9)),
        ds.crop_detector((2, 19, 1, 24)),
        ds.bin_detector(2),
        ds.bin_detector((4, 3)),  # partial edge bins: 21 = 5*4+1, 26 = 8*3+2
        ds.crop_scan((0, 5, 0, 9)).crop_detector((1, 20, 3, 25)).bin_detector(3),
    ]
    for view in views:
        kr, kc = view.detector_shape
        center = (kr * 0.44, kc * 0.47)
        radius = max(min(kr, kc) / 5, 1.2)
        assert_operator_parity(
            view, view.to_representation("paired", verify="totals"), center=center, radius=radius
        )


# ----------------------------------------------------------------------------- counted reader


def test_counted_file_opens_paired_and_matches_dense(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    dense = low_dose(rng, scan=(6, 8), det=(14, 20), per_100=2.0, dtype=np.uint32)
    dense[2, 3] = 0  # an empty frame
    dense[4, 5, 7, 9] = 7  # a pixel hit 7 times
    path = stempy_file(tmp_path / "scan.h5", dense, rng, version=3)
    ds = qf.open(path, chunk_rows=2)
    assert ds.source.format == "counted" and isinstance(ds.source, CountedSource)
    assert ds.representation == "paired" and ds.storage_schema == PAIRED_SCHEMA
    assert ds.shape == dense.shape and ds.dtype == np.uint32
    md = ds.source.metadata
    assert md["entries_in_scan_order"] and md["missing_positions"] == 0
    assert md["frames_attributes"] == {"Nx": 20, "Ny": 14}
    payload, made = ds.load_payload((0, 2))
    assert made["made"] == "native counted read" and "check" not in made
    np.testing.assert_array_equal(REP.to_dense(payload), dense[:2])
    assert payload.counts.dtype == np.uint8 and payload.value_dtype == np.uint32
    # dense only when asked, and then exactly
    dense_ds = ds.to_representation("dense")
    np.testing.assert_array_equal(dense_ds.load_block((0, 6)), dense)
    np.testing.assert_array_equal(ds.load_block((1, 3), (2, 7)), dense[1:3, 2:7])
    np.testing.assert_array_equal(ds.frame(4, 5), dense[4, 5])
    center = (6.1, 9.4)
    results = assert_operator_parity(qf.open(dense, chunk_rows=2), ds, center=center, radius=3.0)
    ex = results[0].provenance.execution
    assert ex["payloads_made_by"] == ["native counted read"]
    assert ex["payload_bytes"] < ex["dense_bytes"] / 10
    assert results[0].provenance.source["format"] == "counted"
    # views of the counted file: crops and binning run on the pairs
    for view, dview in (
        (ds.crop_scan((1, 5, 2, 8)), qf.open(dense, chunk_rows=2).crop_scan((1, 5, 2, 8))),
        (ds.bin_detector((3, 4)), qf.open(dense, chunk_rows=2).bin_detector((3, 4))),
        (
            ds.crop_detector((1, 13, 2, 19)).bin_detector(2),
            qf.open(dense, chunk_rows=2).crop_detector((1, 13, 2, 19)).bin_detector(2),
        ),
    ):
        kr, kc = view.detector_shape
        assert_operator_parity(dview, view, center=(kr * 0.45, kc * 0.5), radius=kr / 4)


def test_counted_scan_positions_permuted_missing_repeated(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    R, C, kr, kc = 5, 6, 12, 10
    dense = low_dose(rng, scan=(R, C), det=(kr, kc), per_100=10.0, dtype=np.uint32)
    frames = dense.reshape(R * C, kr, kc)
    events = [events_of(f, rng) for f in frames]

    # permuted: entries in random order, each placed by its position
    perm = rng.permutation(R * C)
    p1 = write_stempy(tmp_path / "perm.h5", [events[i] for i in perm], (R, C), (kr, kc), perm)
    ds = qf.open(p1, chunk_rows=2)
    assert any("not in scan order" in n for n in ds.notes)
    assert not ds.source.metadata["entries_in_scan_order"]
    np.testing.assert_array_equal(REP.to_dense(ds.load_payload((0, R))[0]), dense)
    np.testing.assert_array_equal(ds.to_representation("dense").load_block((0, R)), dense)
    assert_operator_parity(qf.open(dense, chunk_rows=2), ds, center=(6.0, 5.0), radius=3.0)

    # missing: 4 positions never recorded -> empty frames, noted with the count
    keep = np.sort(rng.choice(R * C, R * C - 4, replace=False))
    p2 = write_stempy(tmp_path / "missing.h5", [events[i] for i in keep], (R, C), (kr, kc), keep)
    ds2 = qf.open(p2, chunk_rows=2)
    expect = np.zeros_like(frames)
    expect[keep] = frames[keep]
    expect = expect.reshape(dense.shape)
    assert any("4 of 30 scan positions have no frame entry" in n for n in ds2.notes)
    assert ds2.source.metadata["missing_positions"] == 4
    np.testing.assert_array_equal(REP.to_dense(ds2.load_payload((0, R))[0]), expect)
    (s,) = qf.compute(qf.sum_diffraction(ds2), client="synchronous")
    np.testing.assert_array_equal(s.data, expect.sum(axis=(0, 1), dtype=np.int64))
    assert any("no frame entry" in n for n in s.provenance.notes)

    # repeated: 3 positions recorded twice (in shuffled order) -> events summed, noted
    extra_pos = rng.choice(R * C, 3, replace=False)
    extra = [events_of(frames[rng.integers(R * C)], rng) for _ in extra_pos]
    pos = np.concatenate([np.arange(R * C), extra_pos])
    order = rng.permutation(pos.size)
    all_events = events + extra
    p3 = write_stempy(
        tmp_path / "repeated.h5", [all_events[i] for i in order], (R, C), (kr, kc), pos[order]
    )
    ds3 = qf.open(p3, chunk_rows=3)
    expect3 = frames.astype(np.uint32).copy()
    for p, ev in zip(extra_pos, extra, strict=True):
        expect3[p] += np.bincount(ev, minlength=kr * kc).reshape(kr, kc).astype(np.uint32)
    expect3 = expect3.reshape(dense.shape)
    assert any("3 scan positions have several frame entries (3 extra)" in n for n in ds3.notes)
    np.testing.assert_array_equal(REP.to_dense(ds3.load_payload((0, R))[0]), expect3)
    np.testing.assert_array_equal(ds3.to_representation("dense").load_block((0, R)), expect3)
    assert_operator_parity(qf.open(expect3, chunk_rows=3), ds3, center=(6.0, 5.0), radius=3.0)


def test_counted_attribute_variants_and_multi_frame_layout(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    R, C, kr, kc = 3, 4, 9, 15  # rectangular: a swapped Nx/Ny would change the shape
    dense = low_dose(rng, scan=(R, C), det=(kr, kc), per_100=10.0, dtype=np.uint32)
    events = [events_of(f, rng) for f in dense.reshape(R * C, kr, kc)]
    p = write_stempy(tmp_path / "dims.h5", events, (R, C), (kr, kc), attrs="dimensions")
    ds = qf.open(p)
    assert ds.shape == (R, C, kr, kc)
    np.testing.assert_array_equal(ds.to_representation("dense").load_block((0, R)), dense)

    # no attributes: the shapes must be given, and are recorded
    p0 = write_stempy(tmp_path / "bare.h5", events, (R, C), (kr, kc), attrs="none")
    with pytest.raises(ScanShapeError, match="scan_shape"):
        qf.open(p0, frame_shape=(kr, kc))
    with pytest.raises(ShapeError, match="frame_shape"):
        qf.open(p0, scan_shape=(R, C))
    ds0 = qf.open(p0, scan_shape=(R, C), frame_shape=(kr, kc))
    assert any("shape" in n and "given" in n for n in ds0.notes)
    np.testing.assert_array_equal(REP.to_dense(ds0.load_payload((0, R))[0]), dense)
    with pytest.raises(ScanShapeError, match="records a scan shape"):
        qf.open(p, scan_shape=(C, R))

    # stempy's multi-frame layout: 2 frames per position, summed
    halves = []
    for ev in events:
        cut = len(ev) // 2
        halves.extend([ev[:cut], ev[cut:]])
    p2 = write_stempy(tmp_path / "multi.h5", halves, (R, C), (kr, kc), np.arange(R * C), version=3)
    ds2 = qf.open(p2)
    assert any("2 frames recorded at each position are summed" in n for n in ds2.notes)
    np.testing.assert_array_equal(REP.to_dense(ds2.load_payload((0, R))[0]), dense)
    np.testing.assert_array_equal(ds2.to_representation("dense").load_block((0, R)), dense)

    # inconsistent layouts are refused, clearly
    p3 = write_stempy(tmp_path / "bad.h5", events[:5], (R, C), (kr, kc), np.arange(7))
    with pytest.raises(FormatError, match="5 entries"):
        qf.open(p3)
    p4 = write_stempy(tmp_path / "outside.h5", events, (R, C), (kr, kc), np.arange(R * C) + 3)
    with pytest.raises(FormatError, match="outside"):
        qf.open(p4)
    with pytest.raises(FormatError, match=r"electron_events/frames.*format='hdf5'"):
        CountedSource(write_hdf5(tmp_path / "dense.h5", dense))  # dense frames, not events
    with pytest.raises(FormatError, match="not a readable HDF5 file"):
        CountedSource(write_npy(tmp_path / "x.npy", dense))


def test_counted_dtype_and_threshold_options(tmp_path: Path, rng: np.random.Generator) -> None:
    dense = low_dose(rng, scan=(3, 4), det=(8, 9), per_100=30.0, dtype=np.uint32)
    dense[1, 2, 3, 4] = 300
    path = stempy_file(tmp_path / "c.h5", dense, rng)
    small = qf.open(path, dtype="uint8")
    assert small.dtype == np.uint8
    with pytest.raises(ParameterError, match=r"300 counts.*dtype='uint32'"):
        small.load_payload((0, 3))
    with pytest.raises(Exception, match="unsigned"):
        qf.open(path, dtype="float32")
    u16 = qf.open(path, dtype="uint16")
    (m,) = qf.compute(qf.max_diffraction(u16), client="synchronous")
    assert m.data.dtype == np.uint16
    np.testing.assert_array_equal(m.data, dense.max(axis=(0, 1)))
    # a threshold on the native read: recorded, not lossless
    thr = qf.open(path).to_representation("paired", threshold=2)
    payload, _ = thr.load_payload((0, 3))
    assert payload.threshold == 2
    np.testing.assert_array_equal(REP.to_dense(payload), np.where(dense >= 2, dense, 0))
    (s,) = qf.compute(qf.sum_diffraction(thr), client="synchronous")
    assert s.provenance.dataset["representation_options"]["threshold"] == 2
    with pytest.raises(ParameterError, match="unknown option"):
        qf.open(path).to_representation("paired", codec="x").load_payload((0, 1))


def test_persisted_counted_dataset_computes_the_same(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    dense = low_dose(rng, scan=(6, 7), det=(16, 18), per_100=3.0, dtype=np.uint32)
    path = stempy_file(tmp_path / "p.h5", dense, rng)
    ds = qf.open(path, chunk_rows=2)
    center = (7.2, 9.9)

    def queries(d: Any) -> list[Any]:
        return [
            qf.virtual_bf(d, radius=4.0, center=center),
            qf.virtual_adf(d, inner=5.0, center=center),
            qf.center_of_mass(d, center=center),
            qf.sum_diffraction(d),
            qf.max_diffraction(d),
        ]

    lazy = qf.compute(*queries(ds), client="synchronous")
    p = ds.persist(client="synchronous")
    assert p.is_persisted and p.resident.representation == "paired"
    held = sum(chunk.nbytes for chunk in p.resident.refs)  # in-process: the Chunk objects
    assert all(chunk.representation == "paired" for chunk in p.resident.refs)
    assert held < ds.nbytes / 10
    again = qf.compute(*queries(p), client="synchronous")
    reference = qf.compute(*queries(qf.open(dense, chunk_rows=2)), client="synchronous")
    for a, b, ref in zip(lazy, again, reference, strict=True):
        assert a.data.dtype == b.data.dtype == ref.data.dtype
        np.testing.assert_array_equal(a.data, b.data)
        np.testing.assert_allclose(b.data, ref.data, rtol=1e-12, atol=1e-12)
    ex = again[0].provenance.execution
    assert ex["bytes_read"] == 0 and ex["representation"] == "paired"
    p.release()


def test_corrupt_counted_file_raises_corrupt_chunk_error(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    # pixel indices outside the detector
    events = [np.array([1, 2, 3], np.uint32)] * 6
    events[4] = np.array([5, 9999], np.uint32)
    path = write_stempy(tmp_path / "outside.h5", events, (2, 3), (10, 10))
    ds = qf.open(path)
    with pytest.raises(CorruptChunkError, match=r"outside the 10 x 10 detector.*\[4\]") as info:
        ds.load_payload((0, 2))
    assert str(path) in str(info.value)
    with pytest.raises(CorruptChunkError):
        ds.to_representation("dense").load_block((0, 2))
    # damaged bytes in the file's heap of event arrays
    good = stempy_file(tmp_path / "damaged.h5", low_dose(rng, per_100=20, dtype=np.uint32), rng)
    raw = bytearray(good.read_bytes())
    at = raw.find(b"GCOL")  # signature of an HDF5 global heap collection (the vlen data)
    assert at > 0
    raw[at : at + 4] = b"XXXX"
    good.write_bytes(bytes(raw))
    damaged = qf.open(good, chunk_rows=2)
    with pytest.raises(CorruptChunkError, match=r"frame entries \[0, 14\).*damaged\.h5"):
        damaged.load_payload((0, 2))
    with pytest.raises(CorruptChunkError):
        qf.compute(qf.sum_diffraction(damaged), client="synchronous")


def test_counted_source_pickles_without_handles(tmp_path: Path, rng: np.random.Generator) -> None:
    import pickle

    dense = low_dose(rng, scan=(3, 4), det=(8, 9), per_100=30.0, dtype=np.uint32)
    order = rng.permutation(12)
    events = [events_of(f, rng) for f in dense.reshape(12, 8, 9)]
    path = write_stempy(tmp_path / "c.h5", [events[i] for i in order], (3, 4), (8, 9), order)
    src = CountedSource(path)
    before = src.read_payload("paired", (0, 3), (0, 4))
    clone = pickle.loads(pickle.dumps(src))
    assert clone._handle_frames is None and clone._handle_index is None
    after = clone.read_payload("paired", (1, 3), (1, 3))
    np.testing.assert_array_equal(REP.to_dense(after), dense[1:3, 1:3])
    np.testing.assert_array_equal(REP.to_dense(before), dense)
    assert src.identity == clone.identity
    src.close()


# ----------------------------------------------------------------------------- writer


def test_write_counted_round_trips(tmp_path: Path, rng: np.random.Generator) -> None:
    dense = low_dose(rng, scan=(5, 7), det=(11, 13), per_100=5.0)
    dense[2, 2, 3, 3] = 9
    ds = qf.open(dense, chunk_rows=2)
    out = write_counted(ds, tmp_path / "from_dense.h5")
    back = qf.open(out)
    assert back.source.format == "counted" and back.shape == dense.shape
    np.testing.assert_array_equal(back.to_representation("dense").load_block((0, 5)), dense)

    import h5py

    with h5py.File(out) as f:
        frames = f["electron_events/frames"]
        assert frames.attrs["Nx"] == 13 and frames.attrs["Ny"] == 11
        sp = f["electron_events/scan_positions"]
        assert sp.attrs["Nx"] == 7 and sp.attrs["Ny"] == 5
        np.testing.assert_array_equal(sp[()], np.arange(35))
        assert int(f.attrs["version"]) == 3
        assert len(frames[2 * 7 + 2]) == int(dense[2, 2].sum())  # one event per count

    # a paired (counted) dataset with binning, written as it is held
    binned = back.bin_detector(2).crop_scan((1, 4, 0, 7))
    out2 = write_counted(binned, tmp_path / "binned.h5")
    np.testing.assert_array_equal(
        qf.open(out2).to_representation("dense").load_block((0, 3)),
        qf.open(dense).bin_detector(2).crop_scan((1, 4, 0, 7)).load_block((0, 3)),
    )
    same = np.ones((2, 3, 4, 5), dtype=np.uint8)  # equal-length frames (an h5py pitfall)
    out3 = write_counted(qf.open(same), tmp_path / "same.h5")
    np.testing.assert_array_equal(qf.open(out3).to_representation("dense").load_block((0, 2)), same)
    with pytest.raises(ParameterError, match="overwrite=True"):
        write_counted(ds, out)
    assert write_counted(ds, out, overwrite=True) == out
    with pytest.raises(ParameterError, match="non-negative integer counts"):
        write_counted(qf.open(dense.astype(np.float32)), tmp_path / "real.h5")
    assert not (tmp_path / "real.h5").exists() and not (tmp_path / "real.h5.partial").exists()


def test_write_counted_in_small_batches(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import quantem_flow.io.counted as counted

    monkeypatch.setattr(counted, "WRITE_BATCH_EVENTS", 7)  # many batches, some of one frame
    dense = probe_data(rng, scan=(3, 5), det=(6, 7), bright=5, background=0.5)
    dense[1, 1] = 0
    out = write_counted(qf.open(dense, chunk_rows=2), tmp_path / "batches.h5")
    np.testing.assert_array_equal(qf.open(out).to_representation("dense").load_block((0, 3)), dense)


def test_threshold_acts_on_values_as_loaded_in_both_paths(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """A threshold on a binned counted file equals thresholding the binned dense data."""
    dense = low_dose(rng, scan=(4, 5), det=(12, 14), per_100=15.0, dtype=np.uint32)
    path = stempy_file(tmp_path / "t.h5", dense, rng)
    native = qf.open(path, chunk_rows=2).bin_detector(2).to_representation("paired", threshold=3)
    converted = (
        qf.open(dense, chunk_rows=2).bin_detector(2).to_representation("paired", threshold=3)
    )
    a, made_a = native.load_payload((0, 2))
    b, made_b = converted.load_payload((0, 2))
    assert made_a["made"] == "native counted read" and made_b["made"] == "converted from dense"
    assert a.threshold == b.threshold == 3 and a.pending_threshold is None
    binned = qf.open(dense).bin_detector(2).load_block((0, 2))
    np.testing.assert_array_equal(REP.to_dense(a), np.where(binned >= 3, binned, 0))
    np.testing.assert_array_equal(REP.to_dense(a), REP.to_dense(b))
    # a payload whose threshold is still pending is refused, not silently used unthresholded
    raw = native.source.read_payload("paired", (0, 2), (0, 5), threshold=3)
    assert raw.pending_threshold == 3 and raw.threshold is None
    with pytest.raises(ParameterError, match="not applied yet"):
        REP.to_dense(raw)
    with pytest.raises(ParameterError, match="not applied yet"):
        CpuRuntime().run_frame_pass(
            chunk_of("paired", raw), np.ones((1, 168)), want_sum=True, want_max=False
        )
    applied = REP.apply_detector_ops(raw, ())
    np.testing.assert_array_equal(REP.to_dense(applied), np.where(dense[:2] >= 3, dense[:2], 0))
    assert threshold_pairs(applied, 5).threshold == 5


def test_pairs_from_events_sums_repeats_and_thresholds() -> None:
    ev_ptr = np.array([0, 5, 5, 8], dtype=np.int64)
    events = np.array([7, 2, 7, 7, 0, 3, 3, 1], dtype=np.uint32)
    p = pairs_from_events(ev_ptr, events, (1, 3), (2, 4), np.uint16)
    assert p.indptr.tolist() == [0, 3, 3, 5]
    assert p.indices.tolist() == [0, 2, 7, 1, 3]
    assert p.counts.tolist() == [1, 1, 3, 1, 2]
    t = pairs_from_events(ev_ptr, events, (1, 3), (2, 4), np.uint16, threshold=2)
    assert t.indices.tolist() == [7, 3] and t.counts.tolist() == [3, 2] and t.threshold == 2
    pairs_from_events(ev_ptr, events, (1, 3), (2, 4), np.uint8).validate()
    big = np.repeat(np.uint32(1), 300)
    with pytest.raises(ParameterError, match="300 counts"):
        pairs_from_events(np.array([0, 300]), big, (1, 1), (1, 2), np.uint8)


def test_very_sparse_frames_on_a_large_detector(rng: np.random.Generator) -> None:
    """Frames with a handful of events on 512 x 600 pixels take the sorting path."""
    kr, kc = 512, 600
    n = 6
    events = [rng.integers(0, kr * kc, size=int(m)) for m in (0, 1, 3, 9, 40, 5000)]
    events[3] = np.concatenate([events[3], events[3][:4], events[3][:1]])  # repeats: 2 and 3
    ev_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(e) for e in events], out=ev_ptr[1:])
    flat = np.concatenate(events).astype(np.uint32)
    dense = np.zeros((n, kr * kc), dtype=np.uint32)
    for i, e in enumerate(events):
        np.add.at(dense[i], e, 1)
    dense = dense.reshape(1, n, kr, kc)
    for t in (None, 2):
        p = pairs_from_events(ev_ptr, flat, (1, n), (kr, kc), np.uint32, threshold=t)
        p.validate()
        want = dense if t is None else np.where(dense >= t, dense, 0)
        np.testing.assert_array_equal(REP.to_dense(p), want)
    p = pairs_from_events(ev_ptr, flat, (1, n), (kr, kc), np.uint32)
    for f in ((1, 1), (2, 3), (7, 5)):
        got = bin_pairs(p, f)
        got.validate()
        np.testing.assert_array_equal(REP.to_dense(got), _dense_ops(dense, (DetectorOp("bin", f),)))


def test_registry_and_representation_describe() -> None:
    rep = get_representation("paired")
    assert isinstance(rep, Paired)
    assert rep.schema == "paired-csr-v1" and rep.native_detector_ops


def test_threshold_is_a_recorded_lossy_transform() -> None:
    rng = np.random.default_rng()
    data = rng.poisson(0.3, (4, 5, 9, 11)).astype(np.uint16)
    data[0, 0, 0, 0] = 7
    ds = qf.open(data).to_representation("paired", threshold=2)
    assert ds.flags["native"] is False and ds.flags["thresholded"] is True
    assert ds.transforms[-1] == {
        "transform": "threshold",
        "threshold": 2,
        "representation": "paired",
        "lossless": False,
        "rule": "values below the threshold set to 0",
    }
    expected = np.where(data >= 2, data, 0)
    np.testing.assert_array_equal(ds.load_block((0, 4)), expected)  # dense view agrees
    (total,) = qf.compute(qf.sum_diffraction(ds), client="synchronous")
    np.testing.assert_array_equal(total.data, expected.sum(axis=(0, 1)))
    assert total.provenance.native is False


def test_each_representation_gathers_its_own_way() -> None:
    """host_gather asks the representation: dense indexes, paired scatters, others decode."""
    from quantem_flow.representations import get_representation
    from quantem_flow.runtimes.base import host_gather

    rng = np.random.default_rng(7)
    block = rng.poisson(0.3, size=(3, 4, 6, 5)).astype(np.uint16)
    idx = np.array([0, 1, 2, 7, 11, 29], dtype=np.int64)
    expect = block.reshape(12, 30)[:, idx]
    for name in ("dense", "paired", "packed", "encoded"):
        rep = get_representation(name)
        payload = block if name == "dense" else rep.from_dense(block)
        got = host_gather(name, payload, idx)
        assert got.shape == expect.shape and np.array_equal(got, expect), name
    paired = get_representation("paired")
    assert type(paired).gather is not type(get_representation("encoded")).gather
