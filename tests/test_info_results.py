"""`quantem-flow info` recognises a results file; qf.open points to qf.load_results."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.cli import main
from quantem_flow.errors import FormatError
from quantem_flow.io.results_store import describe_results, is_results_store
from tests.conftest import probe_data


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("results")
    data = probe_data(np.random.default_rng(5), scan=(5, 6))
    np.save(d / "input.npy", data)
    ds = qf.open(d / "input.npy")
    results = qf.compute(
        qf.virtual_bf(ds), qf.center_of_mass(ds), qf.mean_diffraction(ds), client="synchronous"
    )
    named = dict(zip(("bf", "com", "mean"), results, strict=True))
    out = {"input": d / "input.npy"}
    for suffix in ("h5", "zarr"):
        out[suffix] = qf.save_results(named, d / f"results.{suffix}")
    return out


@pytest.mark.parametrize("kind", ["h5", "zarr"])
def test_info_describes_the_results(
    saved: dict[str, Path], kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = saved[kind]
    assert is_results_store(path) and not is_results_store(saved["input"])
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "quantem-flow results" in out and "not a 4D-STEM input" in out
    for line in (
        "bf             ScanImage         5 x 6",
        "com            VectorField       2 x 5 x 6",
    ):
        assert line in out, out
    assert "mean           DiffractionImage  20 x 26" in out
    source = qf.open(saved["input"]).source.identity.header_sha256
    assert source[:16] in out
    assert f"qf.load_results({str(path)!r})" in out
    assert main(["info", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in doc["results"]] == ["bf", "com", "mean"]
    assert doc["results"][0]["units"] == "counts"
    assert doc["results"][2]["axes"] == ["k_row (px)", "k_col (px)"]
    assert doc["results"][1]["source"]["header_sha256"] == source
    assert doc == describe_results(path)


def test_open_on_a_results_file_points_to_load_results(saved: dict[str, Path]) -> None:
    with pytest.raises(FormatError, match=r"qf\.load_results") as err:
        qf.open(saved["h5"])
    assert "not a 4D-STEM input" in str(err.value)
    loaded = qf.load_results(saved["h5"])
    assert list(loaded) == ["bf", "com", "mean"]


def test_describe_refuses_other_files(saved: dict[str, Path]) -> None:
    with pytest.raises(FormatError):
        describe_results(saved["input"])
