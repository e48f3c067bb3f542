"""The probe estimate's smoothing and region finding equal SciPy's (operators/probe.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from quantem_flow.errors import ParameterError
from quantem_flow.operators.probe import _mean_3x3, _region_at, estimate_probe


@pytest.mark.parametrize("seed", range(40))
def test_mean_and_region_match_scipy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 50)), int(rng.integers(1, 50)))
    m = rng.random(shape) * 1000
    assert np.allclose(
        _mean_3x3(m), ndimage.uniform_filter(m, size=3, mode="nearest"), rtol=1e-13, atol=0
    )
    mask = rng.random(shape) > rng.uniform(0.3, 0.7)
    labels, _ = ndimage.label(mask)
    for start in np.argwhere(mask)[:5]:
        at = (int(start[0]), int(start[1]))
        assert np.array_equal(_region_at(mask, at), labels == labels[at])


def test_a_disk_beside_specks_is_found_and_the_specks_are_left_out() -> None:
    rr, cc = np.mgrid[:96, :96]
    pattern = np.where(np.hypot(rr - 40.3, cc - 52.6) < 14, 50.0, 1.0)
    pattern[5, 5] = pattern[90, 10] = 60.0  # bright single pixels away from the disk
    est = estimate_probe(pattern)
    assert est.center == pytest.approx((40.3, 52.6), abs=0.1)
    assert est.area_px == int(np.count_nonzero(np.hypot(rr - 40.3, cc - 52.6) < 14))


def test_a_peak_between_bright_pixels_takes_the_largest_region() -> None:
    pattern = np.ones((40, 40))
    for r, c in ((9, 9), (9, 11), (11, 9), (11, 11)):  # diagonal neighbours of a dark pixel
        pattern[r, c] = 40.0  # the smoothed peak falls on (10, 10), which is not bright
    pattern[30, 30:33] = 20.0  # the largest 4-connected region: three pixels
    est = estimate_probe(pattern)
    assert est.area_px == 3
    assert est.center == pytest.approx((30.0, 31.0))
    with pytest.raises(ParameterError, match="flat"):
        estimate_probe(np.ones((8, 8)))
