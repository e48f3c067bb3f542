"""Pipelines fail before any cluster starts, in YAML terms (issue 12, item 4).

Every error that needs no pixel data must come from ``quantem-flow run`` before
a scheduler is contacted, and name the YAML key (``outputs.adf.inner``,
``input.calibration``...) rather than a Python constructor.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import quantem_flow.cli as cli
import quantem_flow.graphs
from quantem_flow.dataset import Dataset4D
from quantem_flow.errors import CalibrationError, ParameterError, ScanShapeError
from quantem_flow.io.hdf5 import Hdf5Source
from quantem_flow.io.npy import NpySource
from quantem_flow.pipeline import (
    PreparedRun,
    load_pipeline,
    prepare_pipeline,
    run_pipeline,
    yaml_terms,
)
from quantem_flow.synthetic import write_synthetic

SYNTH = {"scan_shape": (6, 8), "detector_shape": (24, 26), "probe_radius_px": 4.0}

#: Python spellings that must not reach a pipeline's author.
PYTHON_ADVICE = ("Calibration(", "with_calibration(", "open()", "=(", "=...", "scan_shape=")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("preflight")
    write_synthetic(d / "data.h5", format="hdf5", **SYNTH)  # type: ignore[arg-type]
    frames = np.load(write_synthetic(d / "data.npy", **SYNTH))  # type: ignore[arg-type]
    np.save(d / "flat.npy", frames.reshape(48, 24, 26))
    np.save(d / "mask.npy", np.ones((5, 5), dtype=bool))
    return d


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a cluster is started, a scheduler contacted or a frame read."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a cluster was started or data were read before the error")

    monkeypatch.setattr(cli, "_start_client", refuse)
    monkeypatch.setattr(quantem_flow.graphs, "embedded_client", refuse)
    monkeypatch.setattr(quantem_flow.graphs, "compute", refuse)
    for cls in (NpySource, Hdf5Source):
        monkeypatch.setattr(cls, "read_frames", refuse)
    monkeypatch.setattr(Dataset4D, "load_block", refuse)


BASE: dict[str, Any] = {
    "version": 1,
    "input": {"path": "data.h5"},
    "outputs": {"bf": {"op": "virtual_bf"}},
}
CAL = {"detector_sampling": [1, 1], "detector_units": "mrad", "scan_sampling": 0.5}

# (name, changes to BASE, text the one-line error must contain)
CASES: list[tuple[str, dict[str, Any], str]] = [
    (
        "mrad_uncalibrated",
        {"outputs": {"adf": {"op": "virtual_adf", "inner": 20, "outer": 60, "units": "mrad"}}},
        "input.calibration: {detector_sampling: ..., detector_units: mrad}",
    ),
    (
        "inverse_angstrom_uncalibrated",
        {"outputs": {"com": {"op": "center_of_mass", "units": "1/Å"}}},
        "outputs.com: a detector size in '1/Å'",
    ),
    ("missing_input", {"input": {"path": "nowhere.h5"}}, "input.path: input file"),
    (
        "no_scan_shape",
        {"input": {"path": "flat.npy"}},
        "Set input.options.scan_shape: [rows, cols]",
    ),
    (
        "bad_scan_shape",
        {"input": {"path": "flat.npy", "options": {"scan_shape": [5, 5]}}},
        "input.options.scan_shape: scan shape (5, 5) needs 25 frames",
    ),
    (
        "scan_shape_type",
        {"input": {"path": "flat.npy", "options": {"scan_shape": [5, "x"]}}},
        "input.options.scan_shape",
    ),
    (
        "unknown_option",
        {"input": {"path": "data.h5", "format": "hdf5", "options": {"array_path": "/a"}}},
        "input.options (format hdf5): unknown key 'array_path'",
    ),
    (
        "missing_dataset_path",
        {"input": {"path": "data.h5", "options": {"dataset_path": "/nope"}}},
        "input.options.dataset_path: dataset_path '/nope' does not exist",
    ),
    (
        "bad_calibration_unit",
        {"input": {"path": "data.h5", "calibration": {"detector_units": "furlong"}}},
        "input.calibration: unknown detector unit 'furlong'",
    ),
    ("unknown_op", {"outputs": {"x": {"op": "virtual_bff"}}}, "outputs.x.op: unknown op"),
    (
        "unknown_parameter",
        {"outputs": {"x": {"op": "virtual_bf", "radus": 3}}},
        "outputs.x: unknown key 'radus'",
    ),
    (
        "negative_radius",
        {"outputs": {"x": {"op": "virtual_adf", "inner": -2}}},
        "outputs.x.inner must be >= 0",
    ),
    (
        "crop_outside",
        {"transforms": [{"crop_scan": [0, 99, 0, 4]}]},
        "transforms[0].crop_scan: scan region",
    ),
    ("bin_zero", {"transforms": [{"bin_detector": 0}]}, "transforms[0].bin_detector"),
    (
        "center_calibration_without_origin",
        {"outputs": {"com": {"op": "center_of_mass", "center": "calibration"}}},
        "set outputs.com.center: [row, col] in px",
    ),
    (
        "mask_missing",
        {"outputs": {"m": {"op": "virtual_mask", "mask": "absent.npy"}}},
        "outputs.m.mask",
    ),
    (
        "mask_shape",
        {"outputs": {"m": {"op": "virtual_mask", "mask": "mask.npy"}}},
        "outputs.m.mask shape (5, 5) does not match the detector shape (24, 26)",
    ),
    (
        "ssb_scan_uncalibrated",
        {"outputs": {"s": {"op": "ssb", "voltage_kV": 300, "semiangle_mrad": 20}}},
        "Set outputs.s.scan_step_A: [row, col] in Å, or open the data with "
        "input.calibration: {scan_sampling: ..., scan_units: Å}",
    ),
    (
        "ssb_voltage",
        {
            "input": {"path": "data.h5", "calibration": CAL},
            "outputs": {"s": {"op": "ssb", "voltage_kV": -3, "semiangle_mrad": 20}},
        },
        "outputs.s.voltage_kV must be > 0",
    ),
    (
        "ssb_threshold",
        {
            "input": {"path": "data.h5", "calibration": CAL},
            "outputs": {
                "s": {
                    "op": "ssb",
                    "voltage_kV": 300,
                    "semiangle_mrad": 20,
                    "scan_step_A": 0.5,
                    "bf_threshold": 3,
                }
            },
        },
        "outputs.s.bf_threshold must be in (0, 1)",
    ),
    (
        "implausible_radius",
        {"outputs": {"x": {"op": "virtual_bf", "radius": 500, "center": [12, 13]}}},
        "outputs.x.allow_implausible: true",
    ),
    (
        "outputs_exist",
        {"save": {"results": "existing.h5"}},
        "set save.overwrite: true in the pipeline, pass --overwrite",
    ),
]


@pytest.mark.parametrize(("name", "changes", "expected"), CASES, ids=[c[0] for c in CASES])
def test_run_fails_before_any_cluster_in_yaml_terms(
    name: str,
    changes: dict[str, Any],
    expected: str,
    data: Path,
    tmp_path: Path,
    no_cluster: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for f in ("data.h5", "flat.npy", "mask.npy"):
        (tmp_path / f).symlink_to(data / f)
    (tmp_path / "existing.h5").write_bytes(b"not ours")
    doc = copy.deepcopy(BASE)
    doc.update(copy.deepcopy(changes))
    yml = tmp_path / f"{name}.yaml"
    yml.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    assert cli.main(["run", str(yml), "--no-figures"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"quantem-flow run: error: pipeline {yml}: "), err
    assert expected in err, err
    for python in PYTHON_ADVICE:
        assert python not in err, (python, err)


def test_outputs_exist_is_checked_before_the_input_is_opened(
    data: Path, tmp_path: Path, no_cluster: None
) -> None:
    (tmp_path / "results.h5").write_bytes(b"")
    doc = {**BASE, "input": {"path": str(data / "data.h5")}, "save": {"results": "results.h5"}}
    with pytest.raises(ParameterError, match=r"already exist.*--output-dir DIR"):
        prepare_pipeline(doc | {}, output_dir=tmp_path)


def test_prepare_builds_everything_without_reading_frames(data: Path, no_cluster: None) -> None:
    doc = {
        **BASE,
        "input": {"path": str(data / "data.h5"), "calibration": CAL},
        "outputs": {
            "bf": {"op": "virtual_bf"},
            "adf": {"op": "virtual_adf", "inner": 6, "outer": 11, "units": "mrad"},
            "com": {"op": "center_of_mass"},
            "phase": {"op": "idpc", "input": "com"},
            "ssb": {"op": "ssb", "voltage_kV": 300, "semiangle_mrad": 5, "scan_step_A": 0.5},
        },
    }
    prepared = prepare_pipeline(doc)
    assert isinstance(prepared, PreparedRun)
    assert list(prepared.lazy) == ["bf", "adf", "com", "phase", "ssb"]
    assert prepared.dataset.shape == (6, 8, 24, 26)
    with pytest.raises(ParameterError, match="already given to prepare_pipeline"):
        run_pipeline(prepared, overwrite=True)


def test_errors_while_computing_name_the_pipeline_and_keys(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise CalibrationError(
            "center_of_mass: the detector origin is unknown; pass center=(row, col) in px, "
            "or set Calibration(detector_origin=...)"
        )

    monkeypatch.setattr(quantem_flow.graphs, "compute", fail)
    doc = {
        **BASE,
        "input": {"path": str(data / "data.h5")},
        "outputs": {"bf": {"op": "virtual_bf"}, "c": {"op": "center_of_mass"}},
    }
    with pytest.raises(CalibrationError) as info:
        run_pipeline(doc, client="synchronous")
    text = str(info.value)
    assert text.startswith("pipeline <mapping>: outputs.c: the detector origin"), text
    assert "set outputs.c.center: [row, col] in px" in text
    assert "input.calibration.detector_origin" in text and "Calibration(" not in text


@pytest.mark.parametrize(
    ("message", "output", "expected"),
    [
        (
            "give Calibration(detector_sampling=..., detector_units='mrad') to open() or "
            "ds.with_calibration(...), or give sizes in 'px'",
            None,
            "give input.calibration: {detector_sampling: ..., detector_units: mrad} in the "
            "pipeline, or give sizes in 'px'",
        ),
        (
            "set Calibration(accelerating_voltage_kV=...)",
            None,
            "set input.calibration.accelerating_voltage_kV",
        ),
        (
            "Pass scan_shape=(rows, cols), or pass scan_shape='square'",
            None,
            "Set input.options.scan_shape: [rows, cols], or set input.options.scan_shape: square",
        ),
        (
            "pass overwrite=True to replace it",
            None,
            "set save.overwrite: true (or --overwrite) to replace it",
        ),
        ("pass rotation_deg= to override", "d", "set outputs.d.rotation_deg to override"),
        ("inner must be >= 0, got -2", "a", "outputs.a.inner must be >= 0, got -2"),
        ("use ds.bin_detector(2) first", None, "use transforms: [{bin_detector: [2]}] first"),
        ("a message without advice", "a", "a message without advice"),
    ],
)
def test_yaml_terms(message: str, output: str | None, expected: str) -> None:
    pipe = load_pipeline(
        {
            **BASE,
            "outputs": {"a": {"op": "virtual_adf"}, "d": {"op": "dpc"}},
        }
    )
    assert yaml_terms(message, pipe, output=output) == expected


def test_scan_shape_error_keeps_its_class(data: Path) -> None:
    pipe = load_pipeline({**BASE, "input": {"path": str(data / "flat.npy")}})
    with pytest.raises(ScanShapeError, match=r"input\.options\.scan_shape"):
        pipe.open()
