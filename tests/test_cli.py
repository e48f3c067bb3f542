from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from PIL import Image

import quantem_flow as qf
from quantem_flow.cli import DEMO_SIZES, main
from quantem_flow.dataset import Dataset4D
from quantem_flow.io.hdf5 import Hdf5Source
from quantem_flow.io.npy import NpySource
from quantem_flow.results import ComplexObject, PhaseImage, ScanImage, VectorField
from quantem_flow.synthetic import truth_of, write_synthetic

SYNTH = {"scan_shape": (6, 8), "detector_shape": (24, 26), "probe_radius_px": 4.0}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli_data")
    npy = write_synthetic(d / "data.npy", **SYNTH)  # type: ignore[arg-type]
    h5 = write_synthetic(d / "data.h5", **SYNTH)  # type: ignore[arg-type]
    flat = d / "flat.npy"
    np.save(flat, np.load(npy).reshape(48, 24, 26))
    bad = d / "bad.npy"
    bad.write_bytes(b"this is not a numpy file\n")
    return {"npy": npy, "h5": h5, "flat": flat, "bad": bad, "dir": d}


@pytest.fixture
def no_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("info must not read frames")

    for cls in (NpySource, Hdf5Source):
        monkeypatch.setattr(cls, "read", refuse)
        monkeypatch.setattr(cls, "read_frames", refuse)
    monkeypatch.setattr(Dataset4D, "load_block", refuse)


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == f"quantem-flow {qf.__version__}"
    assert main(["version", "--all"]) == 0
    assert "numpy" in capsys.readouterr().out


def test_python_dash_m() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "quantem_flow", "version"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("quantem-flow ")


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["nonsense"]) == 2
    assert main(["--help"]) == 0
    capsys.readouterr()


def test_info_npy_reads_no_frames(
    files: dict[str, Path], no_reads: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["info", str(files["npy"])]) == 0
    out = capsys.readouterr().out
    assert "(6, 8, 24, 26)" in out
    assert "format:    npy" in out
    assert "uint16" in out
    assert "uncalibrated" in out
    assert "header_sha256" in out


def test_info_hdf5_reads_no_frames(
    files: dict[str, Path], no_reads: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["info", str(files["h5"]), "--dataset-path", "/data", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["shape"] == [6, 8, 24, 26]
    assert doc["format"] == "hdf5"
    assert doc["dtype"] == "uint16"
    assert doc["metadata"]["dataset_path"] == "/data"
    assert doc["calibration"]["detector_units"] == "px"
    assert doc["chunks"]["n_chunks"] >= 1
    # without --dataset-path the only 3-D/4-D dataset is chosen, and that is said
    assert main(["info", str(files["h5"])]) == 0
    out = capsys.readouterr().out
    assert "(6, 8, 24, 26)" in out
    assert "dataset_path /data chosen" in out


def test_info_flat_frames_need_a_scan_shape(
    files: dict[str, Path], no_reads: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["info", str(files["flat"]), "--scan-shape", "6", "8"]) == 0
    assert "(6, 8, 24, 26)" in capsys.readouterr().out
    assert main(["info", str(files["flat"])]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "scan_shape" in line and "48 frames" in line


@pytest.mark.parametrize(
    ("which", "pattern"),
    [("bad", "not a valid .npy"), ("missing", "does not exist")],
)
def test_info_bad_file(
    files: dict[str, Path], which: str, pattern: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = files["bad"] if which == "bad" else files["dir"] / "missing.npy"
    assert main(["info", str(path)]) == 2
    captured = capsys.readouterr()
    line = one_line_error(captured.err)
    assert line.startswith("quantem-flow info: error:")
    assert pattern in line and str(path) in line
    assert captured.out == ""


def test_run_synchronous(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    yml = tmp_path / "p.yaml"
    yml.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "input": {
                    "path": str(files["h5"]),
                    "options": {"dataset_path": "/data"},
                    "chunk_rows": 2,
                },
                "outputs": {
                    "bf": {"op": "virtual_bf"},
                    "com": {"op": "center_of_mass"},
                    "phase": {"op": "idpc", "input": "com"},
                },
            }
        ),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    args = [
        "run",
        str(yml),
        "--scheduler",
        "synchronous",
        "--output-dir",
        str(out),
        "--no-progress",
    ]
    assert main(args) == 0
    stdout = capsys.readouterr().out
    assert "synchronous" in stdout
    for text in ("results.h5", "provenance.json", "bf.png", "PhaseImage"):
        assert text in stdout
    assert list(qf.load_results(out / "results.h5")) == ["bf", "com", "phase"]
    # files exist now: refused in one line, then replaced with --overwrite
    assert main(args) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "already exist" in line and "--overwrite" in line
    assert main([*args, "--overwrite"]) == 0
    capsys.readouterr()
    # without a save section and without --output-dir nothing is written
    assert main(["run", str(yml), "--scheduler", "synchronous"]) == 0
    assert "none written" in capsys.readouterr().out


def test_run_errors_are_one_line(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    yml = tmp_path / "bad.yaml"
    yml.write_text(
        "version: 1\ninput: {path: data.npy}\noutputs:\n  adf: {op: virtual_adf, innr: 3}\n",
        encoding="utf-8",
    )
    assert main(["run", str(yml), "--scheduler", "synchronous"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "'innr'" in line and "allowed keys" in line
    assert main(["run", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml" in one_line_error(capsys.readouterr().err)
    ok = tmp_path / "ok.yaml"
    ok.write_text(
        f"version: 1\ninput: {{path: {files['npy']}}}\noutputs:\n  bf: {{op: virtual_bf}}\n",
        encoding="utf-8",
    )
    assert main(["run", str(ok), "--scheduler", "not-an-address"]) == 2
    assert "scheduler address" in one_line_error(capsys.readouterr().err)


def test_demo_refuses_to_replace_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "results.h5").write_bytes(b"")
    assert main(["demo", "--output-dir", str(tmp_path)]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "--overwrite" in line and "results.h5" in line
    assert not (tmp_path / "synthetic_4dstem.h5").exists()


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    x = a.ravel() - a.mean()
    y = b.ravel() - b.mean()
    return float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum()))


@pytest.mark.cluster
def test_demo_end_to_end_on_the_embedded_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo"
    try:
        assert main(["demo", "--size", "small", "--output-dir", str(out)]) == 0
    finally:
        qf.close_embedded_cluster()
    captured = capsys.readouterr()
    stdout = captured.out
    assert "embedded local cluster at tcp://127.0.0.1:" in stdout
    assert "dashboard: http://127.0.0.1:" in stdout
    assert "chunk" in captured.err  # the progress bar
    data_path = out / "synthetic_4dstem.h5"
    for path in (
        data_path,
        out / "demo.yaml",
        out / "results.h5",
        out / "provenance.json",
        out / "images" / "bf.png",
    ):
        assert str(path) in stdout, path
    R, C = DEMO_SIZES["small"]["scan_shape"]
    for name in ("bf", "adf", "com", "idpc"):
        with Image.open(out / "images" / f"{name}.png") as im:
            assert im.size == (C, R)
            assert im.mode == ("RGB" if name == "com" else "L")
            assert im.text["quantem_flow:name"] == name  # type: ignore[attr-defined]
    results = qf.load_results(out / "results.h5")
    assert isinstance(results["bf"], ScanImage) and results["bf"].shape == (R, C)
    assert isinstance(results["adf"], ScanImage)
    assert isinstance(results["com"], VectorField) and results["com"].shape == (2, R, C)
    phase = results["idpc"]
    assert isinstance(phase, PhaseImage)
    prov = phase.provenance
    assert prov.operator == "idpc"
    assert prov.derived_from and prov.derived_from[0]["operator"] == "center_of_mass"
    assert prov.source["paths"] == [str(data_path)]
    assert "embedded local cluster" in prov.derived_from[0]["execution"]["scheduler"]
    truth = truth_of(**DEMO_SIZES["small"])
    assert _pearson(phase.data, truth.phase) > 0.9
    ssb = results["ssb"]
    assert isinstance(ssb, ComplexObject)
    assert _pearson(ssb.phase, truth.phase) > 0.9  # physically consistent data: SSB works
    assert "SSB phase vs the synthetic truth: Pearson r = " in stdout
    assert ssb.provenance.parameters["quality"]["verdict"] in ("low", "moderate")
    assert results["bf"].axes[0].units == "Å"  # the file's calibration was read
    with Image.open(out / "figures" / "phase_check.png") as im:
        assert im.size[0] > 1000
        assert len(np.unique(np.asarray(im.convert("RGB")).reshape(-1, 3), axis=0)) > 50
    doc = json.loads((out / "provenance.json").read_text(encoding="utf-8"))
    assert set(doc["results"]) >= {"bf", "adf", "com", "idpc"}
    assert doc["pipeline"]["origin"] == str(out / "demo.yaml")
