"""A persisted query through the complement of a wide detector: exact, recorded, cached."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.graphs.complement_query import MIN_SUPPORT, plan_complement
from quantem_flow.representations.chunk import chunk_of
from quantem_flow.runtimes import get_runtime
from tests.conftest import probe_data

CENTER = (8.6, 14.2)


@pytest.fixture(autouse=True)
def _without_the_radial_index() -> Any:
    """These rings would be answered by the radial index first (tests/test_radial_query.py)."""
    with qf.config.set(radial_queries=False):
        yield


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
    runtime = get_runtime("cpu")
    plan = plan_complement(
        weights,
        data.dtype,
        want_sum=False,
        want_max=False,
        gather=None,
        runtime=runtime,
        chunk=chunk,
    )
    assert plan is not None
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
