"""The probe disk's segmentation: SciPy's results without importing scipy.ndimage."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy import ndimage

from quantem_flow.operators.probe import box_mean_3x3, estimate_probe, region_at


def _scipy_estimate(m: np.ndarray, threshold: float = 0.5) -> tuple[np.ndarray, tuple[int, ...]]:
    """The disk as the earlier code found it, with scipy.ndimage throughout."""
    smooth = ndimage.uniform_filter(m, size=3, mode="nearest")
    bg = float(np.median(m))
    peak = float(smooth.max())
    above = m > bg + threshold * (peak - bg)
    labels, _ = ndimage.label(above)
    seed = np.unravel_index(int(np.argmax(smooth)), m.shape)
    lab = labels[seed]
    if lab == 0:
        counts = np.bincount(labels.ravel())
        counts[0] = 0
        lab = int(np.argmax(counts))
    return labels == lab, seed


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (6, 1), (2, 2), (17, 31), (64, 64)])
def test_box_mean_matches_uniform_filter(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(shape))
    m = rng.random(shape) * 1000
    want = ndimage.uniform_filter(m, size=3, mode="nearest")
    np.testing.assert_allclose(box_mean_3x3(m), want, rtol=1e-13, atol=0)


def test_region_at_is_scipy_label_at_the_seed() -> None:
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(400):
        shape = tuple(int(v) for v in rng.integers(1, 30, 2))
        mask = rng.random(shape) < rng.uniform(0.2, 0.8)
        if not mask.any():
            continue
        flat = int(rng.choice(np.flatnonzero(mask)))
        seed = (flat // shape[1], flat % shape[1])
        labels, _ = ndimage.label(mask)
        got = region_at(mask, seed)
        if got is None:  # a winding region: the caller labels with SciPy
            continue
        np.testing.assert_array_equal(got, labels == labels[seed])
        checked += 1
    assert checked > 350


def test_region_at_gives_up_on_a_spiral_and_refuses_a_seed_outside() -> None:
    n = 41
    spiral = np.zeros((n, n), dtype=bool)
    r0, c0, r1, c1 = 0, 0, n - 1, n - 1
    while r0 <= r1 and c0 <= c1:  # a one-pixel path winding inwards, walls between its turns
        spiral[r0, c0 : c1 + 1] = True
        spiral[r0 : r1 + 1, c1] = True
        spiral[r1, c0 : c1 + 1] = True
        spiral[r0 + 2 : r1 + 1, c0] = True
        if r0 + 2 <= r1:
            spiral[r0 + 2, c0 : c0 + 3] = True
        r0, c0, r1, c1 = r0 + 2, c0 + 2, r1 - 2, c1 - 2
    assert region_at(spiral, (0, 0)) is None
    with pytest.raises(ValueError, match="not in the mask"):
        region_at(np.zeros((3, 3), dtype=bool), (1, 1))


def _disk_pattern(n: int, center: tuple[float, float], radius: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rr, cc = np.indices((n, n))
    disk = (rr - center[0]) ** 2 + (cc - center[1]) ** 2 < radius**2
    return rng.poisson(np.where(disk, 200.0, 3.0)).astype(np.float64)


@pytest.mark.parametrize(
    "pattern",
    [
        _disk_pattern(64, (31.4, 33.2), 9.5, 1),
        _disk_pattern(128, (70.0, 52.0), 30.0, 2),
        # two disks, the brighter smaller: the region at the smoothed peak
        _disk_pattern(64, (20.0, 20.0), 6.0, 3) + 2 * _disk_pattern(64, (44.0, 40.0), 4.0, 4),
    ],
)
def test_estimate_probe_finds_scipys_disk(pattern: np.ndarray) -> None:
    want, _ = _scipy_estimate(pattern)
    got = estimate_probe(pattern)
    assert got.area_px == int(want.sum())
    bg = float(np.median(pattern))
    w = (pattern - bg) * want
    rr, cc = np.indices(pattern.shape, dtype=np.float64)
    centre = ((w * rr).sum() / w.sum(), (w * cc).sum() / w.sum())
    assert got.center == pytest.approx(centre, rel=1e-12)


def test_seed_between_bright_pixels_takes_the_largest_region() -> None:
    # a ring of 8 bright pixels: the 3 x 3 mean peaks on the dark pixel it surrounds
    m = np.zeros((16, 16))
    m[5:8, 5:8] = 100.0
    m[6, 6] = 0.0
    m[11:14, 2:6] = 60.0  # the largest 4-connected region above the threshold
    want, seed = _scipy_estimate(m)
    assert seed == (6, 6) and not want[seed]
    got = estimate_probe(m)
    assert got.area_px == int(want.sum()) == 12


def test_estimating_a_probe_does_not_import_scipy_ndimage() -> None:
    code = (
        "import sys, numpy as np\n"
        "from quantem_flow.operators.probe import estimate_probe\n"
        "rr, cc = np.indices((64, 64))\n"
        "m = np.where((rr - 30) ** 2 + (cc - 34) ** 2 < 100, 50.0, 1.0)\n"
        "p = estimate_probe(m)\n"
        "print(p.area_px, 'scipy.ndimage' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[1] == "False"
    assert int(out[0]) > 250
