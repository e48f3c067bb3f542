"""Bit-plane sums on stored bitshuffle + LZ4 frames (runtimes/cpu/bitplane.py): the cells' bits.

The stored chunks are written here with the bitshuffle library's own encoder
and the HDF5 filter's 12-byte header (and, in tests/test_stored_pass.py, by
h5py + hdf5plugin into real files); the reference is the CPU runtime's frame
pass on the decoded values with the bit-plane kernel out of the way.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from quantem_flow import config
from quantem_flow.errors import CorruptChunkError
from quantem_flow.operators.geometry import annulus
from quantem_flow.representations.stored import StoredFrames, concat_stored
from quantem_flow.runtimes.cpu.bitplane import BitplanePass, _streams, bitplane_pass_for
from quantem_flow.runtimes.cpu.prepared import PreparedFramePass
from quantem_flow.runtimes.cpu.structure import analyse_weights, structured_vectors

bitshuffle = pytest.importorskip("bitshuffle")


def _weights(shape: tuple[int, int], center: tuple[float, float], com: bool = True) -> np.ndarray:
    kr, kc = shape
    rows = [
        annulus(shape, center, 0.0, min(kr, kc) / 6, (1.0, 1.0)).ravel(),
        annulus(shape, center, min(kr, kc) / 4, max(kr, kc), (1.0, 1.0)).ravel(),
        annulus(shape, center, min(kr, kc) / 8, min(kr, kc) / 3, (1.0, 1.0)).ravel(),
    ]
    if com:
        rr = np.repeat(np.arange(kr, dtype=np.float64), kc) - center[0]
        cc = np.tile(np.arange(kc, dtype=np.float64), kr) - center[1]
        disk = annulus(shape, center, 0.0, min(kr, kc) / 3, (1.0, 1.0)).ravel()
        rows += [np.ones(kr * kc), rr, cc, disk * rr, disk * cc]
    return np.stack([np.asarray(r, dtype=np.float64) for r in rows])


def _frames(dtype: str, n: int, k: int, seed: int = 0, counted: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    info = np.iinfo(np.dtype(dtype))
    if counted:  # small counts: most high planes are zero
        return rng.poisson(3.0, size=(n, k)).clip(0, info.max).astype(dtype)
    # 32-bit values within 2**20: the structured pass's exactness bound (sums in float64)
    lo, hi = (
        (max(int(info.min), -(2**20)), min(int(info.max), 2**20))
        if info.bits == 32
        else (
            int(info.min),
            int(info.max),
        )
    )
    fr = rng.integers(lo, hi, size=(n, k), endpoint=True).astype(dtype)
    fr[0] = hi
    if n > 1:
        fr[1] = lo
    return fr


def chunk_of(frame: np.ndarray, block: int = 0) -> np.ndarray:
    """One frame as the HDF5 bitshuffle filter stores it (header, then LZ4 blocks)."""
    flat = np.ascontiguousarray(frame).ravel()
    body = bitshuffle.compress_lz4(flat, block)
    size = block or max(128, (8192 // flat.itemsize) // 8 * 8)
    header = struct.pack(">QI", flat.nbytes, size * flat.itemsize)
    return np.frombuffer(header + body.tobytes(), dtype=np.uint8)


def stored_of(
    frames: np.ndarray,
    shape: tuple[int, int],
    *,
    block: int = 0,
    unwritten: tuple[int, ...] = (),
    unfiltered: tuple[int, ...] = (),
    fill: int = 0,
    blocks: dict[int, int] | None = None,
) -> StoredFrames:
    """Stored frames with 5 stray bytes before each chunk (as the B-tree nodes between runs)."""
    parts, starts, sizes = [], [], []
    pos = 0
    for i, f in enumerate(frames):
        if i in unwritten:
            starts.append(-1)
            sizes.append(0)
            continue
        raw = (
            np.ascontiguousarray(f).view(np.uint8)
            if i in unfiltered
            else chunk_of(f, (blocks or {}).get(i, block))
        )
        parts += [np.full(5, 0xEE, dtype=np.uint8), raw]
        starts.append(pos + 5)
        sizes.append(raw.size)
        pos += 5 + raw.size
    n = len(frames)
    return StoredFrames(
        data=np.concatenate(parts) if parts else np.zeros(0, np.uint8),
        starts=np.array(starts, dtype=np.int64),
        sizes=np.array(sizes, dtype=np.int64),
        unfiltered=np.isin(np.arange(n), unfiltered),
        dtype=frames.dtype,
        frame_shape=shape,
        fill=fill,
        where="the test's frames",
        numbers=np.arange(100, 100 + n, dtype=np.int64),
    )


def reference(weights: np.ndarray, frames: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    with config.set(bitplane_kernel=False):
        p = PreparedFramePass(
            weights,
            dtype=frames.dtype,
            n_frames=frames.shape[0],
            want_sum=False,
            want_max=False,
            frame_shape=shape,
        )
        p.run(frames.reshape(frames.shape[0], -1))
    return p.result()[0]


def stored_pass(weights: np.ndarray, stored: StoredFrames) -> PreparedFramePass:
    p = PreparedFramePass(
        weights,
        dtype=stored.dtype,
        n_frames=stored.n_frames,
        want_sum=False,
        want_max=False,
        frame_shape=stored.frame_shape,
    )
    p.run_stored(stored)
    return p


SHAPES = [(128, 128), (130, 130), (24, 20), (64, 72)]


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16"])
@pytest.mark.parametrize("shape", SHAPES)
def test_bit_for_bit_the_cell_kernels(dtype: str, shape: tuple[int, int]) -> None:
    k = shape[0] * shape[1]
    frames = _frames(dtype, 9, k, seed=k)
    w = _weights(shape, (shape[0] / 2 - 0.3, shape[1] / 2 + 0.7))
    p = stored_pass(w, stored_of(frames, shape))
    assert "bit-plane counts" in p.variant["kernel"], p.variant
    np.testing.assert_array_equal(p.result()[0], reference(w, frames, shape))


@pytest.mark.parametrize("block", [8, 64, 512, 1000, 4096])
def test_every_block_size(block: int) -> None:
    """Blocks not a whole number of 64-bit words per plane are padded; the rest of 8 too."""
    shape = (50, 70)
    frames = _frames("uint16", 5, 3500, seed=block, counted=True)
    w = _weights(shape, (24.2, 35.9))
    p = stored_pass(w, stored_of(frames, shape, block=block))
    np.testing.assert_array_equal(p.result()[0], reference(w, frames, shape))


def test_block_sizes_may_change_from_frame_to_frame() -> None:
    shape = (128, 128)
    frames = _frames("uint16", 6, shape[0] * shape[1], counted=True)
    w = _weights(shape, (63.7, 64.2))
    stored = stored_of(frames, shape, blocks={1: 512, 2: 1024, 4: 512})
    p = stored_pass(w, stored)
    np.testing.assert_array_equal(p.result()[0], reference(w, frames, shape))


def test_unwritten_and_unfiltered_frames() -> None:
    shape = (32, 40)
    frames = _frames("int16", 7, 1280, seed=3)
    frames[2] = 11  # the fill value, as the reader would give it
    w = _weights(shape, (15.5, 20.25))
    stored = stored_of(frames, shape, unwritten=(2,), unfiltered=(0, 5), fill=11)
    p = stored_pass(w, stored)
    np.testing.assert_array_equal(p.result()[0], reference(w, frames, shape))
    np.testing.assert_array_equal(stored.decode(), frames)


def test_pieces_in_any_split_equal_the_whole() -> None:
    shape = (64, 64)
    frames = _frames("uint16", 12, 4096, counted=True)
    w = _weights(shape, (31.6, 32.1))
    stored = stored_of(frames, shape)
    p = PreparedFramePass(
        w, dtype=frames.dtype, n_frames=12, want_sum=False, want_max=False, frame_shape=shape
    )
    for a, b in ((0, 1), (1, 6), (6, 12)):
        part = StoredFrames(
            data=stored.data,
            starts=stored.starts[a:b],
            sizes=stored.sizes[a:b],
            unfiltered=stored.unfiltered[a:b],
            dtype=stored.dtype,
            frame_shape=shape,
            fill=0,
            where=stored.where,
            numbers=stored.numbers[a:b],
        )
        p.run_stored(part)
    np.testing.assert_array_equal(p.result()[0], reference(w, frames, shape))


def test_concatenated_runs() -> None:
    shape = (16, 16)
    a = _frames("uint8", 3, 256, seed=1)
    b = _frames("uint8", 2, 256, seed=2)
    joined = concat_stored([stored_of(a, shape), stored_of(b, shape, unwritten=(1,))])
    want = np.concatenate([a, b])
    want[4] = 0
    np.testing.assert_array_equal(joined.decode(), want)
    w = _weights(shape, (7.5, 8.2))
    np.testing.assert_array_equal(stored_pass(w, joined).result()[0], reference(w, want, shape))


def test_moment_vectors_split_into_masks_exactly() -> None:
    """Each vector equals the sum of its masks times their coefficients."""
    shape = (130, 70)
    w = _weights(shape, (64.3, 33.9))
    plan = analyse_weights(w, frame_shape=shape)
    bp = BitplanePass(plan, np.dtype(np.uint16))
    rebuilt = np.zeros_like(bp.vectors)
    for mask, vector, coef in _streams(bp.vectors):
        rebuilt[vector] += coef * mask
    np.testing.assert_array_equal(rebuilt, bp.vectors)
    assert len(structured_vectors(plan)) >= bp.n_vectors


def _corrupt(stored: StoredFrames, frame: int, offset: int, value: int) -> StoredFrames:
    data = stored.data.copy()
    data[int(stored.starts[frame]) + offset] = value
    return StoredFrames(**{**stored.__dict__, "data": data})


@pytest.mark.parametrize(
    ("offset", "value", "words"),
    [
        (3, 0x7F, "uncompressed bytes"),  # the header's size
        (11, 0x03, "block size"),  # the header's block size
        (12, 0x7F, "block lengths"),  # the first block's length
        (20, 0x00, "frame 102"),  # inside the LZ4 data
    ],
)
def test_corrupt_chunks_are_named(offset: int, value: int, words: str) -> None:
    shape = (64, 64)
    frames = _frames("uint16", 4, 4096, counted=True)
    stored = _corrupt(stored_of(frames, shape), 2, offset, value)
    if offset == 20:  # a damaged LZ4 stream: make it certain the decoder stops
        data = stored.data.copy()
        a = int(stored.starts[2])
        data[a + 16 : a + int(stored.sizes[2])] = 0xFF
        stored = StoredFrames(**{**stored.__dict__, "data": data})
    w = _weights(shape, (31.6, 32.1), com=False)
    with pytest.raises(CorruptChunkError, match="frame 102") as info:
        stored_pass(w, stored)
    assert words in str(info.value) or words == "frame 102"
    with pytest.raises(CorruptChunkError, match="frame 102"):
        stored.decode()


def test_unfiltered_chunk_of_the_wrong_size() -> None:
    shape = (8, 8)
    frames = _frames("uint16", 2, 64)
    stored = stored_of(frames, shape, unfiltered=(1,))
    short = StoredFrames(**{**stored.__dict__, "sizes": stored.sizes - np.array([0, 2])})
    with pytest.raises(CorruptChunkError, match="unfiltered with 126 bytes, expected 128"):
        stored_pass(_weights(shape, (3.5, 3.5), com=False), short)


def test_when_the_pass_decodes_instead() -> None:
    shape = (32, 32)
    frames = _frames("uint16", 4, 1024, counted=True)
    stored = stored_of(frames, shape)
    w = _weights(shape, (15.2, 16.3))
    general = np.concatenate([w, np.random.default_rng(0).random((1, 1024))])
    cases = {
        "general rows": (general, {}),
        "sum or maximum pattern": (w, {"want_sum": True}),
        "setting bitplane_kernel": (w, {"setting": False}),
    }
    for words, (weights, opts) in cases.items():
        with config.set(bitplane_kernel=opts.get("setting", True)):
            p = PreparedFramePass(
                weights,
                dtype=frames.dtype,
                n_frames=4,
                want_sum=bool(opts.get("want_sum", False)),
                want_max=False,
                frame_shape=shape,
            )
            p.run_stored(stored)
        assert words in p.variant["stored"], p.variant
        np.testing.assert_array_equal(p.result()[0], reference(weights, frames, shape))


@pytest.mark.parametrize("dtype", ["uint32", "int32"])
def test_32_bit_planes_directly(dtype: str) -> None:
    """32-bit frames: the pass's plan is never structured (its exactness bound takes the
    dtype's range), but the kernel counts 32 planes, the top one negative when signed."""
    shape = (40, 56)
    frames = _frames(dtype, 5, 2240, seed=5)
    frames[2] = np.iinfo(np.dtype(dtype)).max
    frames[3] = np.iinfo(np.dtype(dtype)).min
    w = _weights(shape, (19.5, 27.5), com=False)
    plan = analyse_weights(w, frame_shape=shape, force=True)
    bp = BitplanePass(plan, np.dtype(dtype))
    out = np.zeros((5, plan.n_out))
    bp.run(stored_of(frames, shape), out)
    want = frames.astype(np.int64) @ np.rint(w.T).astype(np.int64)
    np.testing.assert_array_equal(out[:, : w.shape[0]], want.astype(np.float64))


def test_full_range_32_bit_values_decode() -> None:
    """Sums past 2**53 are not exact in float64: no structured rows, so no bit planes."""
    shape = (128, 128)
    frames = np.full((2, 16384), 2**32 - 1, dtype=np.uint32)
    w = _weights(shape, (31.5, 31.5))
    p = stored_pass(w, stored_of(frames, shape))
    assert "no structured rows" in p.variant["stored"]
    np.testing.assert_array_equal(p.result()[0], reference(w, frames, shape))


def test_float_frames_are_not_taken() -> None:
    plan = analyse_weights(_weights((16, 16), (7.5, 7.5)), frame_shape=(16, 16))
    found, why = bitplane_pass_for(plan, np.dtype(np.float32), want_patterns=False)
    assert found is None and "float32" in why


def test_a_block_size_larger_than_the_frame_is_one_block() -> None:
    """The format lays such a frame out as one block; a huge size costs no memory."""
    shape = (20, 24)
    frames = _frames("uint16", 3, 480, seed=8, counted=True)
    parts = []
    for f in frames:
        body = bitshuffle.compress_lz4(np.ascontiguousarray(f), 480).tobytes()
        header = struct.pack(">QI", f.nbytes, (1 << 28) * 2)  # 2**28 values per block
        parts.append(np.frombuffer(header + body, dtype=np.uint8))
    stored = StoredFrames(
        data=np.concatenate(parts),
        starts=np.cumsum([0] + [p.size for p in parts[:-1]]).astype(np.int64),
        sizes=np.array([p.size for p in parts], dtype=np.int64),
        unfiltered=np.zeros(3, dtype=bool),
        dtype=np.dtype(np.uint16),
        frame_shape=shape,
        fill=0,
        where="frames with a huge block size",
        numbers=np.arange(3, dtype=np.int64),
    )
    np.testing.assert_array_equal(stored.decode(), frames)
    w = _weights(shape, (9.5, 11.5))
    np.testing.assert_array_equal(stored_pass(w, stored).result()[0], reference(w, frames, shape))


def test_a_corrupt_block_size_is_refused_before_anything_is_planned() -> None:
    shape = (64, 64)
    frames = _frames("uint16", 3, 4096, counted=True)
    stored = stored_of(frames, shape)
    data = stored.data.copy()
    a = int(stored.starts[1])
    # 64 values per block: the chunk's single block of 4096 no longer fits its header
    data[a + 8 : a + 12] = np.frombuffer(struct.pack(">I", 64 * 2), dtype=np.uint8)
    bad = StoredFrames(**{**stored.__dict__, "data": data})
    with pytest.raises(CorruptChunkError, match=r"frame 101.*block lengths"):
        stored_pass(_weights(shape, (31.5, 31.5)), bad)


def test_stored_frames_refuse_chunks_outside_their_bytes() -> None:
    stored = stored_of(_frames("uint8", 2, 64), (8, 8))
    with pytest.raises(ValueError, match="lies outside"):
        StoredFrames(**{**stored.__dict__, "sizes": stored.sizes + 1000})
    with pytest.raises(ValueError, match="of one length"):
        StoredFrames(**{**stored.__dict__, "numbers": stored.numbers[:1]})
    with pytest.raises(ValueError, match="C-contiguous"):
        stored.decode(np.empty((64, 2), dtype=np.uint8).T)
