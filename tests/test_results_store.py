"""Typed results, provenance, and the HDF5 / Zarr / JSON results store."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from quantem_flow.calibration import Axis
from quantem_flow.errors import (
    DtypeError,
    FormatError,
    ParameterError,
    ShapeError,
    SourceNotFoundError,
)
from quantem_flow.io import results_store
from quantem_flow.io.results_store import load_results, results_to_json, save_results
from quantem_flow.provenance import Provenance, array_identity, package_versions
from quantem_flow.results import (
    RESULT_TYPES,
    ComplexObject,
    DiffractionImage,
    PhaseImage,
    Result,
    ScanImage,
    VectorField,
    result_from_parts,
)

FORMATS = {"hdf5": "results.h5", "zarr": "results.zarr"}


# -- fixtures ------------------------------------------------------------------------------
@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()  # fresh data every run


def _prov(operator: str, **extra: Any) -> Provenance:
    return Provenance(
        operator=operator,
        parameters={"inner": 0.0, "outer": 12.5, "units": "mrad", "center": [31.5, 32.0]},
        source={"format": "npy", "path": "/data/scan.npy", "shape": [7, 5, 16, 12]},
        dataset={"shape": [7, 5, 16, 12], "dtype": "uint16"},
        transforms=[{"op": "bin", "factor": [2, 2]}],
        flags={"native": False, "binned": True},
        accumulation_dtype="float64",
        execution={"runtime": "cpu", "chunks": [{"rows": [0, 7], "seconds": 0.01}]},
        notes=["Å units survive", "empty frames set to NaN"],
        timings={"compute": 0.25},
        **extra,
    )


def _scan_axes(shape: tuple[int, int]) -> tuple[Axis, Axis]:
    return (
        Axis("scan_row", shape[0], 0.5, "Å", 0.0),
        Axis("scan_col", shape[1], 0.25, "nm", 1.5),
    )


def _all_results(rng: np.random.Generator) -> dict[str, Result]:
    R, C = (int(v) for v in rng.integers(3, 9, size=2))
    while R == C:
        C = int(rng.integers(3, 9))
    kr, kc = 11, 6
    bf = rng.normal(size=(R, C))
    bf[0, 1] = np.nan
    bf[-1, -1] = -np.inf
    counts = rng.integers(-(2**40), 2**40, size=(R, C), dtype=np.int64)
    phase = rng.uniform(-np.pi, np.pi, size=(R, C)).astype(np.float32)
    phase[1, 0] = np.nan
    pattern = rng.random((kr, kc))
    com = rng.normal(size=(2, R, C))
    com[1, 0, 0] = np.nan
    obj = rng.normal(size=(R, C)) + 1j * rng.normal(size=(R, C))
    obj[0, 0] = complex(np.nan, 1.0)
    det = (Axis("k_row", kr, 0.7, "mrad", 5.0), Axis("k_col", kc, 0.7, "mrad", 2.5))
    prov_com = _prov("com")
    return {
        "bf": ScanImage(bf, "counts", _scan_axes((R, C)), _prov("virtual_image"), "bf"),
        "counts": ScanImage(counts, "counts", _scan_axes((R, C)), _prov("virtual_image"), "n"),
        "idpc": PhaseImage(
            phase,
            "rad",
            _scan_axes((R, C)),
            _prov("idpc", derived_from=[prov_com.to_dict()]),
            "idpc",
        ),
        "mean": DiffractionImage(pattern, "counts", det, _prov("mean_pattern"), "mean"),
        "com": VectorField(
            com,
            "mrad",
            (Axis("component", 2), *_scan_axes((R, C))),
            prov_com,
            "com",
        ),
        "object": ComplexObject(obj, "", _scan_axes((R, C)), _prov("ptycho"), ""),
    }


def _assert_same(a: Result, b: Result) -> None:
    assert type(a) is type(b)
    assert a.data.dtype == b.data.dtype
    assert a.data.shape == b.data.shape
    assert np.ascontiguousarray(a.data).tobytes() == np.ascontiguousarray(b.data).tobytes()
    assert a.units == b.units
    assert a.name == b.name
    assert a.axes == b.axes
    assert a.provenance.to_dict() == b.provenance.to_dict()


# -- round trips ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_round_trip_every_kind(tmp_path: Path, rng: np.random.Generator, fmt: str) -> None:
    results = _all_results(rng)
    assert {type(r).kind for r in results.values()} == set(RESULT_TYPES)
    written = save_results(results, tmp_path / FORMATS[fmt])
    assert written == (tmp_path / FORMATS[fmt]).absolute()
    loaded = load_results(written)
    assert list(loaded) == list(results)  # saved order kept
    for key, result in results.items():
        _assert_same(result, loaded[key])
    assert loaded["object"].data.dtype == np.complex128
    assert loaded["counts"].data.dtype == np.int64
    assert np.isnan(loaded["bf"].data[0, 1])
    assert isinstance(loaded["com"], VectorField)
    assert loaded["com"].shape[0] == 2
    assert loaded["idpc"].provenance.derived_from[0]["operator"] == "com"


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_sequence_uses_result_names(tmp_path: Path, rng: np.random.Generator, fmt: str) -> None:
    results = _all_results(rng)
    seq = [results["bf"], results["mean"], results["com"]]
    loaded = load_results(save_results(seq, tmp_path / FORMATS[fmt]))
    assert list(loaded) == ["bf", "mean", "com"]
    for r in seq:
        _assert_same(r, loaded[r.name])


def test_explicit_format_overrides_suffix(tmp_path: Path, rng: np.random.Generator) -> None:
    results = _all_results(rng)
    h5 = save_results(results, tmp_path / "out.bin", format="hdf5")
    assert h5py.is_hdf5(h5)
    zs = save_results(results, tmp_path / "store", format="zarr")
    assert (zs / "zarr.json").is_file()
    for path in (h5, zs):
        loaded = load_results(path)
        for key in results:
            _assert_same(results[key], loaded[key])


def test_layout_is_readable_without_quantem_flow(tmp_path: Path, rng: np.random.Generator) -> None:
    results = _all_results(rng)
    path = save_results(results, tmp_path / "r.h5")
    with h5py.File(path, "r") as f:
        assert int(f.attrs["quantem_flow_results_version"]) == 2
        assert "quantem_flow_version" in f.attrs
        g = f["com"]
        assert g.attrs["quantem_flow_kind"] == "VectorField"
        assert g.attrs["units"] == "mrad"
        assert json.loads(g.attrs["quantem_flow_axes"])[0]["name"] == "component"
        assert json.loads(g.attrs["provenance"])["operator"] == "com"
        np.testing.assert_array_equal(g["data"][()], results["com"].data)


def test_big_endian_data_loads_in_native_order(tmp_path: Path) -> None:
    data = np.arange(12, dtype=">f8").reshape(3, 4)
    r = ScanImage(data, "counts", _scan_axes((3, 4)), Provenance("x"), "x")
    for name in FORMATS.values():
        loaded = load_results(save_results([r], tmp_path / name))["x"]
        assert loaded.data.dtype == np.dtype("=f8")
        np.testing.assert_array_equal(loaded.data, data)


# -- bad inputs to save --------------------------------------------------------------------
def test_duplicate_and_empty_names_are_refused(tmp_path: Path, rng: np.random.Generator) -> None:
    results = _all_results(rng)
    with pytest.raises(ParameterError, match="unique"):
        save_results([results["bf"], results["bf"]], tmp_path / "a.h5")
    with pytest.raises(ParameterError, match="empty name"):
        save_results([results["object"]], tmp_path / "a.h5")
    with pytest.raises(ParameterError, match="empty name"):
        save_results({"": results["bf"]}, tmp_path / "a.h5")
    with pytest.raises(ParameterError, match="group name"):
        save_results({"a/b": results["bf"]}, tmp_path / "a.h5")
    with pytest.raises(ParameterError, match="single ScanImage"):
        save_results(results["bf"], tmp_path / "a.h5")  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="expected a quantem_flow Result"):
        save_results({"x": np.zeros((2, 2))}, tmp_path / "a.h5")  # type: ignore[dict-item]
    assert not list(tmp_path.iterdir())


def test_unknown_suffix_and_format(tmp_path: Path, rng: np.random.Generator) -> None:
    results = _all_results(rng)
    with pytest.raises(ParameterError, match=r"\.h5/\.hdf5"):
        save_results(results, tmp_path / "a.npy")
    with pytest.raises(ParameterError, match="format must be one of"):
        save_results(results, tmp_path / "a.h5", format="netcdf")


def test_unstorable_dtype_is_refused(tmp_path: Path) -> None:
    data = np.array([["a", "b"], ["c", "d"]])
    r = ScanImage(data, "", _scan_axes((2, 2)), Provenance("x"), "s")
    with pytest.raises(DtypeError, match="dtype <U1"):
        save_results([r], tmp_path / "a.h5")
    assert not list(tmp_path.iterdir())


def test_non_json_provenance_values_are_stored(tmp_path: Path) -> None:
    prov = Provenance("x", source={"path": tmp_path / "in.npy"}, parameters={"z": 1 + 2j})
    r = ScanImage(np.zeros((2, 3)), "", _scan_axes((2, 3)), prov, "x")
    for name in FORMATS.values():
        loaded = load_results(save_results([r], tmp_path / name))["x"]
        assert loaded.provenance.source["path"] == str(tmp_path / "in.npy")
        assert loaded.provenance.parameters["z"] == {"real": 1.0, "imag": 2.0}


# -- never lose written results ------------------------------------------------------------
def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_existing_path_is_not_overwritten(
    tmp_path: Path, rng: np.random.Generator, fmt: str
) -> None:
    first = _all_results(rng)
    path = save_results(first, tmp_path / FORMATS[fmt])
    second = {"other": first["mean"]}
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_results(second, path)
    loaded = load_results(path)
    assert list(loaded) == list(first)
    _assert_same(first["bf"], loaded["bf"])
    save_results(second, path, overwrite=True)
    assert list(load_results(path)) == ["other"]
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_failure_mid_write_keeps_old_file(
    tmp_path: Path, rng: np.random.Generator, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _all_results(rng)
    path = save_results(first, tmp_path / FORMATS[fmt])
    writer = "_write_hdf5_group" if fmt == "hdf5" else "_write_zarr_group"
    real = getattr(results_store, writer)
    calls = {"n": 0}

    def crash_on_second(*args: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full (simulated)")
        real(*args)

    monkeypatch.setattr(results_store, writer, crash_on_second)
    second = _all_results(rng)
    with pytest.raises(OSError, match="simulated"):
        save_results(second, path, overwrite=True)
    assert calls["n"] == 2  # something had been written when it failed
    loaded = load_results(path)
    for key in first:
        _assert_same(first[key], loaded[key])
    assert _leftovers(tmp_path) == []


def test_failure_at_rename_keeps_old_file(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _all_results(rng)
    path = save_results(first, tmp_path / "r.h5")

    def refuse(src: Any, dst: Any) -> None:
        raise OSError("rename interrupted (simulated)")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="simulated"):
        save_results(_all_results(rng), path, overwrite=True)
    monkeypatch.undo()
    loaded = load_results(path)
    _assert_same(first["object"], loaded["object"])
    assert _leftovers(tmp_path) == []


def test_zarr_failure_at_rename_restores_old_store(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _all_results(rng)
    path = save_results(first, tmp_path / "r.zarr")
    real_rename = os.rename
    failed: list[str] = []

    def rename(src: Any, dst: Any) -> None:
        # Moving the new store into place fails once; restoring the old one works.
        if Path(dst) == path and Path(src).name.startswith(".r.zarr.") and not failed:
            failed.append(str(src))
            raise OSError("rename interrupted (simulated)")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="simulated"):
        save_results(_all_results(rng), path, overwrite=True)
    monkeypatch.undo()
    loaded = load_results(path)
    for key in first:
        _assert_same(first[key], loaded[key])
    assert _leftovers(tmp_path) == []


def test_overwrite_refuses_foreign_directory(tmp_path: Path, rng: np.random.Generator) -> None:
    foreign = tmp_path / "raw.zarr"
    foreign.mkdir()
    (foreign / "precious.dat").write_bytes(b"\x00" * 8)
    with pytest.raises(ParameterError, match="not a quantem-flow results store"):
        save_results(_all_results(rng), foreign, overwrite=True)
    assert (foreign / "precious.dat").read_bytes() == b"\x00" * 8
    with pytest.raises(ParameterError, match="is a directory"):
        save_results(_all_results(rng), foreign, format="hdf5", overwrite=True)


# -- loading errors ------------------------------------------------------------------------
def test_missing_path_raises_source_not_found(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        load_results(tmp_path / "nothing.h5")
    with pytest.raises(FileNotFoundError):
        load_results(tmp_path / "nothing.zarr")


def test_plain_hdf5_file_raises_format_error(tmp_path: Path) -> None:
    path = tmp_path / "raw.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("entry/data", data=np.zeros((2, 2, 3, 3)))
    with pytest.raises(FormatError, match=r"not a quantem-flow results file.*'entry'"):
        load_results(path)


def test_plain_zarr_store_and_other_files_raise_format_error(tmp_path: Path) -> None:
    import zarr

    store = tmp_path / "raw.zarr"
    zarr.open_group(str(store), mode="w", zarr_format=3).create_array("frames", data=np.ones(3))
    with pytest.raises(FormatError, match="'frames'"):
        load_results(store)
    text = tmp_path / "notes.h5"
    text.write_text("hello")
    with pytest.raises(FormatError, match="not an HDF5 file"):
        load_results(text)
    empty = tmp_path / "empty.zarr"
    empty.mkdir()
    with pytest.raises(FormatError, match=r"without zarr\.json"):
        load_results(empty)


def test_newer_layout_and_broken_group_raise_format_error(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    path = save_results(_all_results(rng), tmp_path / "r.h5")
    with h5py.File(path, "r+") as f:
        f.attrs["quantem_flow_results_version"] = 99
    with pytest.raises(FormatError, match="upgrade quantem-flow"):
        load_results(path)
    path = save_results(_all_results(rng), tmp_path / "s.h5")
    with h5py.File(path, "r+") as f:
        f["bf"].attrs["quantem_flow_kind"] = "Hologram"
    with pytest.raises(FormatError, match=r"'bf' could not be rebuilt.*Hologram"):
        load_results(path)
    path = save_results(_all_results(rng), tmp_path / "t.h5")
    with h5py.File(path, "r+") as f:
        del f["mean"].attrs["quantem_flow_axes"]
    with pytest.raises(FormatError, match=r"lacks the attribute\(s\) \['quantem_flow_axes'\]"):
        load_results(path)


# -- JSON export ---------------------------------------------------------------------------
def test_json_export(tmp_path: Path, rng: np.random.Generator) -> None:
    results = _all_results(rng)
    out = tmp_path / "sub" / "results.json"
    text = results_to_json(results, out)
    assert out.read_text(encoding="utf-8").strip() == text
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert doc["quantem_flow_results_version"] == 2
    assert list(doc["results"]) == list(results)
    com = doc["results"]["com"]
    assert com["provenance"]["operator"] == "com"
    assert com["kind"] == "VectorField"
    assert com["shape"] == list(results["com"].shape)
    assert "data" not in com
    assert "Å" in text  # units not escaped


def test_json_export_with_data(rng: np.random.Generator) -> None:
    results = _all_results(rng)
    doc = json.loads(results_to_json(results, include_data=True))
    bf = doc["results"]["bf"]["data"]
    assert bf[0][1] == "nan"
    assert bf[-1][-1] == "-inf"
    np.testing.assert_array_equal(
        np.array(bf, dtype=object)[1:-1, 2:].astype(float), results["bf"].data[1:-1, 2:]
    )
    assert doc["results"]["counts"]["data"] == results["counts"].data.tolist()
    obj = doc["results"]["object"]["data"]
    assert obj["imag"][0][0] == 1.0 and obj["real"][0][0] == "nan"
    np.testing.assert_array_equal(np.array(obj["imag"]), results["object"].data.imag)


def test_json_export_refuses_to_replace_hdf5(tmp_path: Path, rng: np.random.Generator) -> None:
    results = _all_results(rng)
    path = save_results(results, tmp_path / "r.h5")
    with pytest.raises(ParameterError, match="HDF5 file"):
        results_to_json(results, path)
    assert list(load_results(path)) == list(results)


# -- results.py ----------------------------------------------------------------------------
def test_result_shape_checks() -> None:
    prov = Provenance("x")
    with pytest.raises(ShapeError, match="needs 2-D data"):
        ScanImage(np.zeros((2, 3, 4)), "", _scan_axes((2, 3)), prov)
    with pytest.raises(ShapeError, match="2 dimensions but 1 axes"):
        ScanImage(np.zeros((2, 3)), "", (Axis("scan_row", 2),), prov)
    with pytest.raises(ShapeError, match="has size 4 but data has 3"):
        ScanImage(np.zeros((2, 3)), "", (Axis("scan_row", 2), Axis("scan_col", 4)), prov)
    with pytest.raises(ShapeError, match="needs 3-D data"):
        VectorField(np.zeros((2, 3)), "", _scan_axes((2, 3)), prov)


def test_vector_field_needs_two_components(rng: np.random.Generator) -> None:
    prov = Provenance("com")
    with pytest.raises(ShapeError, match=r"\(2, rows, cols\)"):
        VectorField(np.zeros((3, 4, 5)), "mrad", (Axis("component", 3), *_scan_axes((4, 5))), prov)
    data = rng.normal(size=(2, 4, 5))
    vf = VectorField(data, "mrad", (Axis("component", 2), *_scan_axes((4, 5))), prov)
    np.testing.assert_array_equal(vf.row, data[0])
    np.testing.assert_array_equal(vf.col, data[1])
    np.testing.assert_allclose(vf.magnitude, np.sqrt(data[0] ** 2 + data[1] ** 2))


def test_result_from_parts_round_trip(rng: np.random.Generator) -> None:
    for result in _all_results(rng).values():
        meta = json.loads(json.dumps(result.metadata()))
        rebuilt = result_from_parts(result.data.copy(), meta)
        _assert_same(result, rebuilt)
    with pytest.raises(ParameterError, match="unknown result kind"):
        result_from_parts(np.zeros((2, 2)), {"kind": "Nope"})


def test_result_repr_and_properties(rng: np.random.Generator) -> None:
    results = _all_results(rng)
    text = repr(results["bf"])
    assert "ScanImage" in text and "virtual_image" in text and "'bf'" in text
    assert "native=False" in text
    obj = results["object"]
    assert isinstance(obj, ComplexObject)
    np.testing.assert_array_equal(obj.amplitude, np.abs(obj.data))
    np.testing.assert_array_equal(obj.phase, np.angle(obj.data))
    assert results["mean"].shape == (11, 6)


# -- provenance.py -------------------------------------------------------------------------
def test_provenance_json_round_trip() -> None:
    prov = _prov("virtual_image", derived_from=[_prov("com").to_dict()])
    back = Provenance.from_json(prov.to_json())
    assert back.to_dict() == prov.to_dict()
    assert back == prov
    assert back.native is False
    assert Provenance("x").native is True
    assert Provenance("x", transforms=[{"op": "crop"}]).native is False


def test_array_identity_changes_with_one_element(rng: np.random.Generator) -> None:
    a = rng.random((16, 12))
    ident = array_identity(a)
    assert ident["shape"] == [16, 12] and ident["dtype"] == "float64"
    assert array_identity(a.copy()) == ident
    assert array_identity(np.asfortranarray(a)) == ident  # memory order does not matter
    b = a.copy()
    b[int(rng.integers(16)), int(rng.integers(12))] += 1e-12
    assert array_identity(b)["sha256"] != ident["sha256"]
    assert array_identity(a.astype(np.float32))["sha256"] != ident["sha256"]
    assert array_identity(a.reshape(12, 16))["sha256"] != ident["sha256"]


def test_package_versions_has_numpy() -> None:
    versions = package_versions()
    assert versions["numpy"] == np.__version__
    assert all(isinstance(v, str) for v in versions.values())
