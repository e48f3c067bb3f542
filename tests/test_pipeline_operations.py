"""Pipeline operations take their keys from the operators' signatures (pipeline/schema.py)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow.operators as ops
from quantem_flow.pipeline import OPERATIONS, PIPELINE_OPERATIONS, PYTHON_ONLY, PipelineOperation
from quantem_flow.pipeline.schema import _FIELD_INPUTS, _REQUIRED


def test_every_key_is_a_parameter_of_its_operator() -> None:
    for op in PIPELINE_OPERATIONS:
        params = inspect.signature(getattr(ops, op.name)).parameters
        keywords = [
            p.name
            for p in params.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in PYTHON_ONLY
        ]
        assert OPERATIONS[op.name] == (
            *(("input",) if op.field_inputs else ()),
            *op.file_params,
            *keywords,
        )
        for key in op.file_params:
            assert params[key].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert _REQUIRED["ssb"] == ("voltage_kV", "semiangle_mrad")
    assert _REQUIRED["virtual_mask"] == ("mask",)
    assert _FIELD_INPUTS["idpc"] == ("center_of_mass", "dpc")


def _toy_op(ds: Any, weights: Any, *, gain: float, offset: float = 0.0, name: str = "") -> Any:
    return {"ds": ds, "weights": weights, "gain": gain, "offset": offset, "name": name}


def test_a_new_operator_is_declared_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(ops, "toy_op", _toy_op, raising=False)
    decl = PipelineOperation("toy_op", file_params=("weights",))
    assert decl.keys() == ("weights", "gain", "offset")
    assert decl.required() == ("weights", "gain")
    np.save(tmp_path / "w.npy", np.arange(3.0))
    loaded: list[Path] = []

    def load(path: Path) -> Any:
        loaded.append(path)
        return np.load(path)

    got = decl.call(
        "the dataset",
        {"weights": str(tmp_path / "w.npy"), "gain": 2.0},
        name="toy",
        load_file=load,
    )
    assert loaded == [tmp_path / "w.npy"]
    assert got["ds"] == "the dataset" and got["gain"] == 2.0 and got["name"] == "toy"
    assert np.array_equal(got["weights"], np.arange(3.0))
