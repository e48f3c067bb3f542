"""A persisted query through the complement of a wide detector: exact, recorded, cached."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.graphs.complement_query import (
    MIN_SUPPORT,
    Complement,
    Declined,
    plan_complement,
)
from quantem_flow.representations.chunk import chunk_of
from quantem_flow.runtimes import get_runtime
from quantem_flow.runtimes.cpu import CpuRuntime
from tests.conftest import probe_data

CENTER = (8.6, 14.2)


@pytest.fixture(autouse=True)
def _without_the_radial_index() -> Any:
    """These rings would be answered by the radial index first (tests/test_radial_query.py)."""
    with qf.config.set(radial_queries=False):
        yield


class _Unpriced(CpuRuntime):
    """The CPU runtime without a price for a frame pass (as a runtime without a model)."""

    def frame_pass_cost(self, weights: Any, **kwargs: Any) -> None:
        return None


def _disk_rows(k: int, *, com: bool) -> np.ndarray:
    """BF (radius k/6), an ADF ring from k/4 to the edge and, with ``com``, CoM's rows."""
    rr, cc = np.mgrid[:k, :k]
    d = np.hypot(rr - k / 2, cc - k / 2)
    rows = [d < k / 6, d >= k / 4]
    if com:
        rows += [np.ones((k, k)), rr - k / 2, cc - k / 2]
    return np.stack([np.asarray(r, dtype=np.float64).ravel() for r in rows])


def _records(result: Any) -> list[dict[str, Any]]:
    return list(result.provenance.execution["chunks"])


@pytest.mark.parametrize("representation", ["dense", "packed", "encoded"])
def test_wide_ring_on_resident_integer_data_is_exact_and_recorded(
    rng: np.random.Generator, tmp_path: Any, representation: str
) -> None:
    data = probe_data(rng, scan=(6, 5), bright=900)  # sums well past uint16 frames
    np.save(tmp_path / "d.npy", data)
    ds = qf.open(tmp_path / "d.npy", chunk_rows=2)
    if representation != "dense":
        ds = ds.to_representation(representation)
    (direct,) = qf.compute(qf.virtual_adf(ds, inner=3.0, center=CENTER), client="synchronous")
    assert all("query" not in r for r in _records(direct))  # a file pass reads every pixel
    p = ds.persist(client="synchronous")
    (first,) = qf.compute(qf.virtual_adf(p, inner=3.0, center=CENTER), client="synchronous")
    (second,) = qf.compute(qf.virtual_adf(p, inner=3.0, center=CENTER), client="synchronous")
    for result in (first, second):
        np.testing.assert_array_equal(result.data, direct.data)  # bit for bit
        assert result.data.dtype == direct.data.dtype
        for rec in _records(result):
            assert rec["query"]["path"] == "complement"
            assert rec["query"]["rows"] == [0]
    # the per-frame totals are computed on the first query and kept with the chunk
    assert all(r["query"]["totals_s"] > 0.0 for r in _records(first))
    assert all(r["query"]["totals_s"] == 0.0 for r in _records(second))
    p.release()


def test_narrow_detectors_float_data_and_patterns_run_as_asked(
    rng: np.random.Generator, tmp_path: Any
) -> None:
    data = probe_data(rng, scan=(4, 5))
    np.save(tmp_path / "i.npy", data)
    np.save(tmp_path / "f.npy", data.astype(np.float32) + np.float32(0.25))
    p = qf.open(tmp_path / "i.npy", chunk_rows=2).persist(client="synchronous")
    (bf,) = qf.compute(qf.virtual_bf(p, radius=4.5, center=CENTER), client="synchronous")
    assert all("query" not in r for r in _records(bf))  # covers ~12 % of the frame
    adf, total = qf.compute(
        qf.virtual_adf(p, inner=3.0, center=CENTER), qf.sum_diffraction(p), client="synchronous"
    )
    assert all("query" not in r for r in _records(adf))  # the pattern reads every pixel anyway
    np.testing.assert_array_equal(total.data, data.sum(axis=(0, 1), dtype=np.int64))
    pf = qf.open(tmp_path / "f.npy", chunk_rows=2).persist(client="synchronous")
    (adf_f,) = qf.compute(qf.virtual_adf(pf, inner=3.0, center=CENTER), client="synchronous")
    assert all("query" not in r for r in _records(adf_f))  # float sums are not exact
    for ds in (p, pf):
        ds.release()


def test_plan_flips_only_wide_binary_rows(rng: np.random.Generator) -> None:
    data = rng.integers(0, 50, size=(2, 3, 4, 5), dtype=np.uint16)
    chunk = chunk_of("dense", data)
    pixels = 20
    wide = np.ones(pixels)
    wide[:3] = 0.0  # 85 % support
    narrow = np.zeros(pixels)
    narrow[:4] = 1.0
    graded = (np.arange(pixels) % 3).astype(np.float64)  # wide but not 0/1
    half = np.zeros(pixels)
    half[: int(pixels * MIN_SUPPORT)] = 1.0  # exactly the threshold: not more than it
    weights = np.stack([wide, narrow, graded, half])
    runtime = _Unpriced()  # the flip itself; pricing: test_the_runtime_prices_the_complement
    plan = plan_complement(
        weights,
        data.dtype,
        want_sum=False,
        want_max=False,
        gather=None,
        runtime=runtime,
        chunk=chunk,
    )
    assert isinstance(plan, Complement)
    assert plan.rows.tolist() == [True, False, False, False]
    np.testing.assert_array_equal(plan.weights[0], 1.0 - wide)
    np.testing.assert_array_equal(plan.weights[1:], weights[1:])
    np.testing.assert_array_equal(plan.totals, data.reshape(6, pixels).sum(axis=1))
    out = runtime.run_frame_pass(chunk, plan.weights, want_sum=False, want_max=False)
    restored = plan.restore(out).per_frame
    np.testing.assert_array_equal(restored, data.reshape(6, pixels).astype(np.float64) @ weights.T)
    for kwargs in (
        {"want_sum": True, "want_max": False, "gather": None},
        {"want_sum": False, "want_max": True, "gather": None},
    ):
        assert plan_complement(weights, data.dtype, runtime=runtime, chunk=chunk, **kwargs) is None
    assert (
        plan_complement(
            weights,
            np.dtype(np.float32),
            want_sum=False,
            want_max=False,
            gather=None,
            runtime=runtime,
            chunk=chunk,
        )
        is None
    )


def test_the_setting_turns_it_off_and_the_result_is_the_same(
    rng: np.random.Generator, tmp_path: Any
) -> None:
    data = probe_data(rng, scan=(4, 5), bright=900)
    np.save(tmp_path / "d.npy", data)
    p = qf.open(tmp_path / "d.npy", chunk_rows=2).persist(client="synchronous")
    (on,) = qf.compute(qf.virtual_adf(p, inner=3.0, center=CENTER), client="synchronous")
    with qf.config.set(complement_queries=False):
        (off,) = qf.compute(qf.virtual_adf(p, inner=3.0, center=CENTER), client="synchronous")
    assert all(r["query"]["path"] == "complement" for r in _records(on))
    assert all("query" not in r for r in _records(off))
    np.testing.assert_array_equal(on.data, off.data)
    p.release()


def test_the_runtime_prices_the_complement(rng: np.random.Generator) -> None:
    k = 128
    data = rng.integers(0, 60, size=(2, 2, k, k), dtype=np.uint16)
    chunk = chunk_of("dense", data)
    runtime = get_runtime("cpu")
    ask = {"want_sum": False, "want_max": False, "gather": None, "runtime": runtime}
    bf_ring = _disk_rows(k, com=False)  # BF + the ring: the complement's vectors span the middle
    with_com = _disk_rows(k, com=True)  # BF + ADF + CoM: the moments read every pixel anyway
    ring = bf_ring[1:]  # one row: one dot vector over the frame, cheaper than the disk's cells
    # measured on resident 128 x 128 u16 chunks, two threads (benchmarks/RESULTS.md,
    # "Complement queries priced by the kernel"): 49.5 against 28.7 GB/s; 13.9 against 21.8;
    # 19.9 against 31.1
    for weights, cheaper in ((bf_ring, True), (with_com, False), (ring, False)):
        flipped = weights.copy()
        flipped[-1 if weights is ring else 1] = 1.0 - flipped[-1 if weights is ring else 1]
        asked = runtime.frame_pass_cost(weights, dtype=data.dtype, frame_shape=(k, k))
        through = runtime.frame_pass_cost(flipped, dtype=data.dtype, frame_shape=(k, k))
        assert asked is not None and through is not None and asked > 0 and through > 0
        assert (through < asked) == cheaper
        plan = plan_complement(weights, data.dtype, chunk=chunk, **ask)
        if cheaper:
            assert isinstance(plan, Complement)
        else:
            assert isinstance(plan, Declined)
            record = plan.record()
            assert record["path"] == "as asked"
            assert f"{plan.complement:.0f}" in record["why"]
            assert f"{plan.asked:.0f}" in record["why"]
            assert plan.complement >= plan.asked
    # no price (another runtime): the complement, as before
    unpriced = plan_complement(with_com, data.dtype, chunk=chunk, **{**ask, "runtime": _Unpriced()})
    assert isinstance(unpriced, Complement)


def test_bf_adf_com_on_resident_chunks_runs_as_asked_and_says_why(
    rng: np.random.Generator, tmp_path: Any
) -> None:
    k = 128
    data = rng.integers(0, 60, size=(4, 4, k, k), dtype=np.uint16)
    np.save(tmp_path / "d.npy", data)
    ds = qf.open(tmp_path / "d.npy", chunk_rows=2)
    c = (k / 2, k / 2)

    def ops(d: Any) -> list[Any]:
        return [
            qf.virtual_bf(d, radius=k / 6, center=c),
            qf.virtual_adf(d, inner=k / 4, center=c),
            qf.center_of_mass(d, center=c),
        ]

    from_file = qf.compute(*ops(ds), client="synchronous")
    p = ds.persist(client="synchronous")
    resident = qf.compute(*ops(p), client="synchronous")
    for a, b in zip(from_file, resident, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for rec in _records(resident[0]):
        assert rec["query"]["path"] == "as asked"
        assert "prices the complement" in rec["query"]["why"]
    p.release()


@pytest.mark.parametrize("dtype", ["uint16", "uint8", "float32"])
def test_the_cpu_price_passes_the_conformance_check(dtype: str) -> None:
    from quantem_flow.testing.runtime_conformance import check_frame_pass_cost

    rng = np.random.default_rng(5)
    assert check_frame_pass_cost(lambda: get_runtime("cpu"), dtype, rng=rng)
    assert check_frame_pass_cost(lambda: get_runtime("cpu"), dtype, rng=rng, detector=(128, 128))
    assert not check_frame_pass_cost(_Unpriced, dtype, rng=rng)  # no price: nothing to check


class _CountedPrice(CpuRuntime):
    """The CPU runtime, counting the prices it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.priced = 0

    def frame_pass_cost(self, weights: Any, **kwargs: Any) -> float | None:
        self.priced += 1
        return super().frame_pass_cost(weights, **kwargs)


def test_the_chunks_of_a_pass_decide_once(rng: np.random.Generator) -> None:
    k = 64
    runtime = _CountedPrice()
    ask = {"want_sum": False, "want_max": False, "gather": None, "runtime": runtime}
    chunks = [
        chunk_of("dense", rng.integers(0, 60, size=(2, 3, k, k), dtype=np.uint16)) for _ in range(4)
    ]
    weights = _disk_rows(k, com=False)
    plans = [plan_complement(weights, np.dtype(np.uint16), chunk=c, **ask) for c in chunks]
    assert all(isinstance(p, Complement) for p in plans)
    assert runtime.priced == 2  # the rows as asked and their complement, once for the pass
    # each chunk keeps its own totals; the flipped weights are shared, read-only
    for plan, chunk in zip(plans, chunks, strict=True):
        assert isinstance(plan, Complement)
        np.testing.assert_array_equal(plan.totals, chunk.payload.reshape(6, -1).sum(axis=1))
        assert not plan.weights.flags.writeable
    # a copy with the same values decides from the kept decision; changed values decide again
    plan_complement(weights.copy(), np.dtype(np.uint16), chunk=chunks[0], **ask)
    assert runtime.priced == 2
    changed = weights.copy()
    changed[0, 0] = 1.0 - changed[0, 0]
    plan_complement(changed, np.dtype(np.uint16), chunk=chunks[0], **ask)
    assert runtime.priced == 4
    # so does the same weights array on frames of another dtype
    plan_complement(weights, np.dtype(np.uint8), chunk=chunks[0], **ask)
    assert runtime.priced == 6
