"""qf.open on array objects other than NumPy arrays: lazy, calibrated, or the project's error."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import DtypeError, FormatError, QuantemFlowError, ShapeError
from tests.conftest import probe_data

dask_array = pytest.importorskip("dask.array")
xr = pytest.importorskip("xarray")
zarr = pytest.importorskip("zarr")
h5py = pytest.importorskip("h5py")


def _bf_adf_com(ds: qf.Dataset4D, **kw: Any) -> list[np.ndarray]:
    bf = qf.virtual_bf(ds, radius=4.5, center=(8.6, 14.2))
    adf = qf.virtual_adf(ds, inner=6, outer=11, center=(8.6, 14.2))
    com = qf.center_of_mass(ds)
    return [np.asarray(r) for r in qf.compute(bf, adf, com, progress=False, **kw)]


@pytest.fixture
def data(rng: np.random.Generator) -> np.ndarray:
    return probe_data(rng, scan=(9, 7))


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


class CountingArray:
    """A minimal array object: shape, dtype and NumPy slicing, counting reads."""

    def __init__(self, array: np.ndarray):
        self._array = array
        self.shape = array.shape
        self.dtype = array.dtype
        self.reads = 0

    def __getitem__(self, key: Any) -> np.ndarray:
        self.reads += 1
        return self._array[key]


def test_dask_array_opens_lazily_keeps_row_chunks_and_equals_numpy(data: np.ndarray) -> None:
    reference = _bf_adf_com(qf.open(data), client="synchronous")
    lazy = dask_array.from_array(data, chunks=(2, -1, -1, -1))
    ds = qf.open(lazy)
    assert ds.source.format == "array"
    assert ds.source.row_chunk_multiple == 2
    assert ds.chunk_rows % 2 == 0  # whole Dask chunks per task
    assert all(r0 % 2 == 0 for r0, _ in ds.chunks)
    assert ds.describe()["format_from"] == "Dask array"
    _same(_bf_adf_com(ds, client="synchronous"), reference)
    # a small chunk target still takes whole Dask chunks
    assert qf.open(lazy, chunk_mib=1e-6).chunk_rows == 2
    # chunks that split columns are not a row multiple; still exact
    split = qf.open(dask_array.from_array(data, chunks=(3, 2, -1, -1)))
    assert split.source.row_chunk_multiple is None
    _same(_bf_adf_com(split, client="synchronous"), reference)


def test_dask_array_through_worker_processes(data: np.ndarray, cluster_client: Any) -> None:
    reference = _bf_adf_com(qf.open(data), client="synchronous")
    lazy = dask_array.from_array(data, chunks=(4, -1, -1, -1)).astype(np.float32)
    _same(_bf_adf_com(qf.open(lazy), client=cluster_client), [r.astype(r.dtype) for r in reference])


def test_dask_3d_frames_with_scan_shape(data: np.ndarray) -> None:
    frames = dask_array.from_array(data.reshape(-1, *data.shape[2:]), chunks=(14, -1, -1))
    ds = qf.open(frames, scan_shape=(9, 7))
    assert ds.shape == data.shape
    assert ds.source.row_chunk_multiple == 2  # 14 frames = 2 scan rows of 7
    np.testing.assert_array_equal(ds.load_block((3, 6), (2, 5)), data[3:6, 2:5])
    with pytest.raises(QuantemFlowError):
        qf.open(frames)  # 3-D without a scan shape


def test_dask_identity_tells_arrays_apart(data: np.ndarray) -> None:
    a = qf.open(dask_array.from_array(data, chunks=(3, -1, -1, -1)))
    b = qf.open(dask_array.from_array(data + 1, chunks=(3, -1, -1, -1)))
    assert a.source.identity != b.source.identity


def test_xarray_coordinates_give_the_calibration(data: np.ndarray) -> None:
    R, C, kr, kc = data.shape
    x = xr.DataArray(
        data,
        dims=("y", "x", "ky", "kx"),
        coords={
            "y": np.arange(R) * 0.25 + 3.0,
            "x": np.arange(C) * 0.3,
            "ky": (np.arange(kr) - 8.6) * 0.002,
            "kx": (np.arange(kc) - 14.2) * 0.002,
        },
        attrs={"accelerating_voltage_kV": 300},
    )
    for k in ("y", "x"):
        x.coords[k].attrs["units"] = "nm"
    for k in ("ky", "kx"):
        x.coords[k].attrs["units"] = "rad"
    for obj in (x, x.chunk({"y": 3})):
        ds = qf.open(obj)
        cal = ds.calibration
        assert cal.scan_units == "nm" and cal.scan_sampling == pytest.approx((0.25, 0.3))
        assert cal.detector_units == "mrad"
        assert cal.detector_sampling == pytest.approx((2.0, 2.0))
        assert cal.detector_origin == pytest.approx((8.6, 14.2))
        assert cal.accelerating_voltage_kV == 300
        assert any("('y', 'x', 'ky', 'kx')" in n for n in ds.source.notes)
    lazy = qf.open(x.chunk({"y": 3}))
    assert lazy.source.row_chunk_multiple == 3
    same_calibration = qf.open(data, calibration=lazy.calibration)
    _same(
        _bf_adf_com(lazy, client="synchronous"), _bf_adf_com(same_calibration, client="synchronous")
    )
    # an explicit calibration still wins, and what the coordinates said is recorded
    given = qf.open(x, calibration=qf.Calibration())
    assert given.calibration.detector_units == "px"


def test_xarray_without_usable_coordinates_stays_uncalibrated_and_says_why(
    data: np.ndarray,
) -> None:
    R = data.shape[0]
    x = xr.DataArray(data, dims=("a", "b", "c", "d"), coords={"a": np.arange(R) ** 2})
    x.coords["a"].attrs["units"] = "nm"
    ds = qf.open(x)
    assert ds.calibration.scan_units == "px" and ds.calibration.detector_units == "px"
    notes = " ".join(ds.source.notes)
    assert "not evenly spaced" in notes and "'c' has no coordinate" in notes
    bad_units = xr.DataArray(data, dims=("a", "b", "c", "d"), coords={"c": np.arange(20) * 2.0})
    bad_units.coords["c"].attrs["units"] = "furlong"
    assert "furlong" in " ".join(qf.open(bad_units).source.notes)


def test_zarr_arrays_local_reopened_by_path_memory_sliced(tmp_path: Path, data: np.ndarray) -> None:
    reference = _bf_adf_com(qf.open(data), client="synchronous")
    group = zarr.open_group(tmp_path / "s.zarr", mode="w")
    local = group.create_array(
        "scan/frames", shape=data.shape, dtype=data.dtype, chunks=(1, 7, 20, 26)
    )
    local[:] = data
    ds = qf.open(local)
    assert ds.source.format == "zarr"
    assert ds.source.array_path == "scan/frames"
    _same(_bf_adf_com(ds, client="synchronous"), reference)
    memory = zarr.create_array(
        store=zarr.storage.MemoryStore(), shape=data.shape, dtype=data.dtype, chunks=(3, 7, 20, 26)
    )
    memory[:] = data
    dm = qf.open(memory)
    assert dm.source.format == "array" and dm.source.row_chunk_multiple == 3
    _same(_bf_adf_com(dm, client="synchronous"), reference)
    with pytest.raises(FormatError, match="zarr Group"):
        qf.open(group)


def test_h5py_dataset_reopened_read_only(tmp_path: Path, data: np.ndarray) -> None:
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f["entry/data"] = data
    with h5py.File(path, "r") as f:
        ds = qf.open(f["entry/data"])
        with pytest.raises(FormatError, match="its datasets"):
            qf.open(f["entry"])
    assert ds.source.format == "hdf5"
    _same(_bf_adf_com(ds, client="synchronous"), _bf_adf_com(qf.open(data), client="synchronous"))
    writable = tmp_path / "w.h5"
    with h5py.File(writable, "w") as f:
        f["entry/data"] = data
    with h5py.File(writable, "r+") as f:
        with pytest.raises(FormatError, match="for writing") as err:
            qf.open(f["entry/data"])
        assert "h5py.File(path, 'r')" in str(err.value)
    with h5py.File("inmem.h5", "w", driver="core", backing_store=False) as f:
        f["data"] = data
        with pytest.raises(FormatError, match="in memory"):
            qf.open(f["data"])


def test_lists_generic_array_objects_and_refusals(data: np.ndarray) -> None:
    frames = [frame for row in data for frame in row]  # a list of 2-D frames
    ds = qf.open(frames, scan_shape=data.shape[:2])
    assert ds.shape == data.shape
    assert any("copied" in n for n in ds.source.notes)
    np.testing.assert_array_equal(ds.load_block((0, 9)), data)
    counting = CountingArray(data)
    lazy = qf.open(counting, chunk_rows=3)
    assert counting.reads == 0  # opening read nothing
    _same(_bf_adf_com(lazy, client="synchronous"), _bf_adf_com(qf.open(data), client="synchronous"))
    assert counting.reads >= 3
    with pytest.raises(FormatError, match=r"got a builtins\.dict"):
        qf.open({"data": data})
    with pytest.raises(FormatError, match="not a rectangular array"):
        qf.open([[1, 2], [3]])
    with pytest.raises(DtypeError, match="expected numbers"):
        qf.open([["a", "b"]])
    with pytest.raises(ShapeError, match="got shape"):
        qf.open(CountingArray(data[0, 0]))

    class FakeGpuArray(CountingArray):
        __cuda_array_interface__: ClassVar[dict[str, Any]] = {}

    with pytest.raises(FormatError, match=r"\.get\(\)"):
        qf.open(FakeGpuArray(data))
    with pytest.raises(FormatError, match="xarray Dataset"):
        qf.open(xr.Dataset({"frames": xr.DataArray(data)}))


def test_errors_and_sources_survive_pickling(data: np.ndarray) -> None:
    src = qf.open(dask_array.from_array(data, chunks=(3, -1, -1, -1))).source
    again = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(again.read((1, 4), (0, 7)), data[1:4])
    try:
        qf.open(object())
    except FormatError as exc:
        copy = pickle.loads(pickle.dumps(exc))
        assert str(copy) == str(exc) and isinstance(copy, ValueError | FormatError)
