"""Overwrite safety (issue 11, item 3).

``--overwrite`` / ``overwrite=True`` never replaces the input a result came
from, and only replaces files quantem-flow wrote, recognised by its own
metadata; anything else is refused with the path and the reason.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.cli import main
from quantem_flow.errors import OverwriteError
from quantem_flow.io.results_store import check_replaceable
from quantem_flow.pipeline import load_pipeline, run_pipeline


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def h5_input(tmp_path: Path) -> Path:
    data = np.random.default_rng(1).poisson(4, size=(6, 5, 16, 16)).astype(np.uint16)
    path = tmp_path / "input.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=data)
    return path


def _spec(save: dict[str, Any], path: str = "input.h5") -> dict[str, Any]:
    return {
        "version": 1,
        "input": {"path": path, "options": {"dataset_path": "/data"}},
        "outputs": {"bf": {"op": "virtual_bf"}},
        "save": save,
    }


def test_a_pipeline_never_overwrites_its_own_input(h5_input: Path) -> None:
    before = _digest(h5_input)
    pipe = load_pipeline(
        _spec({"results": "input.h5", "overwrite": True}), base_dir=h5_input.parent
    )
    with pytest.raises(OverwriteError, match=r"input.h5.*input .*never overwritten"):
        run_pipeline(pipe, client="synchronous")
    assert _digest(h5_input) == before


def test_cli_run_overwrite_refuses_the_input(
    h5_input: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    before = _digest(h5_input)
    yml = h5_input.parent / "p.yaml"
    yml.write_text(yaml.safe_dump(_spec({"results": "input.h5"})))
    code = main(["run", str(yml), "--overwrite", "--no-figures"])
    assert code != 0
    err = capsys.readouterr().err
    assert "input.h5" in err and "never overwritten" in err
    assert _digest(h5_input) == before


def test_json_save_does_not_replace_an_unrelated_text_file(h5_input: Path) -> None:
    notes = h5_input.parent / "notes.json"
    notes.write_text("my lab notes, not JSON at all\n")
    pipe = load_pipeline(_spec({"json": "notes.json", "overwrite": True}), base_dir=h5_input.parent)
    with pytest.raises(OverwriteError, match=r"notes.json.*not a file quantem-flow wrote"):
        run_pipeline(pipe, client="synchronous")
    assert notes.read_text() == "my lab notes, not JSON at all\n"


def test_save_results_replaces_only_its_own_files(h5_input: Path, tmp_path: Path) -> None:
    (bf,) = qf.compute(qf.virtual_bf(qf.open(h5_input, dataset_path="/data")), client="synchronous")
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = np.arange(3)
    before = _digest(foreign)
    with pytest.raises(OverwriteError, match=r"foreign.h5.*HDF5 file without"):
        qf.save_results({"bf": bf}, foreign, overwrite=True)
    assert _digest(foreign) == before
    # the input the result was computed from, named in its provenance
    with pytest.raises(OverwriteError, match="never overwritten"):
        qf.save_results({"bf": bf}, h5_input, overwrite=True)
    ours = tmp_path / "ours.h5"
    qf.save_results({"bf": bf}, ours)
    qf.save_results({"bf": bf}, ours, overwrite=True)  # our own file: replaced
    assert list(qf.load_results(ours)) == ["bf"]
    # JSON export: its own file is replaced, a foreign one is not
    own_json = tmp_path / "r.json"
    qf.results_to_json({"bf": bf}, own_json)
    qf.results_to_json({"bf": bf}, own_json)
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(OverwriteError):
        qf.results_to_json({"bf": bf}, tmp_path / "other.json")


def test_png_overwrite_only_replaces_our_pngs(h5_input: Path, tmp_path: Path) -> None:
    from PIL import Image

    from quantem_flow.operators.display import save_png

    (bf,) = qf.compute(qf.virtual_bf(qf.open(h5_input, dataset_path="/data")), client="synchronous")
    photo = tmp_path / "photo.png"
    Image.new("L", (4, 4)).save(photo)
    before = _digest(photo)
    with pytest.raises(OverwriteError, match="did not write"):
        save_png(bf, photo, overwrite=True)
    assert _digest(photo) == before
    ours = tmp_path / "bf.png"
    save_png(bf, ours)
    save_png(bf, ours, overwrite=True)


def test_check_replaceable_refuses_symlinks_and_nested_inputs(tmp_path: Path) -> None:
    target = tmp_path / "link.h5"
    target.symlink_to(tmp_path / "elsewhere.h5")
    with pytest.raises(OverwriteError, match="symbolic link"):
        check_replaceable(target)
    store = tmp_path / "in.zarr"
    store.mkdir()
    with pytest.raises(OverwriteError, match="lies inside"):
        check_replaceable(store / "results.h5", protected=[store])
    check_replaceable(tmp_path / "new.h5", protected=[store])  # a new, unrelated path is fine
