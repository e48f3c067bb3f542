"""Results files read as images with calibrated axes and units without quantem-flow.

Checked with h5py alone, with silx's NeXus reader and with xarray on Zarr.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import quantem_flow as qf
from tests.conftest import probe_data

SCAN_NM = 0.4
MRAD = 1.1


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    data = probe_data(np.random.default_rng(7), scan=(5, 7), det=(20, 26))
    cal = qf.Calibration(
        scan_sampling=SCAN_NM, scan_units="nm", detector_sampling=MRAD, detector_units="mrad"
    )
    ds = qf.open(data, calibration=cal)
    bf, com, mean = qf.compute(
        qf.virtual_bf(ds), qf.center_of_mass(ds), qf.mean_diffraction(ds), client="synchronous"
    )
    return {"bf": bf, "com": com, "mean": mean}


def test_hdf5_with_h5py_alone(tmp_path: Path, results: dict[str, Any]) -> None:
    path = qf.save_results(results, tmp_path / "r.h5")
    with h5py.File(path, "r") as f:
        assert f.attrs["default"] == "bf"
        bf = f["bf"]
        assert bf.attrs["NX_class"] == "NXdata" and bf.attrs["signal"] == "data"
        assert list(bf.attrs["axes"]) == ["scan_row", "scan_col"]
        assert bf.attrs["scan_row_indices"] == 0 and bf.attrs["scan_col_indices"] == 1
        data = bf["data"]
        assert data.attrs["units"] == "counts" and data.attrs["interpretation"] == "image"
        np.testing.assert_array_equal(data[()], results["bf"].data)
        # dimension scales: each dimension's label and coordinate, found from the data alone
        assert [d.label for d in data.dims] == ["scan_row", "scan_col"]
        cols = data.dims[1][0]
        assert cols.attrs["units"] == "nm"
        np.testing.assert_allclose(cols[()], np.arange(7) * SCAN_NM)
        # the vector field: a component dimension without a numeric axis
        com = f["com"]
        assert list(com.attrs["axes"]) == [".", "scan_row", "scan_col"]
        assert len(com["data"].dims[0]) == 0 and com["data"].dims[0].label == "component"
        # the pattern: angles from the beam centre, as the figure labels them
        mean = f["mean"]
        k_col = mean["data"].dims[1][0]
        origin = results["mean"].axes[1].origin
        assert k_col.attrs["units"] == "mrad"
        assert k_col.attrs["long_name"] == "k col (mrad from the beam centre)"
        np.testing.assert_allclose(k_col[()], (np.arange(26) - origin) * MRAD)
        assert k_col[()].min() < 0 < k_col[()].max()
        # provenance is still there, as JSON
        assert json.loads(bf.attrs["provenance"])["operator"] == "virtual_bf"
    loaded = qf.load_results(path)
    np.testing.assert_array_equal(loaded["bf"].data, results["bf"].data)
    assert loaded["mean"].axes == results["mean"].axes


def test_silx_reads_images_axes_and_units(tmp_path: Path, results: dict[str, Any]) -> None:
    nxdata = pytest.importorskip("silx.io.nxdata")
    path = qf.save_results(results, tmp_path / "r.h5")
    with h5py.File(path, "r") as f:
        assert nxdata.get_default(f) is not None  # the root's default leads to an NXdata
        for name in ("bf", "mean"):
            assert nxdata.is_valid_nxdata(f[name]), name
            group = nxdata.NXdata(f[name])
            assert group.is_image
            assert group.signal.attrs["units"] == results[name].units
            units = [a.attrs["units"] for a in group.axes]
            assert units == (["nm", "nm"] if name == "bf" else ["mrad", "mrad"])
        com = nxdata.NXdata(f["com"])
        assert com.signal.shape == (2, 5, 7) and com.axes[0] is None


def test_zarr_attributes_and_xarray(tmp_path: Path, results: dict[str, Any]) -> None:
    zarr = pytest.importorskip("zarr")
    xr = pytest.importorskip("xarray")
    path = qf.save_results(results, tmp_path / "r.zarr")
    root = zarr.open_group(str(path), mode="r")
    assert root.attrs["default"] == "bf"
    assert root["bf"].attrs["NX_class"] == "NXdata"
    assert root["bf"]["data"].attrs["units"] == "counts"
    assert root["bf"]["scan_col"].attrs["units"] == "nm"
    ds = xr.open_zarr(str(path), group="mean", consolidated=False)
    assert ds["data"].dims == ("k_row", "k_col")
    assert ds["k_row"].attrs["units"] == "mrad"
    np.testing.assert_allclose(
        ds["k_row"].values, (np.arange(20) - results["mean"].axes[0].origin) * MRAD
    )
    assert qf.load_results(path)["mean"].axes == results["mean"].axes


def test_layout_1_files_still_load(tmp_path: Path, results: dict[str, Any]) -> None:
    path = qf.save_results(results, tmp_path / "old.h5")
    with h5py.File(path, "r+") as f:  # rewrite it as layout 1 wrote it
        f.attrs["quantem_flow_results_version"] = 1
        for name in results:
            g = f[name]
            for key in [
                k
                for k in g.attrs
                if k
                not in ("quantem_flow_kind", "units", "name", "provenance", "quantem_flow_axes")
            ]:
                del g.attrs[key]
            g.attrs["axes"] = g.attrs["quantem_flow_axes"]
            del g.attrs["quantem_flow_axes"]
            for key in [k for k in g if k != "data"]:
                del g[key]
    loaded = qf.load_results(path)
    assert loaded["bf"].axes == results["bf"].axes
    np.testing.assert_array_equal(loaded["com"].data, results["com"].data)
