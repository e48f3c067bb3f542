"""NaN/inf detector pixels through qf.compute: outside a detector they change nothing,
inside they are reported (provenance + one NonFiniteWarning per result).  Issue 11 item 9.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import NonFiniteWarning

SCAN = (6, 5)
DET = (16, 16)
CENTER = (8.0, 8.0)


def _data(dtype: str = "float32") -> np.ndarray:
    rng = np.random.default_rng(3)
    rr, cc = np.mgrid[: DET[0], : DET[1]]
    disk = ((rr - CENTER[0]) ** 2 + (cc - CENTER[1]) ** 2 <= 9).astype(np.float64)
    data = rng.poisson(2.0, (*SCAN, *DET)) + 100 * disk
    return data.astype(dtype)


def _compute(data: np.ndarray, backend: str = "cpu") -> tuple[object, object, object]:
    ds = qf.open(data)
    bf = qf.virtual_bf(ds, radius=3, center=CENTER)
    adf = qf.virtual_adf(ds, inner=4, outer=6, units="px", center=CENTER)
    com = qf.center_of_mass(ds, center=CENTER, mask_radius=6.5)
    return qf.compute(bf, adf, com, client="synchronous", backend=backend)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nan_and_inf_outside_every_detector_change_nothing(dtype: str) -> None:
    """Failed before the fix: 0 * NaN made BF, ADF and CoM NaN at (2, 3) and (4, 1)."""
    data = _data(dtype)
    data[2, 3, 0, 0] = np.nan  # a corner pixel: outside BF, ADF and the CoM mask
    data[4, 1, 15, 0] = np.inf
    data[1, 1, 0, 15] = -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteWarning)
        bf, adf, com = _compute(data)
    assert np.isfinite(bf.data).all(), np.argwhere(~np.isfinite(bf.data))
    assert np.isfinite(adf.data).all()
    assert np.isfinite(com.data).all()
    assert "non_finite" not in bf.provenance.execution
    # equal to the same data with the bad pixels zeroed (the reference over finite pixels)
    bf0, adf0, com0 = _compute(np.where(np.isfinite(data), data, 0).astype(dtype))
    np.testing.assert_allclose(bf.data, bf0.data, rtol=1e-12)
    np.testing.assert_allclose(adf.data, adf0.data, rtol=1e-12)
    np.testing.assert_allclose(com.data, com0.data, rtol=1e-12, atol=1e-12)
    assert adf.data.min() > 0 and bf.data.min() > 0  # the detectors are not empty


def test_nonfinite_inside_a_detector_is_reported_once_per_result() -> None:
    data = _data()
    data[2, 3, 9, 9] = np.nan  # inside the BF disk and the CoM mask, off both axes
    data[4, 1, 11, 12] = np.inf  # inside the ADF ring (distance 5) and the CoM mask
    with pytest.warns(NonFiniteWarning) as caught:
        bf, adf, com = _compute(data)
    messages = [str(w.message) for w in caught if w.category is NonFiniteWarning]
    assert [m.split(":")[0] for m in messages] == ["bf", "adf", "com"], messages
    assert all("weight 0" in m and "virtual_mask" in m for m in messages)
    assert np.isnan(bf.data[2, 3]) and np.isfinite(np.delete(bf.data.ravel(), 2 * 5 + 3)).all()
    assert adf.data[4, 1] == np.inf and np.isfinite(np.delete(adf.data.ravel(), 4 * 5 + 1)).all()
    assert not np.isfinite(com.data[:, 2, 3]).any()
    assert not np.isfinite(com.data[:, 4, 1]).any()
    assert np.isfinite(np.delete(com.data.reshape(2, -1), [13, 21], axis=1)).all()
    entries = bf.provenance.execution["non_finite"]
    by_result = {}
    for e in entries:
        for name in e["results"]:
            by_result.setdefault(name, []).append(e)
    (e_bf,) = by_result["bf"]
    assert e_bf["scan_positions"] == 1 and e_bf["nan"] == 1
    assert e_bf["first_positions"] == [[2, 3]]
    (e_adf,) = by_result["adf"]
    assert e_adf["posinf"] == 1 and e_adf["first_positions"] == [[4, 1]]
    assert all(e["first_positions"] == [[2, 3], [4, 1]] for e in by_result["com"])
    assert any("non-finite" in n for n in bf.provenance.notes)
    assert any("non-finite" in n for n in com.provenance.notes)


def test_mps_runtime_agrees_through_compute() -> None:
    pytest.importorskip("mlx.core")
    data = _data()
    data[2, 3, 0, 0] = np.nan
    try:
        bf, adf, com = _compute(data, backend="mps")
    except qf.errors.RuntimeUnavailableError as exc:  # pragma: no cover - depends on MLX
        pytest.skip(str(exc))
    assert np.isfinite(bf.data).all() and np.isfinite(adf.data).all()
    assert np.isfinite(com.data).all()
