"""Sizes declared in headers are checked at open, not at compute (issue 11, item 8)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import FormatError, ShapeError
from tests.io.writers import write_stempy


def test_counted_detector_of_100000_pixels_square_is_refused_at_open(tmp_path: Path) -> None:
    events = [np.array([1, 2, 3], dtype=np.uint32) for _ in range(6)]
    path = write_stempy(tmp_path / "c.h5", events, (2, 3), (100000, 100000))
    with pytest.raises(ShapeError, match=r"Nx/Ny.*100000 x 100000"):
        qf.open(path)


def test_hdf5_scan_row_larger_than_memory_is_refused_at_open(tmp_path: Path) -> None:
    path = tmp_path / "big.h5"
    with h5py.File(path, "w") as f:  # declared, never written: the file stays tiny
        f.create_dataset("data", shape=(2, 1 << 20, 256, 256), dtype="u2", chunks=(1, 1, 256, 256))
    with pytest.raises(ShapeError, match=r"shape of the HDF5 dataset.*one scan row of it is"):
        qf.open(path, dataset_path="/data")


def test_zarr_shape_needing_more_than_memory_is_refused_at_open(tmp_path: Path) -> None:
    import zarr

    store = tmp_path / "big.zarr"
    zarr.create_array(
        store=str(store), shape=(4, 1 << 20, 128, 128), chunks=(1, 1, 128, 128), dtype="u4"
    )
    with pytest.raises(FormatError, match=r"0 chunk files"):  # an empty store: refused
        qf.open(store)
    with pytest.raises(ShapeError, match=r"zarr.json"):  # and with allow_fill, by its size
        qf.open(store, allow_fill=True)


def test_ordinary_shapes_still_open(tmp_path: Path) -> None:
    np.save(tmp_path / "d.npy", np.zeros((3, 4, 8, 8), dtype=np.uint16))
    assert qf.open(tmp_path / "d.npy").shape == (3, 4, 8, 8)
