"""Diffraction axes are measured from the beam centre; detectors are drawn in the axes' unit."""

from __future__ import annotations

import numpy as np
import pytest

import quantem_flow as qf
from tests.conftest import probe_data

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

MRAD_PER_PX = 0.8


def _dataset(data: np.ndarray, **cal: object) -> qf.Dataset4D:
    return qf.open(
        data,
        calibration=qf.Calibration(detector_sampling=MRAD_PER_PX, detector_units="mrad", **cal),
    )


def test_calibrated_pattern_without_origin_is_measured_from_the_found_centre(
    rng: np.random.Generator,
) -> None:
    data = probe_data(rng, scan=(6, 5), det=(30, 34), center=(12.3, 19.6), radius=5)
    ds = _dataset(data)
    mean, bf = qf.compute(qf.mean_diffraction(ds), qf.virtual_bf(ds), client="synchronous")
    record = mean.provenance.parameters["axes_origin"]
    assert record["from"].startswith("the beam centre found from the data")
    centre = bf.provenance.parameters["center_px"]  # where BF put its disk (center="auto")
    assert record["px"] == pytest.approx(centre)
    assert abs(centre[0] - 12.3) < 1.0 and abs(centre[1] - 19.6) < 1.0
    row, col = mean.axes
    assert row.units == col.units == "mrad"
    assert (row.origin, col.origin) == pytest.approx(tuple(centre))
    coords = np.asarray(col.coordinates())
    # zero angle lies at the beam centre, not at the corner
    assert coords[0] == pytest.approx(-centre[1] * MRAD_PER_PX)
    assert coords.min() < 0 < coords.max()

    fig = mean.plot(detectors=[bf])
    ax = fig.axes[0]
    assert ax.get_xlabel() == "k column (mrad from the beam centre)"
    assert ax.get_ylabel() == "k row (mrad from the beam centre)"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    radius_px = bf.provenance.parameters["outer"]
    assert bf.provenance.parameters.get("radii_units", "px") == "px"
    assert legend == [f"bf: r < {radius_px * MRAD_PER_PX:.3g} mrad"]
    matplotlib.pyplot.close(fig)


def test_given_origin_wins_and_uncalibrated_axes_stay_pixel_indices(
    rng: np.random.Generator,
) -> None:
    data = probe_data(rng, scan=(4, 4), det=(20, 26))
    given = _dataset(data, detector_origin=(10.0, 13.0))
    (mean,) = qf.compute(qf.mean_diffraction(given), client="synchronous")
    assert mean.provenance.parameters["axes_origin"]["px"] == [10.0, 13.0]
    assert mean.axes[0].origin == 10.0
    (plain,) = qf.compute(qf.mean_diffraction(qf.open(data)), client="synchronous")
    assert plain.provenance.parameters["axes_origin"]["px"] is None
    assert plain.axes[1].coordinates()[0] == 0.0
    fig = plain.plot()
    assert fig.axes[0].get_xlabel() == "k column (px)"
    matplotlib.pyplot.close(fig)


def test_no_beam_centre_found_says_the_axes_start_at_the_corner() -> None:
    flat = np.full((3, 3, 12, 12), 7, dtype=np.uint16)
    (mean,) = qf.compute(qf.max_diffraction(_dataset(flat)), client="synchronous")
    record = mean.provenance.parameters["axes_origin"]
    assert record["px"] == [0.0, 0.0]
    assert record["from"].startswith("the detector corner") and "detector_origin" in record["from"]
    fig = mean.plot()
    assert fig.axes[0].get_xlabel() == "k column (mrad from the detector corner)"
    matplotlib.pyplot.close(fig)
