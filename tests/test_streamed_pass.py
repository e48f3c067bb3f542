"""Streamed chunk passes: a dense chunk read, hashed and run in cache-sized pieces (issue 14).

Every result, pattern, gathered pixel and content digest of a streamed pass
must equal the whole-chunk pass's (integer data bit for bit), and the chunk
records must say which path ran and why.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow import config
from quantem_flow.errors import NonFiniteWarning
from quantem_flow.graphs.digest import DenseRowDigests, payload_digests
from quantem_flow.graphs.streamed import stream_pieces, why_not_streamed
from quantem_flow.graphs.tasks import PassSpec, run_chunk_pass
from quantem_flow.runtimes import Runtime, available_runtimes, get_runtime
from quantem_flow.testing.runtime_conformance import (
    check_frame_pass_stream,
    check_stream_row_digests,
)

DET = (16, 12)
SCAN = (9, 13)


def _frames(rng: np.random.Generator, dtype: str) -> np.ndarray:
    rr, cc = np.mgrid[: DET[0], : DET[1]]
    lam = np.where(np.hypot(rr - 7.3, cc - 5.6) < 4, 900.0, 3.0)
    data = rng.poisson(lam, size=(*SCAN, *DET))
    return data.astype(dtype)


def _ops(ds: qf.Dataset4D) -> list[Any]:
    kr, kc = ds.shape[2:]
    c = (kr * 0.456, kc * 0.467)  # off the half-pixel grid
    return [
        qf.virtual_bf(ds, radius=kr / 4, center=c),
        qf.virtual_adf(ds, inner=kr * 0.31, outer=math.inf, center=c),
        qf.center_of_mass(ds, center=c),
        qf.sum_diffraction(ds),
        qf.max_diffraction(ds),
    ]


def _run(ds: qf.Dataset4D, piece_mib: float, **settings: Any) -> list[Any]:
    with config.set(stream_piece_mib=piece_mib, **settings):
        return qf.compute(*_ops(ds), client="synchronous", progress=False)


def _chunks(result: Any) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = result.provenance.to_dict()["execution"]["chunks"]
    return chunks


def _same(a: list[Any], b: list[Any]) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # NaN equal to NaN
    da = a[0].provenance.to_dict()["execution"]["content_digest"]["digest"]
    db = b[0].provenance.to_dict()["execution"]["content_digest"]["digest"]
    assert da is not None and da == db


@pytest.mark.parametrize("row_bytes", [False, True], ids=["column-pieces", "row-pieces"])
def test_streamed_pass_equals_the_whole_chunk_pass_bit_for_bit(
    rng: np.random.Generator, tmp_path: Path, row_bytes: bool
) -> None:
    data = _frames(rng, "uint16")
    np.save(tmp_path / "d.npy", data)
    ds = qf.open(tmp_path / "d.npy", chunk_rows=3)
    frame = DET[0] * DET[1] * 2
    # pieces of one row (a whole row fits) or of 4 frames of one row (a row does not fit)
    piece_mib = (SCAN[1] * frame if row_bytes else 5 * frame) / (1 << 20)
    whole = _run(ds, 0)
    # read by pread in the setting's pieces (with "auto" the worker's probe may choose larger
    # pread pieces: tests/test_mapped_read.py)
    streamed = _run(ds, piece_mib, read_method="pread")
    _same(whole, streamed)
    np.testing.assert_array_equal(np.asarray(streamed[3]), data.sum(axis=(0, 1)))
    records = _chunks(streamed[0])
    assert [r["made"] for r in records] == ["dense read, streamed"] * len(records)
    assert all(r["streamed"]["pieces"] > 1 for r in records)
    assert records[0]["streamed"]["piece_frames"] == (SCAN[1] if row_bytes else 4)
    for r in _chunks(whole[0]):
        assert r["streamed"] == {"used": False, "why": "streaming is off (stream_piece_mib = 0)"}
        assert r["made"] == "dense read"


def test_streamed_views_raw_and_arrays_match(rng: np.random.Generator, tmp_path: Path) -> None:
    data = _frames(rng, "uint16")
    head = 7
    with open(tmp_path / "d.raw", "wb") as f:
        for frame in data.reshape(-1, *DET):
            f.write(b"\xab" * head)
            f.write(frame.astype(">u2").tobytes())
    raw = qf.open(
        tmp_path / "d.raw",
        format="raw",
        dtype=">u2",
        frame_shape=DET,
        scan_shape=SCAN,
        frame_header_bytes=head,
        chunk_rows=5,
    )
    import h5py
    import hdf5plugin

    from tests.io.writers import write_dectris
    from tests.io.writers_mrc import write_mrc

    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("data", data=data)  # contiguous
        f.create_dataset("frames", data=data.reshape(-1, *DET), chunks=(1, *DET))
        # bitshuffle + LZ4, one frame per chunk: the Dectris layout (3-D) and 4-D
        f.create_dataset(
            "bslz4",
            data=data.reshape(-1, *DET),
            chunks=(1, *DET),
            **hdf5plugin.Bitshuffle(cname="lz4"),
        )
        f.create_dataset(
            "bslz4_4d", data=data, chunks=(1, 1, *DET), **hdf5plugin.Bitshuffle(cname="lz4")
        )
    views = {
        "hdf5 bitshuffle+lz4 frames": qf.open(
            tmp_path / "c.h5", dataset_path="/bslz4", scan_shape=SCAN, chunk_rows=4
        ),
        "hdf5 bitshuffle+lz4 4-D": qf.open(tmp_path / "c.h5", dataset_path="/bslz4_4d"),
        "dectris (data files of 40 frames)": qf.open(
            write_dectris(tmp_path, "acq", data.reshape(-1, *DET), frames_per_file=40),
            scan_shape=SCAN,
            chunk_rows=5,
        ),
        "hdf5 contiguous": qf.open(tmp_path / "c.h5", dataset_path="/data", chunk_rows=4),
        "hdf5 one frame per chunk": qf.open(
            tmp_path / "c.h5", dataset_path="/frames", scan_shape=SCAN, chunk_rows=4
        ),
        "mrc": qf.open(write_mrc(tmp_path / "d.mrc", data.reshape(-1, *DET)), scan_shape=SCAN),
        "raw": raw,
        "raw cropped and binned": raw.crop_scan((1, 8, 2, 13))
        .crop_detector((1, 15, 0, 12))
        .bin_detector(2),
        "array": qf.open(data, chunk_rows=3),
    }
    piece = 6 * DET[0] * DET[1] * 2 / (1 << 20)
    for name, ds in views.items():
        whole, streamed = _run(ds, 0), _run(ds, piece)
        _same(whole, streamed)
        # one bitshuffle + LZ4 chunk per frame: read as stored, hashed as stored, counted
        # on the bit planes or decoded a piece at a time (docs/bitplane-kernel.md)
        stored = name.startswith(("hdf5 bitshuffle", "dectris"))
        made = "stored chunks read, streamed" if stored else "dense read, streamed"
        assert all(r["made"] == made for r in _chunks(streamed[0])), name
        assert all(r["made"] != made for r in _chunks(whole[0])), name
    expected = data[1:8, 2:13, 1:15].reshape(7, 11, 7, 2, 6, 2).sum(axis=(3, 5))
    bf = _run(views["raw cropped and binned"], piece)[3]
    np.testing.assert_array_equal(np.asarray(bf), expected.sum(axis=(0, 1)))


def test_real_data_with_non_finite_pixels_stream_like_whole_chunks(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    data = _frames(rng, "float32")
    data[2, 3, 0, 0] = np.nan  # outside BF, inside ADF and CoM
    data[4, 1, 7, 5] = np.inf  # inside BF
    np.save(tmp_path / "f.npy", data)
    ds = qf.open(tmp_path / "f.npy", chunk_rows=4)
    piece = 8 * DET[0] * DET[1] * 4 / (1 << 20)
    with pytest.warns(NonFiniteWarning):
        whole = _run(ds, 0)
    with pytest.warns(NonFiniteWarning):
        streamed = _run(ds, piece)
    _same(whole, streamed)
    bf = np.asarray(streamed[0])
    assert np.isfinite(bf[2, 3]) and np.isposinf(bf[4, 1])
    assert (
        streamed[0].provenance.to_dict()["execution"]["non_finite"]
        == whole[0].provenance.to_dict()["execution"]["non_finite"]
    )


def test_gathered_pixels_stream_like_whole_chunks(rng: np.random.Generator, tmp_path: Path) -> None:
    data = _frames(rng, "uint16")
    np.save(tmp_path / "d.npy", data)
    ds = qf.open(tmp_path / "d.npy", chunk_rows=9)
    idx = np.array([0, 5, 6, 7, 40, 41, 100, DET[0] * DET[1] - 1])
    parts = {}
    for piece in (0, 4 * DET[0] * DET[1] * 2):
        for weights in (np.zeros((0, DET[0] * DET[1])), np.ones((1, DET[0] * DET[1]))):
            spec = PassSpec(
                dataset=ds,
                weights=weights,
                want_sum=False,
                want_max=False,
                runtime="cpu",
                gather=idx,
                stream_piece_bytes=piece,
            )
            parts[(piece, weights.shape[0])] = run_chunk_pass(spec, 0, 0, 9)
    expected = np.moveaxis(data.reshape(*SCAN, -1)[:, :, idx], -1, 0)
    for (piece, m), part in parts.items():
        rows, values = part.gathered[0]
        assert rows == (0, 9)
        np.testing.assert_array_equal(values, expected, err_msg=f"piece={piece} m={m}")
        assert part.records[0]["made"] == ("dense read, streamed" if piece else "dense read")
        if m:
            np.testing.assert_array_equal(
                part.blocks[0][1][..., 0], data.sum(axis=(2, 3), dtype=np.int64)
            )


def test_sources_that_decode_larger_units_are_loaded_whole(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    import h5py

    data = _frames(rng, "uint16")
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("data", data=data, chunks=(1, 4, *DET))
    ds = qf.open(tmp_path / "d.h5", dataset_path="/data", chunk_rows=9)
    why = why_not_streamed(ds, (0, 9), 1024)
    assert why is not None and "streams_blocks is False" in why
    with h5py.File(tmp_path / "z.h5", "w") as f:
        f.create_dataset("data", data=data.reshape(-1, *DET), chunks=(1, *DET), compression="gzip")
    zipped = qf.open(tmp_path / "z.h5", dataset_path="/data", scan_shape=SCAN, chunk_rows=9)
    assert not zipped.source.streams_blocks  # compressed: long runs of chunks read fastest
    np.save(tmp_path / "f.npy", np.asfortranarray(data))
    fortran = qf.open(tmp_path / "f.npy", chunk_rows=9)
    assert not fortran.source.streams_blocks
    small = qf.open(data, chunk_rows=1)
    why = why_not_streamed(small, (0, 1), 1 << 20)
    assert why is not None and "under two pieces" in why
    records = _chunks(_run(ds, 0.001)[0])
    assert records[0]["streamed"]["used"] is False
    assert "streams_blocks is False" in records[0]["streamed"]["why"]


def test_stream_pieces_cover_the_chunk_in_c_order() -> None:
    for rows, n_cols, frame, target in [
        ((3, 10), 13, 100, 1000),  # whole rows: 1300 > 1000, so column pieces
        ((3, 10), 13, 100, 2600),  # two rows per piece
        ((0, 5), 7, 64, 10**9),  # the whole chunk in one piece
        ((2, 4), 9, 100, 50),  # a frame over the target: 4 frames per piece
    ]:
        pieces = stream_pieces(rows, n_cols, frame, target)
        seen = np.zeros((rows[1] - rows[0], n_cols), dtype=int)
        last = (-1, -1)
        for (a, b), (c, d) in pieces:
            assert (a, c) > last
            last = (a, c)
            assert b - a == 1 or (c, d) == (0, n_cols)
            assert (d - c) % 4 == 0 or d == n_cols
            seen[a - rows[0] : b - rows[0], c:d] += 1
        assert (seen == 1).all(), (rows, n_cols, frame, target)


def test_row_digests_of_pieces_equal_the_whole_chunk_digests(rng: np.random.Generator) -> None:
    block = rng.integers(0, 60000, size=(3, 10, 4, 5), dtype=np.uint16)
    whole = payload_digests("dense", block, (7, 10))
    for pieces in (
        stream_pieces((7, 10), 10, 40, 100),
        stream_pieces((7, 10), 10, 40, 800),
        stream_pieces((7, 10), 10, 40, 10**6),
    ):
        d = DenseRowDigests(10)
        for (a, b), (c, e) in pieces:
            d.update((a, b), (c, e), block[a - 7 : b - 7, c:e])
        assert d.units == whole
    d = DenseRowDigests(10)
    d.update((7, 8), (0, 4), block[0:1, 0:4])
    with pytest.raises(ValueError, match="out of C order"):
        d.update((7, 8), (5, 10), block[0:1, 5:10])


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int32", "float32", "float64"])
@pytest.mark.parametrize("runtime_name", sorted(available_runtimes()))
def test_runtime_streams_conform_or_load_whole_chunks(
    runtime_name: str, dtype: str, rng: np.random.Generator
) -> None:
    runtime = get_runtime(runtime_name)
    offered = check_frame_pass_stream(lambda: runtime, dtype, rng=rng)
    # a runtime that overrides frame_pass_stream offers a stream (checked above); the
    # others return None and their chunks are loaded whole
    overrides = type(runtime).frame_pass_stream is not Runtime.frame_pass_stream
    assert offered == overrides
    if runtime_name == "cpu":
        assert offered
    # a stream that takes over the content digest hashes every row exactly
    took = check_stream_row_digests(lambda: runtime, dtype, rng=rng)
    if runtime_name == "cpu" and dtype in ("uint8", "uint16"):
        from quantem_flow.runtimes.cpu.dot_ir import host_isa

        assert took == (host_isa() is not None)  # where the integer dot kernel runs
    elif runtime_name == "cpu":
        assert not took  # the cell kernels leave the digest to the caller


@pytest.mark.parametrize("dtype", ["uint16", "float32"])
@pytest.mark.parametrize("structured", [True, False], ids=["structured", "fused"])
def test_per_frame_values_do_not_depend_on_the_split(dtype: str, structured: bool) -> None:
    """Every split of the frames into calls gives the same per-frame values, bit for bit.

    Real weight rows (general rows of the structured kernel, every row of the fused
    one) on real data used to round differently in a short last group of frames.
    """
    from quantem_flow.runtimes.cpu.kernels import frame_pass_variant

    rng = np.random.default_rng(2)
    shape = (30, 34)
    rr, cc = np.mgrid[: shape[0], : shape[1]]
    d = np.hypot(rr - 14.5, cc - 16.5)
    real = rng.standard_normal((2, d.size)) * (d < 12).ravel()
    weights = np.concatenate(
        [(d < 7).ravel()[None], real[:1], ((rr - 14.5) * (d < 7)).ravel()[None], real[1:]]
    ).astype(np.float64)
    n = 15
    frames = (rng.standard_normal((n, d.size)) * 300 + 1000).astype(dtype)

    def run(block: np.ndarray) -> np.ndarray:
        out, *_ = frame_pass_variant(
            block,
            weights,
            want_sum=False,
            want_max=False,
            frame_shape=shape,
            structured=structured,
        )
        return out

    whole = run(frames)
    for start in range(n):
        for stop in range(start + 1, n + 1):
            np.testing.assert_array_equal(
                run(frames[start:stop]), whole[start:stop], err_msg=f"frames {start}:{stop}"
            )


def test_frames_of_another_width_than_the_weights_are_refused() -> None:
    """The pass is sized by its weights: narrower or wider frames are a ShapeError, not a
    pattern of the weights' width (or a write past a zero-width pattern)."""
    from quantem_flow.errors import ShapeError
    from quantem_flow.runtimes.cpu import CpuRuntime

    for weights in (np.zeros((0, 5)), np.zeros((0, 0)), np.ones((2, 4))):
        with pytest.raises(ShapeError, match="pixels per frame"):
            CpuRuntime().frame_pass(
                np.ones((2, 3), dtype=np.uint16), weights, want_sum=True, want_max=True
            )


def test_bitshuffle_streams_only_one_whole_frame_per_chunk(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    """A piece decodes only its own chunks: one whole frame per chunk streams, others not."""
    import h5py
    import hdf5plugin

    from tests.io.writers import write_dectris

    frames = _frames(rng, "uint16").reshape(-1, *DET)
    layouts = {
        "one frame, lz4": ((1, *DET), "lz4", True),
        "one frame, zstd": ((1, *DET), "zstd", True),
        "two frames": ((2, *DET), "lz4", False),
        "half a frame": ((1, DET[0] // 2, DET[1]), "lz4", False),
    }
    with h5py.File(tmp_path / "b.h5", "w") as f:
        for name, (chunks, cname, _) in layouts.items():
            f.create_dataset(name, data=frames, chunks=chunks, **hdf5plugin.Bitshuffle(cname=cname))
    for name, (_, _, streams) in layouts.items():
        ds = qf.open(tmp_path / "b.h5", dataset_path=name, scan_shape=SCAN)
        assert ds.source.streams_blocks is streams, name
    packed = write_dectris(tmp_path, "c", frames, frames_per_file=50)
    plain = write_dectris(tmp_path, "u", frames, frames_per_file=50, compression=False)
    assert qf.open(packed, scan_shape=SCAN).source.streams_blocks
    assert not qf.open(plain, scan_shape=SCAN).source.streams_blocks
    ds = qf.open(tmp_path / "b.h5", dataset_path="one frame, zstd", scan_shape=SCAN)
    whole, streamed = _run(ds, 0), _run(ds, 6 * DET[0] * DET[1] * 2 / (1 << 20))
    _same(whole, streamed)
    assert all(r["made"] == "dense read, streamed" for r in _chunks(streamed[0]))
