"""Passes over files storing one bitshuffle + LZ4 chunk per frame: the stored route.

The files are written by h5py with hdf5plugin's bitshuffle filter (and the
Dectris writer of tests/io/writers.py); every result must equal the same
pass over an uncompressed copy of the values, bit for bit; the content digest
names the stored chunks and is the same on every route (streamed, whole
chunk, persisted, a cluster); the chunk records say which route and kernel
ran, and why.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow import config
from quantem_flow.errors import CorruptChunkError, UnsupportedOperationError
from quantem_flow.io.hdf5 import Hdf5Source
from quantem_flow.runtimes import get_runtime
from quantem_flow.runtimes.cpu import warmup
from quantem_flow.runtimes.cpu.bitplane import BITPLANE_KEY, warm_bitplane
from tests.io.writers import write_dectris

h5py = pytest.importorskip("h5py")
hdf5plugin = pytest.importorskip("hdf5plugin")


@pytest.fixture(autouse=True)
def _bitplane_kernel_ready() -> None:
    """The kernel compiled (or loaded) in this process, as after a worker's first pass."""
    if not warmup.is_ready(BITPLANE_KEY):
        warm_bitplane()
        warmup.mark_ready(BITPLANE_KEY)


DET = (24, 20)
SCAN = (10, 14)
CENTER = (11.3, 9.6)


def _frames(rng: np.random.Generator, dtype: str = "uint16") -> np.ndarray:
    rr, cc = np.mgrid[: DET[0], : DET[1]]
    lam = np.where(np.hypot(rr - CENTER[0], cc - CENTER[1]) < 6, 300.0, 2.0)
    return rng.poisson(lam, size=(*SCAN, *DET)).astype(dtype)


def _write(path: Path, data: np.ndarray, *, nelems: int = 0, fill: int | None = None) -> Path:
    frames = data.reshape(-1, *DET)
    with h5py.File(path, "w") as f:
        d = f.create_dataset(
            "data",
            shape=frames.shape,
            dtype=frames.dtype,
            chunks=(1, *DET),
            fillvalue=fill,
            **hdf5plugin.Bitshuffle(nelems=nelems, cname="lz4"),
        )
        if fill is None:
            d[...] = frames
    return path


def _ops(ds: qf.Dataset4D, center: tuple[float, float] = CENTER, scale: float = 1.0) -> list[Any]:
    return [
        qf.virtual_bf(ds, radius=5.0 * scale, center=center),
        qf.virtual_adf(ds, inner=7.5 * scale, outer=math.inf, center=center),
        qf.center_of_mass(ds, center=center),
    ]


def _run(
    ds: qf.Dataset4D,
    client: Any = "synchronous",
    piece_mib: float = 0.005,
    ops: list[Any] | None = None,
) -> list[Any]:
    with config.set(stream_piece_mib=piece_mib):
        return list(qf.compute(*(ops or _ops(ds)), client=client, progress=False))


def _digest(result: Any) -> dict[str, Any]:
    out: dict[str, Any] = result.provenance.to_dict()["execution"]["content_digest"]
    return out


def _records(result: Any) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = result.provenance.to_dict()["execution"]["chunks"]
    return chunks


def _same_values(a: list[Any], b: list[Any]) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_bit_planes_equal_the_uncompressed_copy_and_every_route_hashes_alike(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    data = _frames(rng)
    np.save(tmp_path / "copy.npy", data)
    path = _write(tmp_path / "d.h5", data)
    ds = qf.open(path, dataset_path="/data", scan_shape=SCAN, chunk_rows=3)
    copy = _run(qf.open(tmp_path / "copy.npy"))
    streamed = _run(ds)
    _same_values(streamed, copy)
    for record in _records(streamed[0]):
        assert record["made"] == "stored chunks read, streamed"
        assert record["streamed"]["stored_bytes"] > 0
        assert "bit-plane counts" in record["frame_pass_variant"]["kernel"]
    digest = _digest(streamed[0])
    assert digest["digest"] is not None and digest["unit"] == "scan row"
    assert "stored chunks" in digest["hashed"] and "stored chunks" in digest["header"]
    assert digest["chunking_independent"] is True
    # the whole-chunk route (the reader decodes) hashes the same stored bytes
    whole = _run(ds, piece_mib=0)
    _same_values(whole, copy)
    # read as stored once, hashed, decoded from the same bytes
    assert all(r["made"] == "stored chunks read, decoded whole" for r in _records(whole[0]))
    assert _digest(whole[0])["digest"] == digest["digest"]
    # persisted chunks carry the digest of the stored bytes they were decoded from
    persisted = ds.persist(client="synchronous")
    try:
        again = _run(persisted)
        _same_values(again, copy)
        assert _digest(again[0])["digest"] == digest["digest"]
    finally:
        persisted.release()
    # the uncompressed copy's digest names its decoded values: another digest
    assert _digest(copy[0])["digest"] != digest["digest"]


def test_the_digest_names_the_stored_bytes(tmp_path: Path, rng: np.random.Generator) -> None:
    """Equal values stored with another block size: equal results, another digest."""
    data = _frames(rng)
    a = qf.open(_write(tmp_path / "a.h5", data), dataset_path="/data", scan_shape=SCAN)
    b = qf.open(_write(tmp_path / "b.h5", data, nelems=512), dataset_path="/data", scan_shape=SCAN)
    ra, rb = _run(a), _run(b)
    _same_values(ra, rb)
    assert _digest(ra[0])["digest"] != _digest(rb[0])["digest"]
    changed = data.copy()
    changed[4, 5, 3, 3] += 1
    c = qf.open(_write(tmp_path / "c.h5", changed), dataset_path="/data", scan_shape=SCAN)
    assert _digest(_run(c)[0])["digest"] != _digest(ra[0])["digest"]


def test_views_and_patterns_decode_on_the_stored_route(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    data = _frames(rng, "int16")
    np.save(tmp_path / "copy.npy", data)
    ds = qf.open(_write(tmp_path / "d.h5", data), dataset_path="/data", scan_shape=SCAN)
    copy = qf.open(tmp_path / "copy.npy")

    def view(d: qf.Dataset4D) -> qf.Dataset4D:
        return d.crop_scan((1, 9, 2, 13)).crop_detector((1, 23, 0, 18)).bin_detector(2)

    # the centre and radii of _ops in the cropped, 2 x 2 binned detector's pixels
    binned = ((CENTER[0] - 1) / 2, CENTER[1] / 2)
    got = _run(view(ds), ops=_ops(view(ds), binned, 0.5))
    _same_values(got, _run(view(copy), ops=_ops(view(copy), binned, 0.5)))
    record = _records(got[0])[0]
    assert record["made"] == "stored chunks read, streamed"
    assert "decoded a cache-sized piece at a time" in record["streamed"]["how"]
    with config.set(stream_piece_mib=0.005):
        total, peak = qf.compute(
            qf.sum_diffraction(ds), qf.max_diffraction(ds), client="synchronous", progress=False
        )
    np.testing.assert_array_equal(np.asarray(total), data.sum(axis=(0, 1), dtype=np.int64))
    np.testing.assert_array_equal(np.asarray(peak), data.max(axis=(0, 1)))
    assert "decoded" in _records(total)[0]["frame_pass_variant"]["stored"]


def test_frames_never_written_read_as_the_fill_value(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    data = _frames(rng)
    path = _write(tmp_path / "d.h5", data, fill=7)
    written = [0, 1, 5, 30, 31, 32, 139]
    with h5py.File(path, "a") as f:
        for i in written:
            f["data"][i] = data.reshape(-1, *DET)[i]
    expected = np.full_like(data.reshape(-1, *DET), 7)
    expected[written] = data.reshape(-1, *DET)[written]
    np.save(tmp_path / "copy.npy", expected.reshape(data.shape))
    ds = qf.open(path, dataset_path="/data", scan_shape=SCAN)
    got = _run(ds)
    _same_values(got, _run(qf.open(tmp_path / "copy.npy")))
    assert "bit-plane counts" in _records(got[0])[0]["frame_pass_variant"]["kernel"]


@pytest.mark.parametrize("patterns", [False, True], ids=["bit-planes", "decoded"])
def test_a_corrupt_chunk_is_named(tmp_path: Path, rng: np.random.Generator, patterns: bool) -> None:
    data = _frames(rng)
    path = _write(tmp_path / "d.h5", data)
    with h5py.File(path, "r") as f:
        info = f["data"].id.get_chunk_info_by_coord((37, 0, 0))
    with open(path, "r+b") as fh:  # the first block's LZ4 stream, overwritten with garbage
        fh.seek(info.byte_offset + 16)
        fh.write(b"\xff" * min(64, info.size - 16))
    ds = qf.open(path, dataset_path="/data", scan_shape=SCAN)
    ops = [qf.sum_diffraction(ds)] if patterns else _ops(ds)
    with (
        config.set(stream_piece_mib=0.005),
        pytest.raises(CorruptChunkError, match=r"frame 37 of dataset '/data'"),
    ):
        qf.compute(*ops, client="synchronous", progress=False)


def test_a_dectris_acquisition_across_data_files(tmp_path: Path, rng: np.random.Generator) -> None:
    data = _frames(rng)
    np.save(tmp_path / "copy.npy", data)
    master = write_dectris(tmp_path, "acq", data.reshape(-1, *DET), frames_per_file=17)
    ds = qf.open(master, scan_shape=SCAN)
    got = _run(ds)
    # the master's calibration gives mrad: the centre of mass against the decoded pass
    _same_values(got[:2], _run(qf.open(tmp_path / "copy.npy"))[:2])
    with config.set(bitplane_kernel=False):
        decoded = _run(ds)
    _same_values(got, decoded)
    assert "bit-plane" not in _records(decoded[0])[0]["frame_pass_variant"]["kernel"]
    record = _records(got[0])[0]
    assert record["made"] == "stored chunks read, streamed"
    assert "bit-plane counts" in record["frame_pass_variant"]["kernel"]
    assert _digest(_run(ds, piece_mib=0)[0])["digest"] == _digest(got[0])["digest"]


def test_a_gathering_stream_decodes_stored_frames(tmp_path: Path, rng: np.random.Generator) -> None:
    data = _frames(rng)
    source = Hdf5Source(_write(tmp_path / "d.h5", data), dataset_path="/data", scan_shape=SCAN)
    stored = source.stored_block((0, 3), (0, SCAN[1]))
    frames = data[:3].reshape(3 * SCAN[1], -1)
    gather = np.array([5, 77, 300], dtype=np.int64)
    w = np.ones((1, frames.shape[1]))
    runtime = get_runtime("cpu")
    streams = [
        runtime.frame_pass_stream(
            w,
            n_frames=frames.shape[0],
            frame_shape=DET,
            dtype=frames.dtype,
            want_sum=False,
            want_max=False,
            gather=gather,
        )
        for _ in range(2)
    ]
    assert streams[0] is not None and streams[1] is not None
    streams[0].feed_stored(stored)
    streams[1].feed(frames)
    (a, ga), (b, gb) = streams[0].finish(), streams[1].finish()
    np.testing.assert_array_equal(a.per_frame, b.per_frame)
    np.testing.assert_array_equal(ga, gb)
    np.testing.assert_array_equal(ga, frames[:, gather])


def test_which_sources_read_frames_as_stored(tmp_path: Path, rng: np.random.Generator) -> None:
    data = _frames(rng)
    path = _write(tmp_path / "d.h5", data)
    with h5py.File(path, "a") as f:
        f.create_dataset("plain", data=data)
        f.create_dataset(
            "two_frames",
            data=data.reshape(-1, *DET),
            chunks=(2, *DET),
            **hdf5plugin.Bitshuffle(cname="lz4"),
        )
        f.create_dataset(
            "zstd",
            data=data.reshape(-1, *DET),
            chunks=(1, *DET),
            **hdf5plugin.Bitshuffle(cname="zstd"),
        )
        f.create_dataset(
            "floats",
            data=data.reshape(-1, *DET).astype(np.float32),
            chunks=(1, *DET),
            **hdf5plugin.Bitshuffle(cname="lz4"),
        )
    assert Hdf5Source(path, dataset_path="/data", scan_shape=SCAN).stored_frames_codec == (
        "bitshuffle-lz4"
    )
    for name in ("plain", "two_frames", "zstd", "floats"):
        source = Hdf5Source(path, dataset_path=f"/{name}", scan_shape=SCAN)
        assert source.stored_frames_codec is None, name
        with pytest.raises(UnsupportedOperationError, match="stored_frames_codec is None"):
            source.stored_block((0, 1), (0, SCAN[1]))
    np.save(tmp_path / "d.npy", data)
    assert qf.open(tmp_path / "d.npy").source.stored_frames_codec is None


def test_the_first_use_compiles_in_the_background(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not yet run in the process: this pass decodes while the kernel compiles; same values."""
    data = _frames(rng)
    ds = qf.open(_write(tmp_path / "d.h5", data), dataset_path="/data", scan_shape=SCAN)
    counted = _run(ds)
    monkeypatch.setattr(warmup, "_ready", set())
    monkeypatch.setattr(warmup, "_threads", {})
    first = _run(ds)
    _same_values(first, counted)
    variant = _records(first[0])[0]["frame_pass_variant"]
    assert "compiles in a background thread" in variant["stored"]
    assert warmup.wait(BITPLANE_KEY, timeout_s=120)
    again = _run(ds)
    _same_values(again, counted)
    assert "bit-plane counts" in _records(again[0])[0]["frame_pass_variant"]["kernel"]
    assert _digest(first[0])["digest"] == _digest(again[0])["digest"]


@pytest.mark.cluster
def test_on_a_cluster(tmp_path: Path, rng: np.random.Generator, cluster_client: Any) -> None:
    data = _frames(rng)
    ds = qf.open(_write(tmp_path / "d.h5", data), dataset_path="/data", scan_shape=SCAN)
    local = _run(ds)
    remote = _run(ds, client=cluster_client)
    _same_values(remote, local)
    assert _digest(remote[0])["digest"] == _digest(local[0])["digest"]


def test_the_fill_value_is_part_of_the_digest() -> None:
    from quantem_flow.graphs.digest import stored_row_units
    from quantem_flow.representations.stored import StoredFrames

    def frames(fill: int) -> StoredFrames:
        return StoredFrames(
            data=np.zeros(0, dtype=np.uint8),
            starts=np.full(4, -1, dtype=np.int64),
            sizes=np.zeros(4, dtype=np.int64),
            unfiltered=np.zeros(4, dtype=bool),
            dtype=np.dtype(np.uint16),
            frame_shape=(4, 4),
            fill=fill,
            where="never written",
            numbers=np.arange(4, dtype=np.int64),
        )

    assert stored_row_units(frames(0), (0, 2)) != stored_row_units(frames(7), (0, 2))
    assert stored_row_units(frames(7), (0, 2)) == stored_row_units(frames(7), (0, 2))
