"""Results behave like arrays: NumPy's protocols keep axes and units and record the operation."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import ShapeError, UnitsError
from quantem_flow.result_math import combine_units
from tests.conftest import probe_data


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    data = probe_data(np.random.default_rng(3), scan=(5, 6))
    cal = qf.Calibration(
        scan_sampling=0.5, scan_units="nm", detector_sampling=0.9, detector_units="mrad"
    )
    ds = qf.open(data, calibration=cal)
    other = qf.open(data, calibration=cal.replace(scan_sampling=(0.7, 0.7)))
    bf, adf, com, mean, bf_other = qf.compute(
        qf.virtual_bf(ds),
        qf.virtual_adf(ds),
        qf.center_of_mass(ds),
        qf.mean_diffraction(ds),
        qf.virtual_bf(other),
        client="synchronous",
    )
    return {"bf": bf, "adf": adf, "com": com, "mean": mean, "bf_other": bf_other}


def test_arithmetic_keeps_type_axes_units_and_records_the_operation(
    results: dict[str, Any],
) -> None:
    bf, adf = results["bf"], results["adf"]
    shifted = bf + 1
    assert type(shifted) is type(bf) and shifted.axes == bf.axes and shifted.units == "counts"
    np.testing.assert_array_equal(shifted.data, bf.data + 1)
    assert shifted.provenance.operator == "numpy.add"
    assert shifted.provenance.parameters["operands"] == [{"result": "bf", "units": "counts"}, 1.0]
    assert shifted.provenance.derived_from == [bf.provenance.to_dict()]
    assert shifted.provenance.source == bf.provenance.source
    assert (1 + bf).units == "counts" and (bf - adf).units == "counts"
    ratio = adf / bf
    assert ratio.units == "1"
    np.testing.assert_allclose(ratio.data, adf.data / bf.data)
    assert len(ratio.provenance.derived_from) == 2
    assert (bf * adf).units == "counts·counts"
    assert (bf**2).units == "counts^2" and (1 / bf).units == "1/counts"
    assert np.sqrt(bf).units == "counts^0.5"
    assert (-bf).units == "counts" and abs(-bf).units == "counts"
    logged = np.log1p(results["mean"])
    assert logged.units == "log1p(counts per frame)" and logged.axes == results["mean"].axes
    field = results["com"] * 2
    assert type(field).__name__ == "VectorField" and field.units == results["com"].units
    # an ndarray on either side
    plain = np.ones(bf.shape)
    assert (plain + bf).units == "counts" and type(plain + bf) is type(bf)


def test_reductions_comparisons_and_functions(results: dict[str, Any]) -> None:
    bf = results["bf"]
    assert np.mean(bf) == pytest.approx(bf.data.mean())
    assert isinstance(np.sum(bf), np.integer | np.floating | int | float)
    mask = bf > np.median(bf)
    assert isinstance(mask, np.ndarray) and mask.dtype == bool
    clipped = np.clip(bf, 0, 100)
    assert type(clipped) is type(bf) and clipped.axes == bf.axes and clipped.data.max() <= 100
    assert clipped.provenance.operator == "numpy.clip"
    assert isinstance(np.flipud(bf), np.ndarray)  # moves elements: plain values
    assert isinstance(np.add.reduce(bf, axis=0), np.ndarray)
    assert bf == bf and bf != results["adf"]  # identity, so results hash and sort into sets
    assert len({bf, results["adf"]}) == 2


def test_mismatches_are_refused_with_the_projects_errors(results: dict[str, Any]) -> None:
    bf = results["bf"]
    with pytest.raises(UnitsError, match=r"same units, got \['counts', 'counts per frame'\]"):
        _ = bf + _with_units(bf, "counts per frame")
    with pytest.raises(UnitsError):
        _ = bf < (bf / bf)  # a comparison with a dimensionless ratio
    with pytest.raises(ShapeError, match="different axes"):
        _ = bf + results["mean"]
    with pytest.raises(ShapeError, match="different axes") as err:
        _ = bf + results["bf_other"]  # same shape, other calibration
    copy = pickle.loads(pickle.dumps(err.value))
    assert str(copy) == str(err.value)


def _with_units(result: Any, units: str) -> Any:
    import dataclasses

    return dataclasses.replace(result, units=units)


def test_combine_units_table() -> None:
    assert combine_units("add", ["nm", None]) == "nm"
    assert combine_units("divide", ["mrad", "mrad"]) == "1"
    assert combine_units("divide", [None, "nm"]) == "1/nm"
    assert combine_units("divide", ["counts", None]) == "counts"
    assert combine_units("multiply", ["1", "rad"]) == "rad"
    assert combine_units("exp", ["1"]) == "1"
    with pytest.raises(UnitsError):
        combine_units("less", ["nm", "Å"])
