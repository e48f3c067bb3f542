"""convert and info speak command-line terms (issue 12, item 7).

``convert`` chooses its output by name or refuses, reports the sizes and says
when the output is larger than the input; ``info`` advises flags, not Python
keywords; a 4-D file's scan shape comes from the file, not "given".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
import quantem_flow.bench
import quantem_flow.graphs
from quantem_flow.cli import cli_terms, main
from quantem_flow.convert import convert, output_kind
from quantem_flow.errors import ParameterError
from quantem_flow.synthetic import write_synthetic

SYNTH = {"scan_shape": (6, 8), "detector_shape": (24, 26), "probe_radius_px": 4.0}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli_convert")
    h5 = write_synthetic(d / "data.h5", format="hdf5", **SYNTH)  # type: ignore[arg-type]
    npy = write_synthetic(d / "data.npy", **SYNTH)  # type: ignore[arg-type]
    flat = d / "flat.npy"
    np.save(flat, np.load(npy).reshape(48, 24, 26))
    square = d / "square.npy"
    np.save(square, np.load(npy).reshape(48, 24, 26)[:36])
    return {"h5": h5, "npy": npy, "flat": flat, "square": square}


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("name", "to", "expected"),
    [
        ("out.h5", None, "--to counted"),
        ("out.hdf5", None, "name the output .zarr"),
        ("out", None, "name it .zarr"),
        ("out.h5", "zarr", "named like an HDF5 file"),
        ("out.zarr", "counted", "named like a Zarr store"),
    ],
)
def test_convert_refuses_a_name_that_does_not_say_the_kind(
    name: str,
    to: str | None,
    expected: str,
    files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / name
    argv = ["convert", str(files["h5"]), str(out)] + ([] if to is None else ["--to", to])
    assert main(argv) == 2
    err = _error(capsys)
    assert expected in err, err
    assert "to=" not in err, err  # command-line flags, not Python keywords
    assert not out.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(ParameterError):
        convert(files["h5"], out, to=to)


def test_output_kind_by_name(tmp_path: Path) -> None:
    assert output_kind(tmp_path / "a.zarr") == "zarr"
    assert output_kind(tmp_path / "a.ZARR/") == "zarr"
    assert output_kind(tmp_path) == "zarr"  # an existing folder is a store
    assert output_kind(tmp_path / "a.h5", to="counted") == "counted"
    assert output_kind(tmp_path / "a", to="zarr") == "zarr"


def test_convert_zarr_by_suffix_reports_sizes(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.zarr"
    assert main(["convert", str(files["h5"]), str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.is_dir() and (out / "zarr.json").is_file()
    np.testing.assert_array_equal(
        qf.open(out).load_block((0, 6)), qf.open(files["h5"]).load_block((0, 6))
    )
    assert "on disk" in printed and "written" in printed and "x the input" in printed


def test_counted_larger_than_the_input_says_so(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "counted.h5"
    assert main(["convert", str(files["h5"]), str(out), "--to", "counted"]) == 0
    printed = capsys.readouterr().out
    size_in, size_out = files["h5"].stat().st_size, out.stat().st_size
    assert size_out > 2 * size_in  # dense synthetic frames: thousands of counts each
    note = next(line for line in printed.splitlines() if line.startswith("note:"))
    assert f"{size_out / size_in:.1f}x the input" in note
    assert "counts per frame" in note and "OUTPUT.zarr" in note
    # a smaller output gets no note
    assert main(["convert", str(files["h5"]), str(tmp_path / "small.zarr")]) == 0
    assert "note:" not in capsys.readouterr().out


def test_info_advises_flags(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(files["flat"])]) == 2
    err = _error(capsys)
    assert "--scan-shape ROWS COLS" in err and "--scan-shape square" in err, err
    assert "scan_shape=" not in err
    assert main(["info", str(files["flat"]), "--scan-shape", "5", "5"]) == 2
    assert "scan shape (5, 5) needs 25 frames" in _error(capsys)
    assert main(["info", str(files["square"]), "--scan-shape", "square", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["shape"][:2] == [6, 6] and "square" in doc["metadata"]["scan_shape_from"]
    assert main(["info", str(files["flat"]), "--scan-shape", "6"]) == 2
    assert "--scan-shape takes two integers" in _error(capsys)


@pytest.mark.parametrize("kind", ["h5", "npy"])
def test_info_on_a_4d_file_says_the_scan_shape_is_the_files(
    kind: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["info", str(files[kind]), "--json"]) == 0
    meta = json.loads(capsys.readouterr().out)["metadata"]
    assert meta["scan_shape_from"] == "the file (a 4-D " + (
        "dataset)" if kind == "h5" else "array)"
    )
    assert main(["info", str(files["flat"]), "--scan-shape", "6", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["metadata"]["scan_shape_from"] == "given"


def test_cli_terms() -> None:
    assert cli_terms("pass scan_shape=(rows, cols)") == "pass --scan-shape ROWS COLS"
    assert cli_terms("pass dataset_path= one of them") == "pass --dataset-path one of them"
    assert cli_terms("pass format='raw' and overwrite=True") == "pass --format raw and --overwrite"
    assert cli_terms("after frame_offset=0") == "after frame_offset=0"


def test_bench_prints_the_dashboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class FakeClient:
        def scheduler_info(self) -> dict[str, Any]:
            return {"address": "tcp://127.0.0.1:4000", "services": {"dashboard": 4321}}

    report = tmp_path / "report.md"
    report.write_text("# report\n")
    monkeypatch.setattr(quantem_flow.graphs, "embedded_client", lambda: FakeClient())
    monkeypatch.setattr(quantem_flow.bench, "run_bench", lambda *a, **k: report)
    monkeypatch.setattr(quantem_flow.graphs.cluster, "close_embedded_cluster", lambda: None)
    assert main(["bench", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "dashboard: http://127.0.0.1:4321/quantem-flow " in out
    assert "http://127.0.0.1:4321/status" in out
