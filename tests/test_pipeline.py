from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from PIL import Image

import quantem_flow as qf
import quantem_flow.graphs
from quantem_flow.errors import (
    CalibrationError,
    FormatError,
    ParameterError,
    SourceNotFoundError,
)
from quantem_flow.pipeline import (
    OPERATIONS,
    Pipeline,
    example_pipeline,
    load_pipeline,
    run_pipeline,
)
from quantem_flow.results import (
    ComplexObject,
    DiffractionImage,
    PhaseImage,
    ScanImage,
    VectorField,
)
from quantem_flow.synthetic import synthetic_dataset, synthetic_truth, write_synthetic

SYNTH = {"scan_shape": (12, 16), "detector_shape": (32, 36), "probe_radius_px": 5.0, "seed": 1}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pipeline_data")
    data, _ = synthetic_dataset(**SYNTH)  # type: ignore[arg-type]
    np.save(d / "data.npy", data)
    mask = np.zeros(SYNTH["detector_shape"], dtype=bool)  # type: ignore[call-overload]
    mask[10:20, 12:24] = True
    np.save(d / "mask.npy", mask)
    return d


@pytest.fixture
def base(data_dir: Path, tmp_path: Path) -> Path:
    for name in ("data.npy", "mask.npy"):
        (tmp_path / name).symlink_to(data_dir / name)
    return tmp_path


def spec(**changes: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "version": 1,
        "input": {"path": "data.npy", "chunk_rows": 4},
        "outputs": {"bf": {"op": "virtual_bf"}},
    }
    s.update(changes)
    return s


ALL_OUTPUTS: dict[str, Any] = {
    "bf": {"op": "virtual_bf"},
    "bf3": {"op": "virtual_bf", "radius": 3, "units": "px", "center": [15.0, 19.0]},
    "abf": {"op": "virtual_abf"},
    "adf": {"op": "virtual_adf", "inner": 8, "outer": float("inf")},
    "ring": {"op": "virtual_annular", "inner": 2, "outer": 6, "center": "probe"},
    "masked": {"op": "virtual_mask", "mask": "mask.npy"},
    "com": {"op": "center_of_mass", "mask_radius": 12, "center": "auto"},
    "dpc": {"op": "dpc", "input": "com", "rotation_deg": 0, "transpose": False},
    "phase": {"op": "idpc", "input": "dpc", "highpass": 0.0},
    "phase_default": {"op": "idpc", "display": {"gamma": 0.8}},
    "dpc_default": {"op": "dpc", "subtract": "none"},
    "mean": {"op": "mean_diffraction"},
    "max": {"op": "max_diffraction"},
    "sum": {"op": "sum_diffraction", "display": {"log": False}},
    "ptycho": {"op": "ssb", "voltage_kV": 300, "semiangle_mrad": 20.0, "scan_step_A": 0.5},
}


def test_every_op_in_one_compute(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(o["op"] for o in ALL_OUTPUTS.values()) == set(OPERATIONS)
    calls: list[int] = []
    real = quantem_flow.graphs.compute

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(len(args))
        return real(*args, **kwargs)

    monkeypatch.setattr(quantem_flow.graphs, "compute", counting)
    pipe = load_pipeline(spec(outputs=ALL_OUTPUTS), base_dir=base)
    results = run_pipeline(pipe, client="synchronous")
    assert calls == [len(ALL_OUTPUTS)]  # ONE compute call for every output
    assert list(results) == list(ALL_OUTPUTS)
    kinds = {
        "bf": ScanImage,
        "bf3": ScanImage,
        "abf": ScanImage,
        "adf": ScanImage,
        "ring": ScanImage,
        "masked": ScanImage,
        "com": VectorField,
        "dpc": VectorField,
        "phase": PhaseImage,
        "phase_default": PhaseImage,
        "dpc_default": VectorField,
        "mean": DiffractionImage,
        "max": DiffractionImage,
        "sum": DiffractionImage,
        "ptycho": ComplexObject,
    }
    for name, result in results.items():
        assert isinstance(result, kinds[name]), name
        assert result.name == name
        assert any("pipeline <mapping>" in n and repr(name) in n for n in result.provenance.notes)
    # one pass: every chunk operator ran over the same single read of the data
    execution = results["bf"].provenance.execution
    assert execution["read_once"] is True
    assert execution["weights_in_pass"] >= 8
    assert results["adf"].provenance.execution["chunks"] == execution["chunks"]
    data = np.load(base / "data.npy")
    mask = np.load(base / "mask.npy")
    np.testing.assert_array_equal(results["masked"].data, (data * mask).sum(axis=(2, 3)))
    np.testing.assert_array_equal(results["sum"].data, data.sum(axis=(0, 1)))
    assert results["bf3"].provenance.parameters["center_px"] == [15.0, 19.0]
    assert results["dpc"].provenance.parameters["rotation_deg"] == 0
    assert results["phase"].provenance.parameters["rotation"].startswith("already rotated")
    truth = synthetic_truth(**SYNTH)  # type: ignore[arg-type]
    r = np.corrcoef(results["phase_default"].data.ravel(), truth.phase.ravel())[0, 1]
    assert r > 0.7


def test_yaml_file_relative_paths_and_saved_files(base: Path) -> None:
    doc = spec(
        transforms=[
            {"crop_scan": [1, 11, 2, 14]},
            {"crop_detector": [0, 32, 0, 34]},
            {"bin_detector": 2},
        ],
        outputs={
            "bf": {"op": "virtual_bf"},
            "com": {"op": "center_of_mass"},
            "phase": {"op": "idpc", "input": "com"},
            "mean": {"op": "mean_diffraction"},
        },
        save={"results": "out/results.h5", "png": "out/images", "json": "out/prov.json"},
    )
    sub = base / "pipelines"
    sub.mkdir()
    doc["input"]["path"] = "../data.npy"  # relative to the YAML file's folder
    yml = sub / "p.yaml"
    yml.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    pipe = load_pipeline(yml)
    assert pipe.origin == str(yml.resolve())
    assert pipe.input.path == sub.resolve() / "../data.npy"
    results = run_pipeline(str(yml), client="synchronous", progress=False)
    assert results["bf"].shape == (10, 12)
    assert results["mean"].shape == (16, 17)
    assert [t["transform"] for t in results["bf"].provenance.transforms] == [
        "scan_region",
        "detector_region",
        "bin_detector",
    ]
    out = sub / "out"
    loaded = qf.load_results(out / "results.h5")
    assert list(loaded) == ["bf", "com", "phase", "mean"]
    np.testing.assert_array_equal(loaded["bf"].data, results["bf"].data)
    for name, size in (
        ("bf", (12, 10)),
        ("com", (12, 10)),
        ("phase", (12, 10)),
        ("mean", (17, 16)),
    ):
        with Image.open(out / "images" / f"{name}.png") as im:
            assert im.size == size
    prov = json.loads((out / "prov.json").read_text(encoding="utf-8"))
    assert prov["pipeline"]["origin"] == str(yml.resolve())
    assert prov["pipeline"]["spec"]["transforms"][2] == {"bin_detector": 2}
    assert set(prov["results"]) == {"bf", "com", "phase", "mean"}
    assert prov["files"]["results"] == str(out / "results.h5")
    # outputs exist now: a second run refuses before computing anything
    with pytest.raises(ParameterError, match="already exist"):
        run_pipeline(pipe, client="synchronous")
    run_pipeline(pipe, client="synchronous", overwrite=True)


def test_output_dir_and_default_save(base: Path, tmp_path: Path) -> None:
    pipe = load_pipeline(spec(), base_dir=base)
    assert pipe.save is None
    none = pipe.save_targets()
    assert none.results is None and none.json is None and not none.png_files
    out = tmp_path / "elsewhere"
    run_pipeline(pipe, client="synchronous", output_dir=out)
    assert (out / "results.h5").is_file()
    assert (out / "provenance.json").is_file()
    assert (out / "images" / "bf.png").is_file()
    pipe2 = load_pipeline(spec(save={"results": "r.zarr", "overwrite": True}), base_dir=base)
    out2 = tmp_path / "o2"
    targets = pipe2.save_targets(out2)
    assert targets.results == out2.absolute() / "r.zarr" and targets.png_dir is None
    run_pipeline(pipe2, client="synchronous", output_dir=out2)
    run_pipeline(pipe2, client="synchronous", output_dir=out2)  # save.overwrite: true
    assert list(qf.load_results(out2 / "r.zarr")) == ["bf"]


def test_reader_options_and_calibration(base: Path) -> None:
    data = np.load(base / "data.npy")
    np.save(base / "flat.npy", data.reshape(-1, *data.shape[2:]))
    cal = {
        "scan_sampling": [0.5, 0.5],
        "scan_units": "Å",
        "detector_sampling": [0.8, 0.8],
        "detector_units": "mrad",
        "accelerating_voltage_kV": 300,
    }
    pipe = load_pipeline(
        spec(
            input={
                "path": "flat.npy",
                "format": "npy",
                "options": {"scan_shape": [12, 16]},
                "calibration": cal,
                "chunk_mib": 0.1,
            },
            outputs={
                "adf": {"op": "virtual_adf", "inner": 6, "outer": 14, "units": "mrad"},
                "phase": {"op": "idpc"},
            },
        ),
        base_dir=base,
    )
    adf, phase = run_pipeline(pipe, client="synchronous").values()
    assert adf.provenance.parameters["radii_units"] == "mrad"
    assert adf.axes[0].units == "Å"
    assert phase.units == "rad"


def test_mrad_on_uncalibrated_detector(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_compute(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("compute must not run")

    monkeypatch.setattr(quantem_flow.graphs, "compute", no_compute)
    pipe = load_pipeline(
        spec(outputs={"adf": {"op": "virtual_adf", "inner": 20, "outer": 60, "units": "mrad"}}),
        base_dir=base,
    )
    with pytest.raises(CalibrationError, match=r"outputs\.adf.*mrad.*uncalibrated"):
        run_pipeline(pipe, client="synchronous")
    pipe = load_pipeline(
        spec(outputs={"com": {"op": "center_of_mass", "units": "1/Å"}}), base_dir=base
    )
    with pytest.raises(CalibrationError, match=r"outputs\.com"):
        run_pipeline(pipe, client="synchronous")


def test_missing_input_file(tmp_path: Path) -> None:
    pipe = load_pipeline(spec(input={"path": "nowhere/data.h5"}), base_dir=tmp_path)
    with pytest.raises(SourceNotFoundError, match=r"nowhere/data\.h5"):
        run_pipeline(pipe, client="synchronous")


def test_missing_mask_file(base: Path) -> None:
    pipe = load_pipeline(
        spec(outputs={"m": {"op": "virtual_mask", "mask": "no_mask.npy"}}), base_dir=base
    )
    with pytest.raises(SourceNotFoundError, match=r"no_mask\.npy"):
        run_pipeline(pipe, client="synchronous")


def test_missing_or_bad_yaml_file(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match=r"absent\.yaml"):
        load_pipeline(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ninput: {path: [unclosed\n", encoding="utf-8")
    with pytest.raises(FormatError, match="not valid YAML"):
        load_pipeline(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n", encoding="utf-8")
    with pytest.raises(ParameterError, match="top level"):
        load_pipeline(listing)


def _with(path: str, value: Any) -> dict[str, Any]:
    """Return the base spec with ``value`` set at the dotted ``path``."""
    s = copy.deepcopy(spec(save={"results": "r.h5"}))
    keys = path.split(".")
    node = s
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    return s


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        (_with("colour", 1), "'colour'"),
        (_with("input.pth", "x"), "'pth'"),
        (_with("input.format", "tiff"), "'tiff'"),
        (_with("input.chunk_mib", "big"), "input.chunk_mib"),
        (_with("input.chunk_rows", 0), "input.chunk_rows"),
        (_with("input.calibration", {"scan_step": 1}), "scan_step"),
        (_with("input.options", [1]), "input.options"),
        (_with("outputs.bf", {"op": "virtual_bf", "radus": 3}), "'radus'"),
        (_with("outputs.bf", {"op": "virtual_bf", "radius": "big"}), "outputs.bf.radius"),
        (_with("outputs.bf", {"op": "virtual_bf", "radius": True}), "outputs.bf.radius"),
        (_with("outputs.bf", {"op": "virtual_bf", "center": [1]}), "outputs.bf.center"),
        (_with("outputs.bf", {"op": "virtual_bright"}), "'virtual_bright'"),
        (_with("outputs.bf", {"radius": 3}), "'op'"),
        (_with("outputs.bf", {"op": "virtual_annular", "inner": 1}), "'outer'"),
        (_with("outputs.bf", {"op": "virtual_mask"}), "'mask'"),
        (_with("outputs.bf", {"op": "idpc", "input": "nothing"}), "'nothing'"),
        (_with("outputs.bf", {"op": "idpc", "transpose": "yes"}), "outputs.bf.transpose"),
        (_with("outputs.d", {"op": "dpc", "input": "bf"}), "virtual_bf"),
        (_with("outputs.bf", {"op": "idpc", "input": "bf"}), "is idpc"),
        (_with("outputs.bf", {"op": "virtual_bf", "display": {"gama": 1}}), "'gama'"),
        (_with("outputs.bf", {"op": "virtual_bf", "display": {"log": "yes"}}), "display.log"),
        (_with("outputs.bf", "virtual_bf"), "outputs.bf"),
        (_with("outputs.a/b", {"op": "virtual_bf"}), "outputs.a/b"),
        (_with("outputs", {}), "outputs"),
        (_with("transforms", {"crop_scan": [0, 4, 0, 4]}), "transforms"),
        (_with("transforms", [{"crop": [0, 4, 0, 4]}]), "'crop'"),
        (_with("transforms", [{"crop_scan": [0, 4]}]), "transforms[0].crop_scan"),
        (_with("transforms", [{"bin_detector": 2, "crop_scan": [0, 4, 0, 4]}]), "transforms[0]"),
        (_with("save.pngs", "images"), "'pngs'"),
        (_with("save.results", "results.txt"), "save.results"),
        (_with("save.overwrite", "no"), "save.overwrite"),
        (_with("version", 2), "version"),
        ({"input": {"path": "x"}, "outputs": {"bf": {"op": "virtual_bf"}}}, "'version'"),
        ({"version": 1, "outputs": {"bf": {"op": "virtual_bf"}}}, "'input'"),
    ],
)
def test_bad_keys_and_types(doc: dict[str, Any], named: str) -> None:
    with pytest.raises(ParameterError) as info:
        load_pipeline(doc)
    message = str(info.value)
    assert named in message
    assert message.startswith("pipeline <mapping>")


def test_unknown_key_lists_the_allowed_keys() -> None:
    with pytest.raises(ParameterError) as info:
        load_pipeline(_with("outputs.adf", {"op": "virtual_adf", "innr": 20}))
    message = str(info.value)
    assert "'innr'" in message and "outputs.adf" in message
    for key in ("inner", "outer", "units", "center", "display"):
        assert repr(key) in message


def test_bad_values_found_at_build_name_the_output(base: Path) -> None:
    pipe = load_pipeline(spec(outputs={"adf": {"op": "virtual_adf", "inner": -2}}), base_dir=base)
    with pytest.raises(ParameterError, match=r": outputs\.adf\.inner must be >= 0"):
        pipe.build()
    pipe = load_pipeline(spec(transforms=[{"crop_scan": [0, 99, 0, 4]}]), base_dir=base)
    with pytest.raises(qf.errors.ShapeError, match=r"transforms\[0\]\.crop_scan"):
        pipe.open()
    with pytest.raises(ParameterError, match=r"input\.options.*'colour'.*allowed keys"):
        load_pipeline(spec(input={"path": "data.npy", "options": {"colour": 1}}), base_dir=base)


def test_bad_client_address(base: Path) -> None:
    pipe = load_pipeline(spec(), base_dir=base)
    with pytest.raises(ParameterError, match="scheduler address"):
        run_pipeline(pipe, client="localhost")


def test_example_pipelines_run_on_the_demo_data(tmp_path: Path) -> None:
    from quantem_flow.cli import DEMO_SIZES

    write_synthetic(tmp_path / "synthetic_4dstem.h5", format="hdf5", **DEMO_SIZES["small"])
    assert {p.name for p in example_pipeline("demo").parent.glob("*.yaml")} >= {
        "demo.yaml",
        "calibrated.yaml",
    }
    with pytest.raises(ParameterError, match="shipped examples"):
        example_pipeline("nope")
    for name in ("demo", "calibrated"):
        yml = tmp_path / f"{name}.yaml"
        shutil.copy(example_pipeline(name), yml)
        pipe = load_pipeline(yml)
        assert isinstance(pipe, Pipeline)
        results = run_pipeline(pipe, client="synchronous")
        targets = pipe.save_targets()
        assert targets.results is not None and targets.results.is_file()
        assert all(p.is_file() for p in targets.png_files.values())
        if name == "calibrated":
            assert results["phase"].units == "rad"
            assert results["adf"].provenance.flags["binned"] is True
            assert results["bf"].shape == (40, 60)
        else:  # the demo data carry their calibration: phase in rad, SSB runs
            assert results["idpc"].units == "rad"
            assert results["ssb"].provenance.parameters["scan_step_from"].startswith("calibration")


def test_reference_file_options_are_relative_to_the_pipeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``gain_map``/``dark_map`` (options annotated as paths) resolve like ``input.path``."""
    from tests.io.writers_k2is import write_k2is

    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(5)
    frames = rng.integers(0, 4096, size=(6, 6, 16)).astype(np.uint16)
    write_k2is(data, frames, block=(3, 2))
    gain = rng.uniform(0.9, 1.1, size=(6, 16)).astype(np.float32)
    np.save(data / "gain.npy", gain)
    sub = tmp_path / "pipelines"
    sub.mkdir()
    yml = sub / "k2.yaml"
    doc = {
        "version": 1,
        "input": {
            "path": "../data/capture.gtg",
            "options": {
                "scan_shape": [2, 3],
                "corrections": ["gain"],
                "gain_map": "../data/gain.npy",
            },
        },
        "outputs": {"total": {"op": "sum_diffraction"}},
    }
    yml.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    pipe = load_pipeline(yml)
    assert Path(pipe.input.options["gain_map"]).resolve() == data / "gain.npy"
    (total,) = run_pipeline(pipe, client="synchronous").values()
    want = (frames.astype(np.float32) * gain).sum(axis=0, dtype=np.float64)
    np.testing.assert_allclose(np.asarray(total.data), want, rtol=1e-6)


def test_path_options_that_are_not_paths_pass_through(tmp_path: Path) -> None:
    """``info_file: false`` (mrc: ignore the DE info file) is not a path to resolve."""
    doc = {
        "version": 1,
        "input": {"path": "movie.mrc", "format": "mrc", "options": {"info_file": False}},
        "outputs": {"total": {"op": "sum_diffraction"}},
    }
    pipe = load_pipeline(doc, base_dir=tmp_path)
    assert pipe.input.options["info_file"] is False
    doc["input"]["options"] = {"info_file": "notes/movie_info.txt"}
    assert load_pipeline(doc, base_dir=tmp_path).input.options["info_file"] == str(
        tmp_path / "notes/movie_info.txt"
    )
