"""The content digest carried in the kernel's sweep (runtimes/cpu/xxh3_ir.py, row_hash.py).

Every digest must equal ``xxhash.xxh3_128`` of the scan row's bytes, however
the row's frames are split into calls, whichever kernel carries the hash, and
a pass's provenance must be the same with the digest in the kernel or in a
sweep of its own.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

import quantem_flow as qf
from quantem_flow import config
from quantem_flow.graphs.streamed import run_streamed_chunk
from quantem_flow.runtimes import get_runtime
from quantem_flow.runtimes.cpu.dot_ir import DotISA, host_isa, runnable_isas
from quantem_flow.runtimes.cpu.dot_pass import DotPass
from quantem_flow.runtimes.cpu.prepared import PreparedFramePass
from quantem_flow.runtimes.cpu.row_hash import RowHasher, why_not_row_hasher
from quantem_flow.runtimes.cpu.stream import CpuFramePassStream
from quantem_flow.runtimes.cpu.structure import analyse_weights
from quantem_flow.runtimes.cpu.xxh3_ir import row_hasher_assembly

HOST = host_isa()
needs_dot = pytest.mark.skipif(HOST is None, reason="the integer dot kernel needs x86-64 with AVX2")


def _rows(frames: np.ndarray, row_frames: int) -> list[str]:
    """The reference: the library's XXH3-128 of each row's bytes."""
    n = frames.shape[0] // row_frames
    return [
        xxhash.xxh3_128_hexdigest(
            np.ascontiguousarray(frames[r * row_frames : (r + 1) * row_frames])
        )
        for r in range(n)
    ]


def _splits(rng: np.random.Generator, n: int) -> list[tuple[int, int]]:
    """Random consecutive ranges covering ``range(n)`` (single frames and long runs)."""
    cuts = sorted(set(rng.integers(1, n, size=max(1, n // 3)).tolist())) if n > 1 else []
    edges = [0, *cuts, n]
    return list(itertools.pairwise(edges))


@pytest.mark.parametrize(
    ("dtype", "frame_shape", "row_frames"),
    [
        ("uint8", (32, 32), 3),  # one block per frame
        ("uint16", (32, 32), 1),  # a row of one frame: its only block is the last
        ("uint16", (16, 32), 5),  # 1024-byte frames
        ("uint16", (128, 128), 7),  # 32 blocks per frame
        ("float32", (24, 32), 4),  # 3 blocks per frame
        ("int16", (64, 40), 2),
    ],
)
def test_rows_equal_the_library_however_split(
    rng: np.random.Generator, dtype: str, frame_shape: tuple[int, int], row_frames: int
) -> None:
    n_rows = 4
    k = frame_shape[0] * frame_shape[1]
    frames = (rng.random((n_rows * row_frames, k)) * 60000).astype(dtype)
    expect = _rows(frames, row_frames)
    for attempt in range(3):
        hasher = RowHasher(row_frames=row_frames, frame_nbytes=k * frames.itemsize)
        parts = [(0, frames.shape[0])] if attempt == 0 else _splits(rng, frames.shape[0])
        for a, b in parts:
            hasher.update(frames[a:b])
        assert hasher.digests() == expect, (dtype, frame_shape, parts)
        assert hasher.rows_done == n_rows and hasher.column == 0


def test_a_row_not_finished_has_no_digest_yet(rng: np.random.Generator) -> None:
    frames = rng.integers(0, 1000, size=(5, 512), dtype=np.uint16)
    hasher = RowHasher(row_frames=3, frame_nbytes=1024)
    hasher.update(frames)
    assert hasher.digests() == _rows(frames, 3)  # the first row only
    assert (hasher.rows_done, hasher.column) == (1, 2)


def test_many_rows_in_one_call_grow_the_output(rng: np.random.Generator) -> None:
    frames = rng.integers(0, 255, size=(300, 1024), dtype=np.uint8)
    hasher = RowHasher(row_frames=2, frame_nbytes=1024)
    hasher.update(frames[:1])
    hasher.update(frames[1:])
    assert hasher.digests() == _rows(frames, 2)


@pytest.mark.parametrize("nbytes", [0, 512, 1000, 1536, 4097])
def test_frames_that_are_not_whole_blocks_are_refused(nbytes: int) -> None:
    why = why_not_row_hasher(nbytes)
    assert why is not None and str(nbytes) in why and "1024" in why
    with pytest.raises(ValueError, match=str(nbytes)):
        RowHasher(row_frames=4, frame_nbytes=nbytes)
    assert why_not_row_hasher(3072) is None


def test_frames_of_another_size_are_refused(rng: np.random.Generator) -> None:
    hasher = RowHasher(row_frames=2, frame_nbytes=2048)
    with pytest.raises(ValueError, match="2048 bytes"):
        hasher.update(np.zeros((2, 512), dtype=np.uint16))
    with pytest.raises(ValueError, match="at least one frame"):
        RowHasher(row_frames=0, frame_nbytes=2048)
    with pytest.raises(TypeError, match="not pickled"):
        import pickle

        pickle.dumps(hasher)


def test_the_hasher_is_vectorised() -> None:
    asm = row_hasher_assembly()
    if HOST is None:
        pytest.skip("not x86-64 with AVX2: no vector instruction names to check")
    # the 32 x 32 -> 64-bit multiply of each stripe's lanes, in full-width registers
    reg = "%zmm" if HOST.bits == 512 else "%ymm"
    muls = [line for line in asm.splitlines() if "vpmuludq" in line and reg in line]
    assert len(muls) >= 16, asm[:2000]


def _plan_weights(shape: tuple[int, int], n_annuli: int) -> np.ndarray:
    kr, kc = shape
    rr, cc = np.mgrid[:kr, :kc]
    r = np.hypot(rr - kr / 2 + 0.5, cc - kc / 2)
    edges = np.linspace(0, min(kr, kc) / 2, n_annuli + 1)
    rows = [((r >= a) & (r < b)).ravel().astype(np.float64) for a, b in itertools.pairwise(edges)]
    return np.stack(rows)


@needs_dot
@pytest.mark.parametrize("isa", runnable_isas(), ids=lambda i: f"{i.bits}bit")
@pytest.mark.parametrize(
    ("dtype", "shape", "n_rows_w"),
    [
        ("uint16", (64, 64), 1),  # one disk: the kernel reads a window of the frame
        ("uint16", (32, 64), 3),
        ("uint8", (64, 48), 9),  # more vectors than one kernel holds: groups of kernels
        ("int16", (64, 32), 4),
    ],
)
def test_the_dot_kernel_carries_the_row_digests(
    rng: np.random.Generator, isa: DotISA, dtype: str, shape: tuple[int, int], n_rows_w: int
) -> None:
    w = _plan_weights(shape, n_rows_w)
    plan = analyse_weights(w, frame_shape=shape, force=True)
    dp = DotPass(plan, np.dtype(dtype), isa)
    if n_rows_w == 1:
        assert dp.first_pixel > 0
    if n_rows_w == 9:
        assert len(dp.groups) > 1
    k = shape[0] * shape[1]
    info = np.iinfo(np.dtype(dtype))
    row_frames = 6
    frames = rng.integers(int(info.min), int(info.max), size=(5 * row_frames, k), endpoint=True)
    frames = frames.astype(dtype)
    plain = np.zeros((frames.shape[0], plan.n_out))
    dp.run(frames, plain)
    hasher = RowHasher(row_frames=row_frames, frame_nbytes=k * frames.itemsize)
    carried = np.zeros_like(plain)
    for a, b in _splits(rng, frames.shape[0]):  # groups of four frames and the rest
        dp.run(frames[a:b], carried[a:b], hasher=hasher)
    assert hasher.digests() == _rows(frames, row_frames)
    np.testing.assert_array_equal(carried, plain)  # the values do not change


@needs_dot
def test_strided_frames_hash_the_frames_given(rng: np.random.Generator) -> None:
    shape = (32, 32)
    plan = analyse_weights(_plan_weights(shape, 3), frame_shape=shape, force=True)
    assert HOST is not None
    dp = DotPass(plan, np.dtype("uint16"), HOST)
    frames = rng.integers(0, 5000, size=(16, 1024), dtype=np.uint16)
    hasher = RowHasher(row_frames=4, frame_nbytes=2048)
    dp.run(frames[::2], np.zeros((8, plan.n_out)), hasher=hasher)  # a stride of two frames
    assert hasher.digests() == _rows(frames[::2], 4)


@pytest.mark.parametrize("why", ["float frames", "dot kernel off"])
def test_a_pass_without_the_dot_kernel_hashes_in_a_sweep_of_its_own(
    rng: np.random.Generator, why: str
) -> None:
    shape = (32, 32)
    w = _plan_weights(shape, 3)
    dtype = np.dtype(np.float32 if why == "float frames" else np.uint16)
    frames = (rng.random((12, 1024)) * 1000).astype(dtype)
    with config.set(integer_dot_kernel=why != "dot kernel off"):
        p = PreparedFramePass(
            w, dtype=dtype, n_frames=12, want_sum=False, want_max=False, frame_shape=shape
        )
        assert not p.runs_dot_kernel
        hasher = RowHasher(row_frames=3, frame_nbytes=1024 * dtype.itemsize)
        p.run(frames[:5], hasher=hasher)
        p.run(frames[5:], hasher=hasher)
    assert hasher.digests() == _rows(frames, 3)


def _stream(dtype: str, shape: tuple[int, int], **kw: Any) -> CpuFramePassStream:
    return CpuFramePassStream(
        _plan_weights(shape, 3),
        n_frames=kw.pop("n_frames", 8),
        frame_shape=shape,
        dtype=np.dtype(dtype),
        want_sum=kw.pop("want_sum", False),
        want_max=False,
        gather=kw.pop("gather", None),
    )


@needs_dot
def test_a_stream_takes_the_digest_only_where_its_kernel_can_carry_it() -> None:
    taken = _stream("uint16", (64, 64)).hash_rows(row_frames=4, frame_nbytes=8192)
    assert taken is not None and "dot kernel" in taken
    # not a whole number of blocks; float frames (cell kernels); patterns (cell kernels);
    # a gather alone (no kernel sweeps the frames)
    assert _stream("uint16", (30, 30)).hash_rows(row_frames=4, frame_nbytes=1800) is None
    assert _stream("float32", (64, 64)).hash_rows(row_frames=4, frame_nbytes=16384) is None
    s = _stream("uint16", (64, 64), want_sum=True)
    assert s.hash_rows(row_frames=4, frame_nbytes=8192) is None
    with pytest.raises(ValueError, match="hash_rows was not taken"):
        s.row_digests()
    gather_only = CpuFramePassStream(
        np.zeros((0, 4096)),
        n_frames=8,
        frame_shape=(64, 64),
        dtype=np.dtype(np.uint16),
        want_sum=False,
        want_max=False,
        gather=np.arange(10),
    )
    assert gather_only.hash_rows(row_frames=4, frame_nbytes=8192) is None
    fed = _stream("uint16", (64, 64))
    fed.feed(np.zeros((4, 4096), dtype=np.uint16))
    with pytest.raises(ValueError, match="before the first frames"):
        fed.hash_rows(row_frames=4, frame_nbytes=8192)


def _dataset(rng: np.random.Generator, tmp_path: Path) -> qf.Dataset4D:
    scan, det = (6, 10), (64, 64)
    rr, cc = np.mgrid[: det[0], : det[1]]
    lam = np.where(np.hypot(rr - 30.3, cc - 33.6) < 12, 900.0, 3.0)
    np.save(tmp_path / "d.npy", rng.poisson(lam, size=(*scan, *det)).astype(np.uint16))
    return qf.open(tmp_path / "d.npy", chunk_rows=3)


def _ops(ds: qf.Dataset4D) -> list[Any]:
    c = (30.3, 33.6)
    return [
        qf.virtual_bf(ds, radius=12, center=c),
        qf.virtual_adf(ds, inner=16, outer=math.inf, center=c),
        qf.center_of_mass(ds, center=c),
    ]


@needs_dot
@pytest.mark.parametrize("piece_frames", [4, 10], ids=["pieces-splitting-rows", "row-pieces"])
@pytest.mark.parametrize("read_method", ["pread", "mmap"])
def test_a_pass_digest_is_the_same_in_the_kernel_or_its_own_sweep(
    rng: np.random.Generator, tmp_path: Path, piece_frames: int, read_method: str
) -> None:
    ds = _dataset(rng, tmp_path)
    runs = {}
    for in_kernel in (True, False):
        with config.set(
            stream_piece_mib=piece_frames * 8192 / (1 << 20),
            map_piece_mib=piece_frames * 8192 / (1 << 20),
            digest_in_kernel=in_kernel,
            read_method=read_method,
        ):
            runs[in_kernel] = qf.compute(*_ops(ds), client="synchronous", progress=False)
    for x, y in zip(runs[True], runs[False], strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    digests = {k: v[0].provenance.source["content_digest"] for k, v in runs.items()}
    assert digests[True]["digest"] is not None
    assert digests[True] == digests[False]
    # and the library's digest of the rows, whole, names the same data as unloaded
    with config.set(stream_piece_mib=0):
        (whole,) = qf.compute(qf.virtual_bf(ds, radius=12), client="synchronous", progress=False)
    assert whole.provenance.execution["chunks"][0]["made"] == "dense read"
    assert whole.provenance.source["content_digest"]["digest"] == digests[True]["digest"]
    for in_kernel, result in runs.items():
        chunks = result[0].provenance.execution["chunks"]
        assert all(c["streamed"]["pieces"] > 1 for c in chunks)
        how = {c["streamed"]["digest"] for c in chunks}
        assert len(how) == 1
        line = how.pop()
        if in_kernel:
            assert "integer dot kernel" in line
            assert all(c["hash_s"] < 0.05 for c in chunks if "hash_s" in c)
        else:
            assert "sweep of its own" in line and "digest_in_kernel off" in line


@needs_dot
def test_a_stream_that_hashed_the_wrong_rows_is_an_error(
    rng: np.random.Generator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = _dataset(rng, tmp_path)
    monkeypatch.setattr(CpuFramePassStream, "row_digests", lambda self: ["0" * 32])
    weights = np.stack([np.ones(64 * 64)])
    with pytest.raises(RuntimeError, match="hashed 1 scan rows of a chunk of rows"):
        run_streamed_chunk(
            ds,
            get_runtime("cpu"),
            (0, 3),
            np.concatenate([weights, _plan_weights((64, 64), 2)]),
            want_sum=False,
            want_max=False,
            gather=None,
            piece_bytes=4 * 8192,
        )


@needs_dot
def test_mapped_pieces_swept_once_need_not_fit_a_cache(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    ds = _dataset(rng, tmp_path)  # rows of 10 frames of 8 KiB, chunks of 3 rows
    records = {}
    for in_kernel in (True, False):
        for method in ("mmap", "pread"):
            with config.set(
                stream_piece_mib=4 * 8192 / (1 << 20),  # 4 frames
                map_piece_mib=10 * 8192 / (1 << 20),  # one row
                digest_in_kernel=in_kernel,
                read_method=method,
            ):
                bf = qf.compute(*_ops(ds), client="synchronous", progress=False)[0]
            records[in_kernel, method] = bf.provenance.execution["chunks"][0]["streamed"]
    mapped = records[True, "mmap"]
    assert mapped["piece_frames"] == 10 and mapped["pieces"] == 3
    assert "map_piece_mib" in mapped["piece_size"] and "swept once" in mapped["piece_size"]
    for key in [(True, "pread"), (False, "mmap"), (False, "pread")]:
        assert records[key]["piece_frames"] == 4, key
        assert "cache-sized" in records[key]["piece_size"], key


@needs_dot
def test_a_hasher_that_cannot_compile_leaves_the_digest_to_the_pass(
    rng: np.random.Generator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from quantem_flow.runtimes.cpu import row_hash

    def broken() -> None:
        raise RuntimeError("no such LLVM pass")

    ds = _dataset(rng, tmp_path)
    (expected,) = qf.compute(qf.virtual_bf(ds, radius=12), client="synchronous", progress=False)
    monkeypatch.setattr(row_hash, "compile_row_hasher", broken)
    assert _stream("uint16", (64, 64)).hash_rows(row_frames=4, frame_nbytes=8192) is None
    assert "could not be compiled (RuntimeError: no such LLVM pass)" in caplog.text
    with config.set(stream_piece_mib=4 * 8192 / (1 << 20)):
        got = qf.compute(*_ops(ds), client="synchronous", progress=False)[0]
    chunks = got.provenance.execution["chunks"]
    assert all("sweep of its own" in c["streamed"]["digest"] for c in chunks)
    digest = got.provenance.source["content_digest"]["digest"]
    assert digest == expected.provenance.source["content_digest"]["digest"]
