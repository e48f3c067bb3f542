"""Checksums: verify="checksums" and corrupt bytes under a checksum (issue 11, item 5)."""

from __future__ import annotations

from pathlib import Path

import h5py
import hdf5plugin
import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import CorruptChunkError, ParameterError


def _frames() -> np.ndarray:
    return np.random.default_rng(2).poisson(3, size=(12, 16, 16)).astype(np.uint16)


def _flip_chunk_byte(path: Path, chunk: tuple[int, ...], byte: int) -> None:
    with h5py.File(path, "r") as f:
        where = int(f["data"].id.get_chunk_info_by_coord(chunk).byte_offset)
    with open(path, "r+b") as fh:
        fh.seek(where + byte)
        value = fh.read(1)[0]
        fh.seek(where + byte)
        fh.write(bytes([value ^ 0x10]))


def test_verify_checksums_refuses_formats_without_them(tmp_path: Path) -> None:
    np.save(tmp_path / "d.npy", _frames().reshape(3, 4, 16, 16))
    with pytest.raises(ParameterError, match=r"verify='checksums'.*npy.*no checksum"):
        qf.open(tmp_path / "d.npy", verify="checksums")
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f.create_dataset("data", data=_frames(), chunks=(1, 16, 16), **hdf5plugin.Bitshuffle())
    with pytest.raises(ParameterError, match="no Fletcher32"):
        qf.open(tmp_path / "plain.h5", scan_shape=(3, 4), verify="checksums")
    with pytest.raises(ParameterError, match="verify must be"):
        qf.open(tmp_path / "d.npy", verify="yes")
    qf.open(tmp_path / "d.npy")  # unchecked reads stay the default


def test_fletcher32_hdf5_is_verified_and_a_flipped_byte_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "f.h5"
    frames = _frames()
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "data", data=frames, chunks=(1, 16, 16), fletcher32=True, compression="gzip"
        )
    ds = qf.open(path, scan_shape=(3, 4), verify="checksums")
    assert any("Fletcher32" in n for n in ds.notes)
    np.testing.assert_array_equal(ds.load_block((0, 3)), frames.reshape(3, 4, 16, 16))
    _flip_chunk_byte(path, (5, 0, 0), 20)
    ds = qf.open(path, scan_shape=(3, 4), verify="checksums")
    with pytest.raises(CorruptChunkError, match=r"f\.h5"):
        ds.load_block((0, 3))


def test_crc32c_zarr_is_verified_and_a_flipped_byte_is_caught(tmp_path: Path) -> None:
    import zarr
    from zarr.codecs import BloscCodec, Crc32cCodec

    frames = _frames()
    store = tmp_path / "d.zarr"
    arr = zarr.create_array(
        store=str(store),
        shape=frames.shape,
        chunks=(1, 16, 16),
        dtype=frames.dtype,
        compressors=[BloscCodec(cname="lz4"), Crc32cCodec()],
    )
    arr[:] = frames
    ds = qf.open(store, scan_shape=(3, 4), verify="checksums")
    np.testing.assert_array_equal(ds.load_block((0, 3)), frames.reshape(3, 4, 16, 16))
    chunk = next(p for p in store.rglob("*") if p.is_file() and p.parts[-3:] == ("4", "0", "0"))
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    chunk.write_bytes(bytes(raw))
    with pytest.raises(CorruptChunkError):
        qf.open(store, scan_shape=(3, 4), verify="checksums").load_block((0, 3))
    plain = tmp_path / "p.zarr"
    zarr.create_array(store=str(plain), shape=frames.shape, chunks=(1, 16, 16), dtype=frames.dtype)
    with pytest.raises(ParameterError, match="no crc32c"):
        qf.open(plain, scan_shape=(3, 4), verify="checksums")
