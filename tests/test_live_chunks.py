"""A live series kept as its chunks: written per row, read back exactly, damage named."""

from __future__ import annotations

import json
import os
import pickle
import signal
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("zmq")
pytest.importorskip("cbor2")

import quantem_flow as qf
from quantem_flow.errors import (
    CorruptChunkError,
    FormatError,
    SourceNotFoundError,
    StreamProtocolError,
    StreamReceiverLostError,
)
from quantem_flow.streams.dectris_sim import DectrisSimulator
from quantem_flow.streams.dectris_stream import PackedImage, decode_message, encode_image
from quantem_flow.streams.live_chunks import (
    CHUNKS,
    INDEX,
    ChunkStoreWriter,
    LiveChunkSource,
    open_live_folder,
    write_manifest,
)

SCAN = (5, 4)


def _chunks(frames: np.ndarray) -> list[bytes]:
    out = []
    for i, f in enumerate(frames):
        message = decode_message(
            encode_image(f, series_id=1, image_id=i, compression="bslz4"), decode=False
        )
        packed = next(iter(message.data.values()))  # type: ignore[union-attr]
        assert isinstance(packed, PackedImage)
        np.testing.assert_array_equal(packed.decode(), f)  # checked, decodable as it is
        out.append(packed.chunk)
    return out


def _store(folder: Path, frames: np.ndarray, *, skip: tuple[int, ...] = ()) -> None:
    writer = ChunkStoreWriter(folder, len(frames))
    for i, chunk in enumerate(_chunks(frames)):
        if i not in skip:
            writer.write(i, chunk)
    writer.close()
    write_manifest(
        folder,
        {
            "storage": "bslz4-chunks",
            "scan_shape": list(SCAN),
            "frame_shape": list(frames.shape[1:]),
            "dtype": frames.dtype.str,
        },
    )


def test_a_chunk_store_reads_back_exactly_dense_and_encoded(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    frames = rng.poisson(2.0, size=(SCAN[0] * SCAN[1], 24, 20)).astype(np.uint16)
    _store(tmp_path, frames, skip=(7,))
    ds = open_live_folder(tmp_path, chunk_rows=2)
    assert ds.representation == "dense" and ds.source.format == "live-chunks"
    want = frames.copy()
    want[7] = 0  # never came: reads as 0
    np.testing.assert_array_equal(ds.load_block((0, SCAN[0])).reshape(want.shape), want)
    center = (11.5, 9.5)
    dense = qf.compute(qf.virtual_bf(ds, radius=6, center=center), client="synchronous")[0]
    encoded = qf.compute(
        qf.virtual_bf(ds.to_representation("encoded"), radius=6, center=center),
        client="synchronous",
    )[0]
    offline = qf.compute(
        qf.virtual_bf(qf.open(want.reshape(*SCAN, 24, 20)), radius=6, center=center),
        client="synchronous",
    )[0]
    np.testing.assert_array_equal(dense.data, offline.data)
    np.testing.assert_array_equal(encoded.data, offline.data)
    cropped = open_live_folder(tmp_path, scan_rows=(1, 3))
    assert cropped.scan_shape == (2, SCAN[1])
    assert LiveChunkSource(tmp_path).identity.paths[1].endswith(CHUNKS)


def test_the_writer_puts_bytes_before_their_index_entries(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    frames = rng.poisson(2.0, size=(8, 16, 16)).astype(np.uint16)
    chunks = _chunks(frames)
    writer = ChunkStoreWriter(tmp_path, 8)
    for i in range(3):
        writer.write(i, chunks[i])
    index = np.fromfile(tmp_path / INDEX, dtype="<i8").reshape(8, 2)
    assert not index.any() and (tmp_path / CHUNKS).stat().st_size == 0  # queued, not written
    writer.flush()
    index = np.fromfile(tmp_path / INDEX, dtype="<i8").reshape(8, 2)
    assert [int(n) for n in index[:3, 1]] == [len(c) for c in chunks[:3]]
    assert (tmp_path / CHUNKS).stat().st_size == sum(len(c) for c in chunks[:3])
    writer.close()


def test_damage_in_a_kept_chunk_names_the_image(rng: np.random.Generator, tmp_path: Path) -> None:
    frames = rng.poisson(2.0, size=(SCAN[0] * SCAN[1], 24, 20)).astype(np.uint16)
    _store(tmp_path, frames)
    index = np.fromfile(tmp_path / INDEX, dtype="<i8").reshape(-1, 2)
    with open(tmp_path / CHUNKS, "r+b") as f:
        f.seek(int(index[9, 0]) + 12)  # the first block's length
        f.write(b"\x7f\xff\xff\xff")
    ds = open_live_folder(tmp_path)
    with pytest.raises(CorruptChunkError, match=r"image 9 of the live series") as err:
        ds.load_block((0, SCAN[0]))
    assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)
    os.truncate(tmp_path / CHUNKS, int(index[3, 0]))
    with pytest.raises(CorruptChunkError, match="ends at byte"):
        LiveChunkSource(tmp_path).read_frames(0, 8)


def test_a_folder_without_a_manifest_or_with_a_bad_one(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match=r"holds no live\.json"):
        open_live_folder(tmp_path)
    (tmp_path / "live.json").write_text("{not json")
    with pytest.raises(FormatError, match="cannot be read as JSON"):
        open_live_folder(tmp_path)
    (tmp_path / "live.json").write_text(json.dumps({"storage": "tiff"}))
    with pytest.raises(FormatError, match="names storage 'tiff'"):
        open_live_folder(tmp_path)


def test_a_damaged_image_is_refused_before_it_is_kept(rng: np.random.Generator) -> None:
    import cbor2

    frame = rng.integers(0, 1000, size=(16, 16)).astype(np.uint16)
    message = cbor2.loads(encode_image(frame, series_id=1, image_id=0, compression="bslz4"))
    outer = message["data"]["threshold_1"]
    typed = outer.value[1]
    algorithm, size, payload = typed.value.value
    damaged = bytearray(payload)
    damaged[4] ^= 0x40  # the declared uncompressed size
    message["data"]["threshold_1"] = cbor2.CBORTag(
        outer.tag,
        [
            outer.value[0],
            cbor2.CBORTag(typed.tag, cbor2.CBORTag(56500, [algorithm, size, bytes(damaged)])),
        ],
    )
    with pytest.raises(StreamProtocolError, match="bslz4 image is damaged"):
        decode_message(cbor2.dumps(message), decode=False)


def test_a_receiver_that_dies_is_reported_and_its_rows_kept(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    frames = rng.poisson(2.0, size=(SCAN[0] * SCAN[1], 24, 20)).astype(np.uint16)
    with DectrisSimulator(frames, rate_hz=40.0) as sim:
        acq = qf.live(sim.endpoint, scan_shape=SCAN, directory=tmp_path)
        sim.start()
        assert acq.wait_rows(1, timeout_s=30) >= 1
        os.kill(acq._process.pid, signal.SIGKILL)  # the receiving process, killed
        with pytest.raises(StreamReceiverLostError, match=r"exit code -9\) after \d+ complete"):
            acq.wait(timeout_s=30)
    assert acq.finished
    rows = acq.rows_complete
    kept = acq.dataset_so_far()  # the rows received before the loss are still there
    assert kept.scan_shape == (rows, SCAN[1])
    np.testing.assert_array_equal(
        kept.load_block((0, rows)).reshape(-1, 24, 20), frames[: rows * SCAN[1]]
    )
    err = StreamReceiverLostError("x")
    assert str(pickle.loads(pickle.dumps(err))) == "x"


@pytest.mark.parametrize(
    ("geometry", "shape", "dtype"),
    [
        ("ARINA", (192, 192), "uint16"),
        ("QUADRO", (512, 512), "uint16"),
        ("QUADRO 8-bit", (512, 512), "uint8"),
    ],
)
def test_detector_geometries_through_qf_live(
    rng: np.random.Generator, tmp_path: Path, geometry: str, shape: tuple[int, int], dtype: str
) -> None:
    scan = (3, 4)
    frames = rng.poisson(0.05, size=(scan[0] * scan[1], *shape)).astype(dtype)
    with DectrisSimulator(frames) as sim:  # bitshuffle+LZ4, as both detectors send by default
        acq = qf.live(sim.endpoint, scan_shape=scan, directory=tmp_path)
        sim.start()
        assert acq.wait(timeout_s=60).complete, geometry
    assert acq.storage == "bslz4-chunks" and acq.frame_shape == shape
    kept = acq.dataset().load_block((0, scan[0])).reshape(frames.shape)
    assert kept.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(kept, frames)
