"""Persisted disk and annulus queries from a radial index kept with each resident chunk.

Values must equal the file pass bit for bit (integer data), the chunk records must say
which path ran, the index must be reused while the radius stays inside it and rebuilt
when it does not, and anything the index cannot answer exactly must run as before.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.graphs.radial_query import MAX_SHARE, _order, plan_radial
from quantem_flow.operators.geometry import annulus
from tests.conftest import probe_data

CENTER = (8.6, 14.2)
DET = (20, 26)


def _records(result: Any) -> list[dict[str, Any]]:
    return list(result.provenance.execution["chunks"])


def _queries(ds: qf.Dataset4D, r: float, **units: Any) -> list[Any]:
    return [
        qf.virtual_bf(ds, radius=r, center=CENTER, **units),
        qf.virtual_adf(ds, inner=r, center=CENTER, **units),  # to the detector edge
        qf.virtual_annular(ds, inner=r / 2, outer=r, center=CENTER, **units),
    ]


@pytest.mark.parametrize("representation", ["dense", "packed", "encoded"])
def test_disks_and_annuli_on_resident_integer_data_are_exact_and_reuse_the_index(
    rng: np.random.Generator, tmp_path: Any, representation: str
) -> None:
    data = probe_data(rng, scan=(6, 5), det=DET, bright=900)
    np.save(tmp_path / "d.npy", data)
    ds = qf.open(tmp_path / "d.npy", chunk_rows=2)
    if representation != "dense":
        ds = ds.to_representation(representation)
    files = {r: qf.compute(*_queries(ds, r), client="synchronous") for r in (3.5, 3.0, 4.2)}
    for results in files.values():
        assert all("query" not in rec for rec in _records(results[0]))  # a file pass
    p = ds.persist(client="synchronous")
    first = qf.compute(*_queries(p, 3.5), client="synchronous")
    inside = qf.compute(*_queries(p, 3.0), client="synchronous")  # a smaller radius
    for got, want in ((first, files[3.5]), (inside, files[3.0])):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a.data, b.data)  # bit for bit
            assert a.data.dtype == b.data.dtype
    for rec in _records(first[0]):
        assert rec["query"]["path"] == "radial"
        assert rec["query"]["index_built_s"] > 0.0  # built by the first query
        assert rec["query"]["totals_s"] > 0.0
        assert len(rec["query"]["ranges"]) == 3
    for rec in _records(inside[0]):
        assert rec["query"]["path"] == "radial"
        assert rec["query"]["index_built_s"] == 0.0  # the same index answers
        assert rec["query"]["totals_s"] == 0.0
    p.release()


def test_a_larger_radius_rebuilds_and_calibrated_units_work(
    rng: np.random.Generator, tmp_path: Any
) -> None:
    data = probe_data(rng, scan=(4, 5), det=DET, bright=700)
    np.save(tmp_path / "d.npy", data)
    cal = qf.Calibration(detector_sampling=(0.9, 1.3), detector_units="mrad")
    ds = qf.open(tmp_path / "d.npy", chunk_rows=2, calibration=cal)
    p = ds.persist(client="synchronous")
    sizes = []
    for r in (2.0, 2.5, 6.0):  # mrad: an anisotropic pixel scale
        want = qf.compute(*_queries(ds, r, units="mrad"), client="synchronous")
        got = qf.compute(*_queries(p, r, units="mrad"), client="synchronous")
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a.data, b.data)
        (rec, *_) = _records(got[0])
        assert rec["query"]["path"] == "radial"
        sizes.append((rec["query"]["index_pixels"], rec["query"]["index_built_s"] > 0))
    assert sizes[0][1] and not sizes[1][1]  # built, then reused
    assert sizes[2][1] and sizes[2][0] > sizes[0][0]  # a larger radius: built again, larger
    p.release()


def test_what_the_index_cannot_answer_runs_as_asked(
    rng: np.random.Generator, tmp_path: Any
) -> None:
    data = probe_data(rng, scan=(4, 5), det=DET)
    np.save(tmp_path / "i.npy", data)
    np.save(tmp_path / "f.npy", data.astype(np.float32) + np.float32(0.25))
    p = qf.open(tmp_path / "i.npy", chunk_rows=2).persist(client="synchronous")
    pf = qf.open(tmp_path / "f.npy", chunk_rows=2).persist(client="synchronous")
    mask = np.zeros(DET, dtype=bool)
    mask[3:9, 4:11] = True
    cases = {
        "centre of mass beside": [
            qf.virtual_bf(p, radius=3.0, center=CENTER),
            qf.center_of_mass(p, center=CENTER),
        ],
        "a free mask": [qf.virtual_mask(p, mask=mask)],
        "float data": [qf.virtual_bf(pf, radius=3.0, center=CENTER)],
        "two centres": [
            qf.virtual_bf(p, radius=3.0, center=CENTER),
            qf.virtual_bf(p, radius=3.0, center=(9.0, 12.0)),
        ],
        "a disk over the index's share": [
            qf.virtual_bf(
                p, radius=math.sqrt(MAX_SHARE * DET[0] * DET[1] / math.pi) * 1.3, center=CENTER
            )
        ],
    }
    for name, lazies in cases.items():
        results = qf.compute(*lazies, client="synchronous")
        assert all(r.get("query", {}).get("path") != "radial" for r in _records(results[0])), name
    # sparse counts held as pairs: an index would be many times the chunk, the kernels answer
    sparse = np.where(data > 60, data, 0).astype(np.uint16)
    pp = qf.open(sparse, chunk_rows=2).to_representation("paired").persist(client="synchronous")
    (bf_paired,) = qf.compute(qf.virtual_bf(pp, radius=3.0, center=CENTER), client="synchronous")
    assert all(r.get("query", {}).get("path") != "radial" for r in _records(bf_paired))
    (bf_dense,) = qf.compute(
        qf.virtual_bf(qf.open(sparse), radius=3.0, center=CENTER), client="synchronous"
    )
    np.testing.assert_array_equal(bf_paired.data, bf_dense.data)
    pp.release()
    with qf.config.set(radial_queries=False):
        (off,) = qf.compute(qf.virtual_bf(p, radius=3.0, center=CENTER), client="synchronous")
    assert all("query" not in r for r in _records(off))
    (on,) = qf.compute(qf.virtual_bf(p, radius=3.0, center=CENTER), client="synchronous")
    assert all(r["query"]["path"] == "radial" for r in _records(on))
    np.testing.assert_array_equal(on.data, off.data)
    for ds in (p, pf):
        ds.release()


def test_every_row_is_checked_against_the_hint() -> None:
    shape = (20, 26)
    hint = (8.6, 14.2, 1.0, 1.0)
    disk = annulus(shape, hint[:2], 0.0, 3.0, hint[2:]).astype(np.float64).reshape(1, -1)
    ring = annulus(shape, hint[:2], 2.0, math.inf, hint[2:]).astype(np.float64).reshape(1, -1)
    kw: dict[str, Any] = {"want_sum": False, "want_max": False, "gather": None}
    u16 = np.dtype(np.uint16)
    plan = plan_radial(np.vstack([disk, ring]), (hint, hint), u16, shape, **kw)
    assert plan is not None and plan.to_edge
    order, _ = _order((*hint, *shape))
    a, b = plan.ranges[0]
    assert a == 0 and set(order[a:b]) == set(np.flatnonzero(disk[0]))
    assert plan.ranges[1][1] == shape[0] * shape[1]
    shifted = (9.4, 13.1, 1.0, 1.0)  # the map is not a distance range around this centre
    assert (
        plan_radial(
            annulus(shape, hint[:2], 0.0, 5.0, hint[2:]).astype(float).reshape(1, -1),
            (shifted,),
            u16,
            shape,
            **kw,
        )
        is None
    )
    assert plan_radial(disk * 2.0, (hint,), u16, shape, **kw) is None  # not 0/1
    assert plan_radial(np.vstack([disk, ring]), (hint, None), u16, shape, **kw) is None
    assert plan_radial(disk, (hint,), np.dtype(np.float32), shape, **kw) is None
    assert (
        plan_radial(disk, (hint,), u16, shape, want_sum=True, want_max=False, gather=None) is None
    )
    # half of the pixels at one distance: a mask splitting them is not inner <= d < outer
    square = (10.0, 13.0, 1.0, 1.0)
    order, dist = _order((*square, *shape))
    ties = np.flatnonzero(dist == 1.0)
    assert ties.size == 4
    split = np.zeros((1, shape[0] * shape[1]))
    split[0, order[: ties[0] + 2]] = 1.0  # the centre pixel and two of its four neighbours
    assert plan_radial(split, (square,), u16, shape, **kw) is None
    whole = np.zeros((1, shape[0] * shape[1]))
    whole[0, order[: ties[-1] + 1]] = 1.0
    assert plan_radial(whole, (square,), u16, shape, **kw) is not None
