"""The encoded representation: codecs, native reads, the kernel, conversion, corruption."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.cli import main
from quantem_flow.convert import convert
from quantem_flow.errors import (
    ConversionError,
    CorruptChunkError,
    ParameterError,
    UnsupportedOperationError,
)
from quantem_flow.io import open_source
from quantem_flow.representations import get_representation
from quantem_flow.representations.encoded import (
    CODECS,
    ENCODED_SCHEMA,
    Encoded,
    EncodedPayload,
    decode_piece,
)
from quantem_flow.runtimes.cpu import CpuRuntime
from quantem_flow.runtimes.cpu.encoded_kernels import frame_pass_encoded
from tests.conftest import probe_data
from tests.io import writers
from tests.representation_parity import assert_operator_parity

CENTER = (8.6, 14.2)
RADIUS = 4.5


# ----------------------------------------------------------------------------- data


def _data(kind: str, dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        if kind == "random":
            out = (rng.standard_normal(shape) * 1e3).astype(dt)
            out.flat[:4] = [np.nan, np.inf, -np.inf, -0.0]  # bit patterns must survive
            return out
        if kind == "saturated":
            return np.full(shape, np.finfo(dt).max, dtype=dt)
    info = np.iinfo(dt) if dt.kind in "ui" else None
    top = float(info.max) if info is not None else 1e30
    if kind == "random":
        assert info is not None
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    if kind == "sparse":
        return np.minimum(rng.poisson(0.03, size=shape), top).astype(dt)
    if kind == "dense":
        return np.minimum(rng.poisson(min(200.0, top / 4), size=shape), top).astype(dt)
    if kind == "saturated":
        out = np.full(shape, top, dtype=dt)
        out[..., ::3, ::2] = 0
        return out
    if kind == "empty":
        return np.zeros(shape, dtype=dt)
    raise AssertionError(kind)


def _check_round_trip(block: np.ndarray, **options: Any) -> EncodedPayload:
    rep = Encoded()
    payload = rep.from_dense(block, **options)
    back = rep.to_dense(payload)
    assert back.shape == block.shape and back.dtype == block.dtype
    assert back.tobytes() == block.tobytes(), "not bit-exact"
    rep.check(block, payload, full=True)
    # the kernel equals the dense kernel bit for bit (per frame, sum, max)
    n = block.shape[0] * block.shape[1]
    flat = block.reshape(n, block.shape[2] * block.shape[3])
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, flat.shape[1]))
    ref = CpuRuntime().frame_pass(flat, w, want_sum=True, want_max=True)
    got = frame_pass_encoded(payload, w, want_sum=True, want_max=True)
    np.testing.assert_array_equal(got.per_frame, ref.per_frame)
    assert got.pattern_sum is not None and ref.pattern_sum is not None
    assert got.pattern_sum.dtype == ref.pattern_sum.dtype
    np.testing.assert_array_equal(got.pattern_sum, ref.pattern_sum)
    assert got.pattern_max is not None and ref.pattern_max is not None
    assert got.pattern_max.dtype == ref.pattern_max.dtype
    np.testing.assert_array_equal(got.pattern_max, ref.pattern_max)
    return payload


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "float32"])
@pytest.mark.parametrize("kind", ["random", "sparse", "dense", "saturated", "empty"])
def test_round_trip_every_codec(
    codec: str, dtype: str, kind: str, rng: np.random.Generator
) -> None:
    block = _data(kind, dtype, (3, 5, 12, 10), rng)
    payload = _check_round_trip(block, codec=codec, frames_per_piece=4)
    assert payload.n_pieces == 4  # 15 frames in pieces of 4
    assert payload.describe()["codec_config"]["codec"] == codec


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(
    ("shape", "options"),
    [
        ((1, 1, 1, 1), {}),  # one pixel: fewer than 8 elements (bitshuffle's leftover bytes)
        ((2, 3, 7, 13), {"frames_per_piece": 1}),  # odd frame of 91 elements
        ((5, 1, 9, 3), {"frames_per_piece": 2, "block_size": 8}),  # tiny bitshuffle blocks
        ((3, 7, 5, 11), {}),  # default pieces
        ((1, 0, 13, 22), {}),  # no frames at all
    ],
)
def test_round_trip_odd_shapes(
    codec: str, shape: tuple[int, ...], options: dict[str, Any], rng: np.random.Generator
) -> None:
    if "block_size" in options and not codec.startswith("bitshuffle"):
        options = {k: v for k, v in options.items() if k != "block_size"}
    block = _data("sparse", "uint16", shape, rng)
    _check_round_trip(block, codec=codec, **options)


def test_levels_and_defaults(rng: np.random.Generator) -> None:
    block = probe_data(rng)
    small = Encoded().from_dense(block, codec="zstd", level=19)
    fast = Encoded().from_dense(block, codec="zstd", level=1)
    assert small.compressed_nbytes <= fast.compressed_nbytes
    default = Encoded().from_dense(block)
    assert default.codec == "bitshuffle-lz4"
    assert default.compressed_nbytes < block.nbytes
    assert get_representation("encoded").schema == ENCODED_SCHEMA == "encoded-v1"
    with pytest.raises(ParameterError, match="takes no level"):
        Encoded().from_dense(block, codec="lz4", level=3)
    with pytest.raises(ParameterError, match="unknown codec 'gzip'"):
        Encoded().from_dense(block, codec="gzip")
    with pytest.raises(ParameterError, match="unknown encoded option"):
        Encoded().from_dense(block, threshold=2)


def test_post_ops_attach_without_decoding_and_widen(rng: np.random.Generator) -> None:
    ds = qf.open(probe_data(rng, scan=(4, 5)), chunk_rows=2)
    enc = ds.crop_detector((1, 19, 2, 25)).bin_detector(4).to_representation("encoded")
    payload, made = enc.load_payload((0, 2))
    assert made["made"] == "converted from dense"
    assert isinstance(payload, EncodedPayload)
    # converted from the transformed block: nothing to apply after decoding
    assert payload.post_ops == () and payload.dtype == np.uint32
    raw = qf.open(probe_data(rng, scan=(2, 3))).to_representation("encoded")
    p0, _ = raw.load_payload((0, 2))
    ops = raw.crop_detector((1, 19, 2, 25)).bin_detector(4).detector_ops
    p1 = Encoded().apply_detector_ops(p0, ops)
    assert p1.post_ops == ops and p1.data is p0.data  # the same compressed bytes
    assert p1.frame_shape == (20, 26) and p1.out_frame_shape == (5, 6)
    assert p1.dtype == np.uint32 and p0.dtype == np.uint16
    dense = raw.load_block((0, 2))
    expected = raw.crop_detector((1, 19, 2, 25)).bin_detector(4).load_block((0, 2))
    np.testing.assert_array_equal(Encoded().to_dense(p1), expected)
    assert dense.shape[-2:] == (20, 26)


# ----------------------------------------------------------------------------- parity


def test_parity_in_memory(rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(7, 9))
    ds = qf.open(data, chunk_rows=2)
    for codec in CODECS:
        enc = ds.to_representation("encoded", codec=codec, frames_per_piece=5)
        results = assert_operator_parity(ds, enc, center=CENTER, radius=RADIUS)
        ex = results[0].provenance.execution
        assert ex["representation"] == "encoded" and ex["storage_schema"] == "encoded-v1"
        assert ex["payloads_made_by"] == ["converted from dense"]
        assert ex["conversion_checks"] == ["full"]
        assert ex["n_chunks"] == 4
        assert results[0].provenance.dataset["representation_options"]["codec"] == codec
    view = ds.crop_scan((1, 6, 2, 9)).crop_detector((1, 19, 2, 25)).bin_detector(3)
    assert_operator_parity(view, view.to_representation("encoded"), center=(3.0, 4.0), radius=2.0)


def _dectris(tmp_path: Path, rng: np.random.Generator, scan=(7, 9)) -> tuple[Path, np.ndarray]:
    data = probe_data(rng, scan=scan)
    master = writers.write_dectris(
        tmp_path, "acq", data.reshape(-1, *data.shape[2:]), frames_per_file=10
    )
    return master, data


def test_parity_dectris_native(tmp_path: Path, rng: np.random.Generator) -> None:
    master, _ = _dectris(tmp_path, rng)
    ds = qf.open(master, scan_shape=(7, 9), chunk_rows=2)
    assert ds.source.payload_representations == frozenset({"encoded"})
    enc = ds.to_representation("encoded")
    results = assert_operator_parity(ds, enc, center=CENTER, radius=RADIUS)
    ex = results[0].provenance.execution
    assert ex["payloads_made_by"] == ["native dectris read"]
    assert ex["conversion_checks"] == []  # native: the stored bytes themselves
    assert ex["payload_bytes"] < ex["dense_bytes"]
    for view in (
        ds.crop_scan((1, 6, 2, 8)),
        ds.crop_detector((2, 18, 3, 21)),
        ds.bin_detector(3),
        ds.crop_scan((0, 7, 4, 9)).crop_detector((1, 19, 2, 25)).bin_detector((2, 3)),
    ):
        enc_view = view.to_representation("encoded")
        payload, made = enc_view.load_payload(enc_view.chunks[0])
        assert made["made"] == "native dectris read"
        assert payload.post_ops == view.detector_ops
        assert_operator_parity(view, enc_view, center=(5.0, 6.0), radius=3.0)


def test_dectris_pieces_are_the_stored_chunks(tmp_path: Path, rng: np.random.Generator) -> None:
    master, data = _dectris(tmp_path, rng)
    src = open_source(master, scan_shape=(7, 9))
    payload = src.read_payload("encoded", (2, 5), (0, 9))  # frames 18..45, data files 2-5
    assert payload.codec == "bitshuffle-lz4" and payload.n_pieces == 27
    stored = []
    for frame in range(18, 45):
        with h5py.File(tmp_path / f"acq_data_{frame // 10 + 1:06d}.h5", "r") as f:
            dset = f["/entry/data/data"]
            mask, chunk = dset.id.read_direct_chunk((frame % 10, 0, 0))
            assert mask == 0
            assert dset.id.get_chunk_info(frame % 10).size == len(chunk)
            stored.append(bytes(chunk))
    assert payload.pieces == stored
    # resident bytes are the stored bytes (plus a small index)
    assert payload.compressed_nbytes == sum(len(c) for c in stored)
    assert payload.nbytes - payload.compressed_nbytes <= 64 * payload.n_pieces
    header = np.frombuffer(stored[0][:12], dtype=">u8", count=1)[0]
    assert header == 20 * 26 * 2  # uncompressed bytes of one frame, big-endian
    np.testing.assert_array_equal(Encoded().to_dense(payload), data[2:5])
    # a column sub-range reads only the chunks it needs
    sub = src.read_payload("encoded", (2, 5), (3, 7))
    assert sub.n_pieces == 12 and sub.pieces == [
        stored[9 * r + c] for r in range(3) for c in (3, 4, 5, 6)
    ]
    np.testing.assert_array_equal(Encoded().to_dense(sub), data[2:5, 3:7])
    with pytest.raises(ParameterError, match="stores its chunks as 'bitshuffle-lz4'"):
        src.read_payload("encoded", (0, 1), (0, 9), codec="zstd")
    with pytest.raises(ParameterError, match="do not apply to a native"):
        src.read_payload("encoded", (0, 1), (0, 9), level=3)


def test_hdf5_native_layouts(tmp_path: Path, rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(6, 7))
    frames = data.reshape(-1, *data.shape[2:])
    # 3-D, 4 frames per chunk, 2 leading frames to skip, bitshuffle + Zstandard
    p3 = tmp_path / "flat.h5"
    with h5py.File(p3, "w") as f:
        f.create_dataset(
            "/d",
            data=np.concatenate([frames[:2] + 7, frames]),
            chunks=(4, *frames.shape[1:]),
            **hdf5plugin.Bitshuffle(cname="zstd"),
        )
    ds3 = qf.open(p3, dataset_path="/d", scan_shape=(6, 7), frame_offset=2, chunk_rows=2)
    payload = ds3.source.read_payload("encoded", (1, 3), (2, 6))
    assert payload.codec == "bitshuffle-zstd"
    assert payload.runs[0].tolist() == [0, (2 + 7 + 2) % 4, 1]  # skips frames of chunk 2
    np.testing.assert_array_equal(Encoded().to_dense(payload), data[1:3, 2:6])
    assert_operator_parity(
        ds3.crop_scan((0, 6, 1, 7)),
        ds3.crop_scan((0, 6, 1, 7)).to_representation("encoded"),
        center=CENTER,
        radius=RADIUS,
    )
    # 4-D, scan tiles of 2 x 3 positions, bitshuffle + LZ4 (a piece is revisited per row)
    p4 = writers.write_hdf5(tmp_path / "cube.h5", data, chunks=(2, 3, *data.shape[2:]))
    ds4 = qf.open(p4, dataset_path="/data", chunk_rows=3)
    enc4 = ds4.crop_scan((1, 6, 1, 7)).to_representation("encoded")
    payload, made = enc4.load_payload((0, 3))
    assert made["made"] == "native hdf5 read"
    with h5py.File(p4, "r") as f:
        first = bytes(f["/data"].id.read_direct_chunk((0, 0, 0, 0))[1])
    assert payload.pieces[0] == first
    assert_operator_parity(ds4.crop_scan((1, 6, 1, 7)), enc4, center=CENTER, radius=RADIUS)
    # Zstandard (32015) and deflate (1) alone are read natively too
    for name, kwargs in (("zstd", dict(hdf5plugin.Zstd())), ("gzip", {"compression": "gzip"})):
        p = tmp_path / f"{name}.h5"
        with h5py.File(p, "w") as f:
            f.create_dataset("/d", data=data, chunks=(1, 1, *data.shape[2:]), **kwargs)
        ds = qf.open(p, dataset_path="/d", chunk_rows=4)
        assert ds.source.payload_representations == frozenset({"encoded"}), name
        assert_operator_parity(ds, ds.to_representation("encoded"), center=CENTER, radius=RADIUS)


def test_unsupported_hdf5_layout_names_the_filter(tmp_path: Path, rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(3, 4))
    p = tmp_path / "shuffled.h5"
    with h5py.File(p, "w") as f:
        f.create_dataset(
            "/d", data=data, chunks=(1, 1, *data.shape[2:]), compression="gzip", shuffle=True
        )
        f.create_dataset("/split", data=data, chunks=(1, 1, 10, 13), **hdf5plugin.Bitshuffle())
        f.create_dataset("/plain", data=data)
    src = open_source(p, dataset_path="/d")
    assert src.payload_representations == frozenset()
    with pytest.raises(UnsupportedOperationError, match=r"shuffle \(id 2.*convert"):
        src.read_payload("encoded", (0, 1), (0, 4))
    with pytest.raises(UnsupportedOperationError, match="splits frames"):
        open_source(p, dataset_path="/split").read_payload("encoded", (0, 1), (0, 4))
    with pytest.raises(UnsupportedOperationError, match="not chunked"):
        open_source(p, dataset_path="/plain").read_payload("encoded", (0, 1), (0, 4))
    # the dataset still converts from dense, exactly and checked, and says so
    ds = qf.open(p, dataset_path="/d", chunk_rows=2)
    enc = ds.to_representation("encoded")
    _, made = enc.load_payload((0, 2))
    assert made["made"] == "converted from dense" and made["check"]["check"] == "full"
    assert_operator_parity(ds, enc, center=CENTER, radius=RADIUS)


# ----------------------------------------------------------------------------- zarr + convert


def _zarr_chunk_files(store: Path) -> dict[tuple[int, ...], bytes]:
    out = {}
    for f in (store / "c").rglob("*"):
        if f.is_file():
            out[tuple(int(v) for v in f.relative_to(store / "c").parts)] = f.read_bytes()
    return out


def test_convert_cli_and_native_zarr(
    tmp_path: Path, rng: np.random.Generator, capsys: pytest.CaptureFixture[str]
) -> None:
    master, data = _dectris(tmp_path, rng)
    (tmp_path / "acq.json").write_text(
        json.dumps({"calibration": {"detector_sampling": [0.5, 0.5], "detector_units": "mrad"}})
    )
    out = tmp_path / "scan.zarr"
    argv = ["convert", str(master), str(out), "--scan-shape", "7", "9", "--frames-per-chunk", "4"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "compression ratio" in printed and str(out) in printed
    ratio = float(printed.split("compression ratio")[1].split()[0])
    stored = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    assert ratio == pytest.approx(data.nbytes / stored, rel=0.01) and ratio > 1.5
    assert (out / "zarr.json").is_file() and not (tmp_path / "scan.zarr.partial").exists()
    meta = json.loads((out / "zarr.json").read_text())
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [1, 4, 20, 26]
    assert [c["name"] for c in meta["codecs"]] == ["bytes", "blosc", "crc32c"]
    prov = meta["attributes"]["quantem_flow"]["provenance"]
    assert prov["exactness"]["frames_verified"] == 63 and prov["codec"] == "bitshuffle-lz4"
    assert prov["source"]["format"] == "dectris"
    # refusing to overwrite; --overwrite replaces
    assert main(argv) == 2
    assert "exists" in capsys.readouterr().err
    assert main([*argv, "--overwrite", "--codec", "zstd", "--level", "5"]) == 0
    capsys.readouterr()
    # exact round trip, calibration kept
    z = qf.open(out, chunk_rows=2)
    d = qf.open(master, scan_shape=(7, 9), chunk_rows=2)
    np.testing.assert_array_equal(z.load_block((0, 7)), data)
    assert z.calibration.detector_units == "mrad" and z.calibration.detector_sampling == (0.5, 0.5)
    # native encoded reads take the chunk files as they are
    assert z.source.payload_representations == frozenset({"encoded"})
    payload = z.source.read_payload("encoded", (0, 7), (0, 9))
    files = _zarr_chunk_files(out)
    assert payload.pieces == [files[(r, j, 0, 0)] for r in range(7) for j in range(3)]
    assert payload.compressed_nbytes == sum(len(b) for b in files.values())
    assert payload.codec_config["pipeline"][0]["id"] == "zstd"
    for view_d, view_z in (
        (d, z),
        (d.crop_scan((1, 6, 2, 9)), z.crop_scan((1, 6, 2, 9))),
        (
            d.crop_detector((1, 19, 2, 25)).bin_detector(3),
            z.crop_detector((1, 19, 2, 25)).bin_detector(3),
        ),
    ):
        enc = view_z.to_representation("encoded")
        results = assert_operator_parity(view_d, enc, center=(5.0, 6.0), radius=3.0)
        assert results[0].provenance.execution["payloads_made_by"] == ["native zarr read"]


@pytest.mark.parametrize("codec", ["bitshuffle-lz4", "bitshuffle-zstd", "zstd", "lz4"])
def test_convert_library_exact(codec: str, tmp_path: Path, rng: np.random.Generator) -> None:
    data = _data("random", "float32", (5, 6, 7, 9), rng)  # NaN, inf and -0.0 kept bit for bit
    ds = qf.open(data)
    out = convert(ds, tmp_path / "f.zarr", codec=codec, frames_per_chunk=13)  # 2 rows + 1 frame
    z = qf.open(out)
    assert z.load_block((0, 5)).tobytes() == data.tobytes()
    payload = z.source.read_payload("encoded", (0, 5), (0, 6))
    assert Encoded().to_dense(payload).tobytes() == data.tobytes()
    meta = json.loads((out / "zarr.json").read_text())
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [2, 6, 7, 9]


def test_native_zarr_from_other_writers(tmp_path: Path, rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(6, 8))
    # blosc(zstd, bitshuffle), tiles of 3 x 4 scan positions: pieces revisited per row
    p = writers.write_zarr(tmp_path / "w.zarr", data)
    ds = qf.open(p, chunk_rows=2)
    assert ds.source.payload_representations == frozenset({"encoded"})
    assert_operator_parity(ds, ds.to_representation("encoded"), center=CENTER, radius=RADIUS)
    # a 3-D array of frames in a group, 5 frames per chunk, zstd
    flat = data.reshape(-1, *data.shape[2:])
    p3 = writers.write_zarr(
        tmp_path / "g.zarr", flat, array_path="scan/frames", chunks=(5, 20, 26), compressor="zstd"
    )
    ds3 = qf.open(p3, array_path="scan/frames", scan_shape=(6, 8), chunk_rows=3)
    view = ds3.crop_scan((1, 6, 1, 7))
    assert_operator_parity(view, view.to_representation("encoded"), center=CENTER, radius=RADIUS)
    # absent chunk files read as the fill value, as Zarr defines
    import zarr

    sparse = zarr.create_array(
        tmp_path / "s.zarr",
        shape=data.shape,
        chunks=(1, 2, 20, 26),
        dtype=data.dtype,
        fill_value=3,
        zarr_format=3,
    )
    sparse[2:4] = data[2:4]
    src = open_source(tmp_path / "s.zarr")
    payload = src.read_payload("encoded", (0, 6), (0, 8))
    expected = np.full_like(data, 3)
    expected[2:4] = data[2:4]
    np.testing.assert_array_equal(Encoded().to_dense(payload), expected)


def test_convert_refuses_and_cleans_up(tmp_path: Path, rng: np.random.Generator) -> None:
    ds = qf.open(probe_data(rng, scan=(3, 4)))
    target = tmp_path / "notes"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(ParameterError, match="not a Zarr store"):
        convert(ds, target, overwrite=True)
    assert (target / "keep.txt").read_text() == "mine"
    with pytest.raises(ParameterError, match="clevel"):
        convert(ds, tmp_path / "x.zarr", codec="lz4", level=12)
    assert not (tmp_path / "x.zarr").exists() and not (tmp_path / "x.zarr.partial").exists()
    with pytest.raises(ParameterError, match="Zarr stores only"):
        convert(ds, tmp_path / "x.h5", to="counted", codec="zstd")


def test_convert_detects_a_bad_write(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import quantem_flow.representations.encoded as encoded

    ds = qf.open(probe_data(rng, scan=(3, 4)))
    real = encoded.Encoded.to_dense

    def lossy(self: Any, payload: Any) -> np.ndarray:
        out = real(self, payload).copy()
        out.flat[7] += 1
        return out

    monkeypatch.setattr(encoded.Encoded, "to_dense", lossy)
    with pytest.raises(ConversionError, match="differ"):
        convert(ds, tmp_path / "bad.zarr")
    assert not (tmp_path / "bad.zarr").exists() and not (tmp_path / "bad.zarr.partial").exists()


def test_convert_counted(tmp_path: Path, rng: np.random.Generator) -> None:
    pytest.importorskip("quantem_flow.io.counted", reason="the counted writer is not there yet")
    from quantem_flow.io import counted

    if not hasattr(counted, "write_counted"):
        pytest.skip("quantem_flow.io.counted has no write_counted yet")
    data = probe_data(rng, scan=(3, 4))
    src = tmp_path / "in.npy"
    np.save(src, data)
    out = tmp_path / "counted.h5"
    assert main(["convert", str(src), str(out), "--to", "counted"]) == 0
    np.testing.assert_array_equal(qf.open(out).load_block((0, 3)), data)
    assert main(["convert", str(src), str(out), "--to", "counted", "--codec", "zstd"]) == 2


# ----------------------------------------------------------------------------- persist


def test_persisted_encoded_holds_compressed_bytes(tmp_path: Path, rng: np.random.Generator) -> None:
    master, data = _dectris(tmp_path, rng)
    ds = qf.open(master, scan_shape=(7, 9), chunk_rows=3)
    enc = ds.to_representation("encoded").persist(client="synchronous")
    chunks = enc.resident.refs
    assert [c.representation for c in chunks] == ["encoded"] * 3
    assert all(c.storage_schema == "encoded-v1" for c in chunks)
    stored = 0
    for frame in range(63):
        with h5py.File(tmp_path / f"acq_data_{frame // 10 + 1:06d}.h5", "r") as f:
            stored += f["/entry/data/data"].id.get_chunk_info(frame % 10).size
    assert sum(c.payload.compressed_nbytes for c in chunks) == stored
    held = sum(c.nbytes for c in chunks)
    assert stored <= held <= stored + 64 * 63 and held < data.nbytes
    results = assert_operator_parity(ds, enc, center=CENTER, radius=RADIUS)
    ex = results[0].provenance.execution
    assert ex["representation"] == "encoded" and ex["bytes_read"] == 0
    assert ex["payload_bytes"] == held < ex["dense_bytes"]
    assert results[0].provenance.dataset["representation"] == "encoded"


# ----------------------------------------------------------------------------- corruption


def _flip(path: Path, dataset: str, index: int, at: int, size: int = 8) -> None:
    with h5py.File(path, "r") as f:
        info = f[dataset].id.get_chunk_info(index)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + at)
        fh.write(b"\xff" * size)


def test_corrupt_dectris_chunk_raises_during_compute(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    master, _ = _dectris(tmp_path, rng)
    data3 = tmp_path / "acq_data_000003.h5"
    _flip(data3, "/entry/data/data", 4, at=12)  # the first block's length: past the end
    enc = qf.open(master, scan_shape=(7, 9), chunk_rows=2).to_representation("encoded")
    payload, _ = enc.load_payload((0, 2))  # chunks without the damaged one load and decode
    Encoded().to_dense(payload)
    with pytest.raises(CorruptChunkError) as info:
        qf.compute(qf.virtual_bf(enc, radius=RADIUS, center=CENTER), client="synchronous")
    msg = str(info.value)
    assert str(data3) in msg and "stored chunk 4" in msg and "/entry/data/data" in msg
    # the damaged LZ4 stream itself (header and block lengths intact)
    (tmp_path / "b").mkdir()
    master2, _ = _dectris(tmp_path / "b", rng)
    data1 = tmp_path / "b" / "acq_data_000001.h5"
    with h5py.File(data1, "r") as f:
        size = f["/entry/data/data"].id.get_chunk_info(2).size
    _flip(data1, "/entry/data/data", 2, at=16, size=size - 16)
    enc2 = qf.open(master2, scan_shape=(7, 9)).to_representation("encoded")
    with pytest.raises(CorruptChunkError, match=r"stored chunk 2 .*acq_data_000001\.h5"):
        qf.compute(qf.sum_diffraction(enc2), client="synchronous")


def test_corrupt_zarr_chunk_caught_by_checksum(tmp_path: Path, rng: np.random.Generator) -> None:
    ds = qf.open(probe_data(rng, scan=(4, 5)))
    out = convert(ds, tmp_path / "c.zarr", codec="lz4", frames_per_chunk=5)
    chunk = out / "c" / "2" / "0" / "0" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[40] ^= 0x01  # one bit in the compressed data: only the CRC-32C can tell
    chunk.write_bytes(bytes(raw))
    enc = qf.open(out).to_representation("encoded")
    with pytest.raises(
        CorruptChunkError,
        match=r"stored chunk \(2, 0, 0, 0\) of Zarr store .*c\.zarr.*crc32c checksum do not match",
    ):
        qf.compute(qf.virtual_bf(enc, radius=RADIUS, center=CENTER), client="synchronous")


def test_corrupt_in_memory_piece_names_it(rng: np.random.Generator) -> None:
    payload = Encoded().from_dense(probe_data(rng, scan=(2, 3)), frames_per_piece=2)
    payload.data[payload.offsets[1] + 12 : payload.offsets[1] + 16] = 0xFF
    with pytest.raises(CorruptChunkError, match=r"piece 1 = stored chunk 1 of in-memory"):
        decode_piece(payload, 1)
    payload = Encoded().from_dense(probe_data(rng, scan=(2, 3)), frames_per_piece=2)
    payload.data[payload.offsets[2] : payload.offsets[2] + 12] = 0
    with pytest.raises(CorruptChunkError, match=r"piece 2.*header says 0 uncompressed bytes"):
        frame_pass_encoded(payload, np.ones((1, 20 * 26)), want_sum=False, want_max=False)
