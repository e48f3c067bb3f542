"""The packed representation: layout, exact round trips, admission, size, kernels, engine parity."""

from __future__ import annotations

import pickle
import time
import tracemalloc
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import ParameterError, ShapeError
from quantem_flow.representations import Chunk, Payload, chunk_of, get_representation
from quantem_flow.representations.packed import (
    DEFAULT_BLOCK_VALUES,
    PACKED_SCHEMA,
    Packed,
    PackedPayload,
)
from quantem_flow.runtimes import get_runtime
from quantem_flow.runtimes.cpu import warmup
from quantem_flow.runtimes.cpu.kernels import frame_pass_numba
from quantem_flow.runtimes.cpu.packed_kernels import frame_pass_packed, group_frames
from tests.conftest import probe_data
from tests.representation_parity import assert_operator_parity

REP = Packed()


# ----------------------------------------------------------------------------- data


def low_dose(rng: np.random.Generator, shape: tuple[int, ...], p: float = 0.01) -> np.ndarray:
    """Electron-counted frames: a fraction ``p`` of pixels holds 1-3 counts."""
    x = np.zeros(shape, dtype=np.uint16)
    hit = rng.random(shape) < p
    x[hit] = rng.integers(1, 4, int(hit.sum()))
    return x


def high_dose(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A bright disk of ~2000 counts on a 20-count background."""
    rr, cc = np.indices(shape[2:])
    disk = (rr - shape[2] / 2.3) ** 2 + (cc - shape[3] / 1.9) ** 2 < (min(shape[2:]) / 3) ** 2
    return rng.poisson(20 + 2000 * disk, size=shape).astype(np.uint16)


def saturated(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """High dose with saturated (65535) pixels, some frames entirely saturated."""
    x = high_dose(rng, shape)
    x[rng.random(shape) < 0.02] = 65535
    x[0, 0] = 65535
    return x


def with_empty_frames(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Low-dose frames, every third frame (and the first and last) empty."""
    x = low_dose(rng, shape, 0.05).reshape(-1, *shape[2:])
    x[::3] = 0
    x[-1] = 0
    return x.reshape(shape)


KINDS = {
    "low_dose": low_dose,
    "high_dose": high_dose,
    "saturated": saturated,
    "empty_frames": with_empty_frames,
}
#: odd, rectangular, frames smaller than one block, frames of one partial block
SHAPES = ((3, 5, 13, 22), (2, 3, 64, 64), (1, 7, 5, 3), (4, 1, 31, 33))


def reference_pack(frames: np.ndarray, bv: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The layout of the module docstring, written independently in NumPy (bit by bit)."""
    n, k = frames.shape
    nb = -(-k // bv)
    widths, offsets, words = [], [], []
    o = 0
    for f in range(n):
        for j in range(nb):
            vals = frames[f, j * bv : (j + 1) * bv].astype(np.uint64)
            w = int(vals.max()).bit_length() if vals.size else 0
            widths.append(w)
            offsets.append(o)
            if w == 0:
                continue
            bits = ((vals[:, None] >> np.arange(w, dtype=np.uint64)) & 1).astype(np.uint8).ravel()
            n_words = -(-bits.size // 32)
            bits = np.concatenate([bits, np.zeros(32 * n_words - bits.size, np.uint8)])
            words.append(np.packbits(bits, bitorder="little").view("<u4"))
            o += n_words
    data = np.concatenate([*words, np.zeros(1, "<u4")])
    return np.array(widths, np.uint8), np.array(offsets, np.int64), data


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("bv", (32, 96, DEFAULT_BLOCK_VALUES, 4096))
def test_round_trip_is_exact_and_follows_the_documented_layout(
    kind: str, shape: tuple[int, int, int, int], bv: int, rng: np.random.Generator
) -> None:
    dense = KINDS[kind](rng, shape)
    payload = REP.from_dense(dense, block_values=bv)
    assert isinstance(payload, PackedPayload)
    assert payload.scan_shape == shape[:2] and payload.frame_shape == shape[2:]
    assert payload.dtype == dense.dtype and payload.block_values == bv
    back = REP.to_dense(payload)
    assert back.dtype == dense.dtype and back.shape == dense.shape
    np.testing.assert_array_equal(back, dense)
    assert REP.check(dense, payload, full=True) == {"check": "full", "values": dense.size}
    widths, offsets, data = reference_pack(dense.reshape(shape[0] * shape[1], -1), bv)
    np.testing.assert_array_equal(payload.widths, widths)
    np.testing.assert_array_equal(payload.offsets, offsets)
    assert payload.data.dtype == np.dtype("<u4")
    np.testing.assert_array_equal(payload.data, data)
    assert payload.nbytes == data.nbytes + widths.nbytes + offsets.nbytes


@pytest.mark.parametrize(
    "dtype", ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")
)
def test_every_integer_dtype_whose_values_fit_round_trips(
    dtype: str, rng: np.random.Generator
) -> None:
    top = min(int(np.iinfo(dtype).max), 65535)
    dense = rng.integers(0, top, size=(3, 4, 9, 14), endpoint=True).astype(dtype)
    dense[0, 0] = 0
    dense[1, 1, 0, 0] = top
    payload = REP.from_dense(dense)
    back = REP.to_dense(payload)
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, dense)


def test_byte_order_and_strides_do_not_matter(rng: np.random.Generator) -> None:
    dense = high_dose(rng, (4, 6, 12, 20))
    big = dense.astype(">u2")
    payload = REP.from_dense(big)
    assert payload.dtype == np.dtype("=u2")  # values kept; native byte order recorded
    np.testing.assert_array_equal(REP.to_dense(payload), dense)
    view = dense[::2, 1::2, 1:, ::3]  # not contiguous
    np.testing.assert_array_equal(REP.to_dense(REP.from_dense(view)), view)


def test_empty_blocks() -> None:
    for shape in ((0, 3, 4, 5), (2, 0, 4, 5)):
        payload = REP.from_dense(np.zeros(shape, np.uint16))
        assert payload.widths.size == 0 and payload.data.size == 1
        assert REP.to_dense(payload).shape == shape


def test_payload_pickles_and_sizes_its_chunk(rng: np.random.Generator) -> None:
    dense = low_dose(rng, (3, 4, 16, 24))
    payload = REP.from_dense(dense)
    assert isinstance(payload, Payload)  # the protocol every non-dense payload provides
    again = pickle.loads(pickle.dumps(payload))
    np.testing.assert_array_equal(REP.to_dense(again), dense)
    chunk = Chunk("packed", "host", ((0, 3), (0, 4)), payload, PACKED_SCHEMA)
    assert chunk.nbytes == payload.nbytes < dense.nbytes
    assert get_representation("packed").schema == PACKED_SCHEMA == "packed-blockwidth-v1"


# ----------------------------------------------------------------------------- widths


def test_block_width_is_the_bit_length_of_the_block_maximum() -> None:
    bv = 32
    maxima = [0, 1, 2, 3, 4, 255, 256, 4095, 32768, 65535, 7]
    frame = np.zeros(bv * (len(maxima) - 1) + 5, np.uint16)  # last block partial (5 values)
    for j, m in enumerate(maxima):
        frame[j * bv + (j % bv) % (5 if j == len(maxima) - 1 else bv)] = m
    payload = REP.from_dense(frame.reshape(1, 1, 1, -1), block_values=bv)
    assert payload.widths.tolist() == [int(m).bit_length() for m in maxima]
    assert payload.widths.tolist()[:3] == [0, 1, 2]  # zeros cost no bits; max 1 -> 1 bit
    assert payload.widths[9] == 16  # 65535
    # a zero block stores nothing; a full block of width w is exactly bv * w / 32 words
    sizes = np.diff(np.append(payload.offsets, payload.data.size - 1))
    assert sizes.tolist() == [
        -(-min(bv, frame.size - j * bv) * int(m).bit_length() // 32) for j, m in enumerate(maxima)
    ]
    np.testing.assert_array_equal(REP.to_dense(payload).ravel(), frame)


def test_blocks_never_straddle_frames() -> None:
    frames = np.zeros((2, 1, 5, 9), np.uint16)  # 45 values: one block of 32 and one of 13
    frames[0, 0, -1, -1] = 3  # end of frame 0, in its partial block
    frames[1, 0, 0, 0] = 1000  # start of frame 1
    payload = REP.from_dense(frames, block_values=32)
    assert payload.blocks_per_frame == 2
    assert payload.widths.tolist() == [0, 2, 10, 0]
    np.testing.assert_array_equal(REP.to_dense(payload), frames)


# ----------------------------------------------------------------------------- admission


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (np.array([0, 5, -3], np.int16), r"int16 data hold negative values \(minimum -3\)"),
        (np.array([0, 1, 65536], np.uint32), r"uint32 data hold values up to 65536"),
        (np.array([0, 2**63], np.uint64), r"values up to 9223372036854775808"),
        (np.array([0.0, 1.0], np.float32), r"the data are float32"),
        (np.array([0.0, 1.0], np.float64), r"the data are float64"),
        (np.array([True, False]), r"the data are bool"),
    ],
    ids=("negative", "65536", "huge-u64", "float32", "float64", "bool"),
)
def test_admission_refuses_what_does_not_fit(data: np.ndarray, match: str) -> None:
    block = np.zeros((2, 1, 3, 70), dtype=data.dtype)
    block[1, 0, 2, 40 : 40 + data.size] = data
    with pytest.raises(ParameterError, match=match) as info:
        REP.from_dense(block)
    msg = str(info.value)
    assert "0 <= v < 65536" in msg and "dense" in msg  # what fits, and what to do


def test_largest_value_that_fits_is_admitted_in_any_dtype() -> None:
    for dtype in ("uint32", "int32", "int64", "uint64"):
        block = np.full((1, 2, 3, 4), 65535, dtype=dtype)
        np.testing.assert_array_equal(REP.to_dense(REP.from_dense(block)), block)


@pytest.mark.parametrize("bad", (0, 16, 48, -32, 64.5, "128", None))
def test_block_values_must_be_a_multiple_of_32(bad: Any) -> None:
    with pytest.raises(ParameterError, match="multiple of 32"):
        REP.from_dense(np.zeros((1, 1, 4, 4), np.uint16), block_values=bad)


def test_unknown_option_and_bad_shape() -> None:
    with pytest.raises(ParameterError, match=r"unknown packed option.*block_values="):
        REP.from_dense(np.zeros((1, 1, 4, 4), np.uint16), width=8)
    with pytest.raises(ShapeError, match=r"\(rows, cols, k_r, k_c\)"):
        REP.from_dense(np.zeros((4, 4), np.uint16))
    with pytest.raises(ParameterError, match="PackedPayload"):
        REP.to_dense(np.zeros((1, 1, 4, 4), np.uint16))


def test_inconsistent_payloads_are_refused(rng: np.random.Generator) -> None:
    p = REP.from_dense(low_dose(rng, (2, 3, 8, 40), 0.2), block_values=32)
    fields = {f: getattr(p, f) for f in PackedPayload.__dataclass_fields__}

    def remake(**changes: Any) -> PackedPayload:
        return PackedPayload(**{**fields, **changes})

    bad_offsets = p.offsets.copy()
    bad_offsets[3] += 1
    bad_widths = p.widths.copy()
    bad_widths[0] = 17
    cases = [
        ({"offsets": bad_offsets}, "running sum"),
        ({"widths": bad_widths}, "width is 17"),
        ({"data": p.data[:-1]}, "data holds"),
        ({"widths": p.widths[:-1]}, "offsets must be int64"),
        ({"block_values": 40}, "multiple of 32"),
        ({"scan_shape": (3, 3)}, "blocks for 9 frames"),
        ({"data": p.data.astype(np.int64)}, "little-endian uint32"),
    ]
    for changes, match in cases:
        with pytest.raises(ShapeError, match=match):
            remake(**changes)


# ----------------------------------------------------------------------------- size


def test_low_dose_packs_much_smaller_than_dense(rng: np.random.Generator) -> None:
    # measured at the default block of 128 values (96 x 128 frames): 8.6x at 1% occupancy,
    # 21x at 0.1%, 1.27x for a uniform ~2000-count exposure (11-12 bits of 16)
    shape = (8, 10, 96, 128)
    one = low_dose(rng, shape, 0.01)
    tenth = low_dose(rng, shape, 0.001)
    bright = rng.poisson(2020, size=shape).astype(np.uint16)
    assert one.nbytes / REP.from_dense(one).nbytes > 7.0
    assert tenth.nbytes / REP.from_dense(tenth).nbytes > 17.0
    assert bright.nbytes / REP.from_dense(bright).nbytes > 1.2
    # bytes of a uint8 source shrink too; a constant 65535 costs its metadata over 16 bits
    full = np.full(shape, 65535, np.uint16)
    assert REP.from_dense(full).nbytes == full.nbytes + 4 + 9 * full.size // 128


# ----------------------------------------------------------------------------- kernel


def _dense_pass(frames: np.ndarray, w: np.ndarray, s: bool, m: bool) -> Any:
    return frame_pass_numba(frames, w, want_sum=s, want_max=m)


@pytest.mark.parametrize("dtype", ("uint8", "uint16", "uint32", "int16", "int64"))
@pytest.mark.parametrize("det", ((13, 22), (64, 80), (1, 1)), ids=("13x22", "64x80", "1x1"))
def test_kernel_equals_the_dense_kernel(
    dtype: str, det: tuple[int, int], rng: np.random.Generator
) -> None:
    n_scan = (7, 11)  # 77 frames: several groups and a partial one
    top = min(int(np.iinfo(dtype).max), 65535)
    if det == (1, 1):
        dense = rng.integers(0, 300, size=(*n_scan, *det)).astype(dtype)
    else:  # saturated pixels at the largest value the dtype (and packed) holds
        dense = np.minimum(saturated(rng, (*n_scan, *det)), top).astype(dtype)
    frames = dense.reshape(77, -1)
    payload = REP.from_dense(dense, block_values=64)
    for n_w in (0, 1, 4):
        for kind in ("binary", "real"):
            w = rng.standard_normal((n_w, frames.shape[1]))
            if kind == "binary":
                w = (w > 0).astype(np.float64)
            for s, m in ((False, False), (True, True), (True, False), (False, True)):
                got = frame_pass_packed(payload, w, want_sum=s, want_max=m)
                ref = _dense_pass(frames, w, s, m)
                assert got.per_frame.shape == (77, n_w) and got.per_frame.dtype == np.float64
                if kind == "binary":
                    np.testing.assert_array_equal(got.per_frame, ref[0])
                else:
                    np.testing.assert_allclose(got.per_frame, ref[0], rtol=1e-12, atol=0)
                for a, b in ((got.pattern_sum, ref[1]), (got.pattern_max, ref[2])):
                    assert (a is None) == (b is None)
                    if a is not None and b is not None:
                        assert a.dtype == b.dtype
                        np.testing.assert_array_equal(a, b)
    got = get_runtime("cpu").run_frame_pass(
        chunk_of("packed", payload), np.ones((1, frames.shape[1])), want_sum=True, want_max=True
    )
    assert got.pattern_sum is not None and got.pattern_sum.dtype == np.int64
    assert got.pattern_max is not None and got.pattern_max.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.per_frame[:, 0], frames.sum(axis=1, dtype=np.int64))


def test_kernel_decodes_a_few_frames_at_a_time(rng: np.random.Generator) -> None:
    dense = high_dose(rng, (40, 50, 32, 48))  # 2000 frames, 6 MiB dense
    payload = REP.from_dense(dense)
    w = np.ones((3, 32 * 48))
    frame_pass_packed(payload, w, want_sum=True, want_max=True)  # compile outside the trace
    assert 4 <= group_frames(32 * 48, 2) <= 64
    # tracemalloc counts every thread's allocations: a background compile of an earlier
    # test (or any other thread) only adds to a trace, so the least of three traces,
    # once no compile runs, bounds this kernel's own peak
    deadline = time.monotonic() + 60
    while warmup.any_warming() and time.monotonic() < deadline:
        time.sleep(0.05)
    peaks = []
    for _ in range(3):
        tracemalloc.start()
        try:
            got = frame_pass_packed(payload, w, want_sum=True, want_max=True)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        peaks.append(peak)
    peak = min(peaks)
    decoded_group = group_frames(32 * 48, 2) * 32 * 48 * 2
    outputs = got.per_frame.nbytes * 2 + 32 * 48 * 8 * 2 + 3 * 32 * 48 * 8
    assert peak < decoded_group + outputs + 64 * 1024, (peak, dense.nbytes)
    assert peak < dense.nbytes / 8
    np.testing.assert_array_equal(got.per_frame[:, 0], dense.reshape(2000, -1).sum(axis=1))


def test_kernel_refuses_bad_inputs(rng: np.random.Generator) -> None:
    payload = REP.from_dense(low_dose(rng, (2, 2, 5, 7)))
    with pytest.raises(ShapeError, match=r"weights must be \(n_weights, 35\)"):
        frame_pass_packed(payload, np.ones((2, 36)), want_sum=False, want_max=False)
    with pytest.raises(ParameterError, match="PackedPayload"):
        not_packed: Any = np.zeros((2, 2, 5, 7))
        frame_pass_packed(not_packed, np.ones((1, 35)), want_sum=False, want_max=False)


# ----------------------------------------------------------------------------- engine


CENTER = (8.6, 14.2)


def test_operator_parity_over_several_chunks(rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(7, 9), det=(20, 26))
    dense = qf.open(data, chunk_rows=2)  # 4 chunks, the last of one row
    packed = dense.to_representation("packed")
    assert packed.representation == "packed" and packed.storage_schema == PACKED_SCHEMA
    results = assert_operator_parity(dense, packed, center=CENTER, radius=4.5)
    ex = results[0].provenance.execution
    assert ex["n_chunks"] == 4
    assert ex["payloads_made_by"] == ["converted from dense"]
    assert ex["conversion_checks"] == ["full"]
    assert ex["payload_bytes"] < ex["dense_bytes"]
    # options travel to from_dense; a totals check is recorded as such
    small = dense.to_representation("packed", verify="totals", block_values=32)
    res = assert_operator_parity(dense, small, center=CENTER, radius=4.5)
    assert res[0].provenance.execution["conversion_checks"] == ["totals"]


def test_operator_parity_with_crops_and_binning(rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(7, 9), det=(20, 26))
    ds = qf.open(data, chunk_rows=3)
    views = (
        lambda d: d.crop_scan((1, 6, 2, 9)),
        lambda d: d.crop_detector((2, 17, 3, 25)),
        lambda d: d.bin_detector((2, 3)),  # uint16 sums widen to uint32 and still fit
        lambda d: d.crop_scan((0, 5, 1, 8)).crop_detector((1, 19, 0, 23)).bin_detector(2),
    )
    for view in views:
        dense_view = view(ds)
        packed_view = view(ds.to_representation("packed"))
        assert packed_view.representation == "packed"
        center = (dense_view.detector_shape[0] / 2.2, dense_view.detector_shape[1] / 1.9)
        results = assert_operator_parity(dense_view, packed_view, center=center, radius=3.0)
        if dense_view.dtype == np.uint32:
            assert results[2].data.dtype == np.int64  # sum_diffraction of uint32 values
            assert results[1].data.dtype == np.uint32  # max_diffraction keeps the dtype


def test_binned_sums_beyond_16_bits_are_refused_clearly(rng: np.random.Generator) -> None:
    data = rng.integers(0, 20000, size=(4, 5, 8, 10)).astype(np.uint16)
    data[2, 3, 4:6, 6:8] = 30000  # one 2 x 2 bin sums to 120000
    ds = qf.open(data, chunk_rows=2).bin_detector(2).to_representation("packed")
    assert ds.dtype == np.uint32
    with pytest.raises(ParameterError, match=r"uint32 data hold values up to 120000"):
        qf.compute(qf.sum_diffraction(ds), client="synchronous")
    # the same binning of data whose sums fit is admitted
    ok = qf.open(data // 4, chunk_rows=2).bin_detector(2)
    assert_operator_parity(ok, ok.to_representation("packed"), center=(2.1, 2.6), radius=1.5)


def test_persisted_packed_dataset(rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(6, 8), det=(20, 26))
    dense = qf.open(data, chunk_rows=2)
    p = dense.to_representation("packed").persist(client="synchronous")
    try:
        assert p.is_persisted and p.resident.representation == "packed"
        assert p.resident.storage_schema == PACKED_SCHEMA
        chunks = p.resident.refs
        assert all(isinstance(c.payload, PackedPayload) for c in chunks)
        assert sum(c.nbytes for c in chunks) < data.nbytes
        results = assert_operator_parity(dense, p, center=CENTER, radius=4.5)
        ex = results[0].provenance.execution
        assert ex["representation"] == "packed" and ex["storage_schema"] == PACKED_SCHEMA
        assert ex["bytes_read"] == 0
        assert ex["payload_bytes"] == sum(c.nbytes for c in chunks) < ex["dense_bytes"]
        assert all(r["resident"] for r in ex["chunks"])
    finally:
        p.release()
