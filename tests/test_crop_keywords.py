"""crop_scan / crop_detector take rows=/cols= as well as a region sequence."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import ParameterError, ShapeError


@pytest.fixture
def ds(rng: np.random.Generator) -> qf.Dataset4D:
    data = rng.integers(0, 50, (8, 9, 10, 12), dtype=np.uint16)
    return qf.open(data, calibration=qf.Calibration(detector_origin=(5.0, 6.0)))


def test_keyword_regions_equal_the_sequence(ds: qf.Dataset4D) -> None:
    data = ds.load_block((0, 8))
    a = ds.crop_scan(rows=(2, 6), cols=(1, 4))
    assert a.shape == ds.crop_scan((2, 6, 1, 4)).shape == (4, 3, 10, 12)
    np.testing.assert_array_equal(a.load_block((0, 4)), data[2:6, 1:4])
    rows_only = ds.crop_scan(rows=(3, 5))
    assert rows_only.scan_shape == (2, 9)  # the axis not given is kept whole
    np.testing.assert_array_equal(rows_only.load_block((0, 2)), data[3:5])
    d = ds.crop_detector(cols=(2, 10))
    assert d.detector_shape == (10, 8)
    np.testing.assert_array_equal(d.load_block((0, 1)), data[0:1, :, :, 2:10])
    assert d.calibration.detector_origin == (5.0, 4.0)  # the origin follows the crop
    both = ds.crop_detector(rows=(1, 9), cols=(2, 10))
    assert (
        both.calibration.detector_origin
        == ds.crop_detector((1, 9, 2, 10)).calibration.detector_origin
    )


def test_keyword_region_errors_say_what_is_expected(ds: qf.Dataset4D) -> None:
    with pytest.raises(ParameterError, match="not both"):
        ds.crop_scan((0, 2, 0, 2), rows=(0, 2))
    with pytest.raises(ParameterError, match="needs a region") as err:
        ds.crop_scan()
    assert "rows=(start, stop)" in str(err.value)
    with pytest.raises(ParameterError, match=r"rows must be \(start, stop\), got 3"):
        ds.crop_scan(rows=3)  # type: ignore[arg-type]
    with pytest.raises((ShapeError, ParameterError), match="scan region"):
        ds.crop_scan(rows=(0, 99))
    with pytest.raises(ShapeError, match=r"\(0, 10, 5, 2\) is empty") as caught:
        ds.crop_detector(cols=(5, 2))
    again = pickle.loads(pickle.dumps(caught.value))
    assert str(again) == str(caught.value)
