"""The payload contract: put -> handle, run_frame_pass / run_gather on it, release.

Also: the engine's streaming passes put and release every chunk, persisted
chunks are put once, and Dask forgetting a resident chunk releases it (a
counting runtime registered in process, on a real LocalCluster).  The CUDA
runtime's residency of paired, packed and encoded payloads is checked with
a fake ``cupy`` module: which arrays cross to the "device" and when (the
kernels themselves need a GPU and are checked by ``benchmarks/gpu_check.sh``).
"""

from __future__ import annotations

import sys
import threading
import time
import types
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import ParameterError, UnsupportedOperationError
from quantem_flow.representations import Chunk, chunk_of, get_representation
from quantem_flow.runtimes import get_runtime
from quantem_flow.runtimes.base import RELEASED
from quantem_flow.runtimes.cpu import CpuRuntime
from quantem_flow.runtimes.cpu.spec import KERNELS as CPU_KERNELS
from quantem_flow.runtimes.registry import RuntimeSpec, register_runtime, unregister_runtime
from tests.conftest import dask_thread_cluster, probe_data

DET = (9, 14)


def _frames(rng: np.random.Generator, n: int = 12, dtype: Any = np.uint16) -> np.ndarray:
    block = rng.poisson(0.4, size=(3, n // 3, *DET)).astype(dtype)
    block[0, 0, 0, 0] = 7
    return block


def test_cpu_put_keeps_the_payload_on_the_host(rng: np.random.Generator) -> None:
    rt = CpuRuntime()
    host = chunk_of("dense", _frames(rng))
    handle = rt.put(host)
    assert handle is host and handle.residency == "host" and rt.residency == "host"
    w = np.ones((1, DET[0] * DET[1]))
    got = rt.run_frame_pass(handle, w, want_sum=True, want_max=True)
    np.testing.assert_array_equal(got.per_frame[:, 0], host.payload.reshape(12, -1).sum(axis=1))
    idx = np.array([0, 5, 125])
    np.testing.assert_array_equal(rt.run_gather(handle, idx), host.payload.reshape(12, -1)[:, idx])
    rt.release(handle)
    rt.release(handle)  # a no-op, twice
    assert handle.payload is not RELEASED
    # a host runtime's put records itself as the holder when another name made the chunk
    mine = rt.put(Chunk("dense", "host", ((0, 3), (0, 4)), host.payload, "dense-v1", "other"))
    assert mine.runtime == "cpu" and mine.payload is host.payload


def test_undeclared_triples_and_foreign_handles_are_refused(rng: np.random.Generator) -> None:
    rt = CpuRuntime()
    flags = chunk_of("dense", np.zeros((1, 2, *DET), dtype=bool))
    with pytest.raises(UnsupportedOperationError, match=r"'dense' bool payloads.*runtimes that do"):
        rt.put(flags)
    with pytest.raises(UnsupportedOperationError, match="'frame_pass' kernel for 'dense' bool"):
        rt.run_frame_pass(flags, np.ones((1, 126)), want_sum=False, want_max=False)
    with pytest.raises(UnsupportedOperationError, match="'gather' kernel for 'dense' bool"):
        rt.run_gather(flags, np.arange(3))
    on_gpu = Chunk("dense", "cuda:0", ((0, 1), (0, 2)), np.zeros((1, 2, *DET)), "dense-v1", "cuda")
    with pytest.raises(ParameterError, match=r"resident on 'cuda:0'.*run it on 'cuda'"):
        rt.run_frame_pass(on_gpu, np.ones((1, 126)), want_sum=False, want_max=False)
    with pytest.raises(ParameterError, match=r"put\(\) takes host chunks"):
        rt.put(on_gpu)


def _mps() -> Any:
    from quantem_flow.errors import RuntimeUnavailableError

    try:
        return get_runtime("mps")
    except RuntimeUnavailableError as exc:
        pytest.skip(f"mps unavailable: {exc}")


@pytest.mark.mps
def test_mps_put_moves_dense_payloads_to_mlx_and_release_frees_them(
    rng: np.random.Generator,
) -> None:
    import mlx.core as mx

    rt = _mps()
    block = _frames(rng, dtype=np.int32)
    host = chunk_of("dense", block)
    handle = rt.put(host)
    assert isinstance(handle.payload, mx.array) and host.payload is block
    assert (handle.residency, handle.runtime, handle.nbytes) == ("mps", "mps", block.nbytes)
    assert rt.put(handle) is handle  # already resident: unchanged
    w = rng.standard_normal((3, block.shape[2] * block.shape[3]))
    ref = CpuRuntime().run_frame_pass(host, w, want_sum=True, want_max=True)
    got = rt.run_frame_pass(handle, w, want_sum=True, want_max=True)
    np.testing.assert_allclose(got.per_frame, ref.per_frame, rtol=1e-12)
    assert got.pattern_sum is not None and ref.pattern_sum is not None
    np.testing.assert_array_equal(got.pattern_sum, ref.pattern_sum)
    idx = np.array([3, 0, 125, 7])
    gathered = rt.run_gather(handle, idx)
    assert gathered.dtype == np.int32
    np.testing.assert_array_equal(gathered, block.reshape(12, -1)[:, idx])
    rt.release(handle)
    assert handle.payload is RELEASED and handle.nbytes == 0
    rt.release(handle)  # idempotent
    with pytest.raises(ParameterError, match="released"):
        rt.run_frame_pass(handle, w, want_sum=False, want_max=False)
    paired = chunk_of("paired", get_representation("paired").from_dense(block.astype(np.uint16)))
    held = rt.put(paired)  # issue 16: paired payloads stay resident in MLX too
    assert (held.residency, held.nbytes) == ("mps", paired.nbytes)
    rt.release(held)


# ----------------------------------------------------------------------------- counting runtime


class CountingRuntime(CpuRuntime):
    """The CPU kernels on payloads it "holds" (copies), counting puts and releases."""

    name: ClassVar[str] = "counting"
    lock = threading.Lock()
    puts: ClassVar[list[tuple[int, int]]] = []
    releases: ClassVar[list[tuple[int, int]]] = []

    def put(self, chunk: Chunk, *, reload: Any = None) -> Chunk:
        handle = super().put(chunk, reload=reload)
        if handle is not chunk:
            with self.lock:
                self.puts.append(chunk.scan_slice[0])
        return handle

    def _put_payload(self, representation: str, payload: Any) -> Any:
        return np.array(payload, copy=True) if representation == "dense" else payload

    def release(self, chunk: Chunk) -> None:
        if chunk.payload is not RELEASED:
            with self.lock:
                self.releases.append(chunk.scan_slice[0])
        super().release(chunk)


COUNTING = RuntimeSpec(
    name="counting",
    factory=f"{__name__}:CountingRuntime",
    dependency=None,
    kernels=frozenset(k for k in CPU_KERNELS if k[0] != "ssb"),
    residency="counting",
    description="test: counts put and release",
)


@pytest.fixture
def counting() -> Iterator[type[CountingRuntime]]:
    register_runtime(COUNTING)
    CountingRuntime.puts.clear()
    CountingRuntime.releases.clear()
    try:
        yield CountingRuntime
    finally:
        unregister_runtime("counting")


def _queries(ds: qf.Dataset4D) -> list[Any]:
    return [qf.virtual_bf(ds, radius=4.0, center=(9.0, 12.0)), qf.sum_diffraction(ds)]


def test_streaming_passes_put_run_and_release_every_chunk(
    counting: type[CountingRuntime], rng: np.random.Generator
) -> None:
    data = probe_data(rng, scan=(7, 5), det=(18, 24))
    ds = qf.open(data, chunk_rows=2)
    got = qf.compute(*_queries(ds), backend="counting", client="synchronous")
    ref = qf.compute(*_queries(ds), backend="cpu", client="synchronous")
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_array_equal(a.data, b.data)
    chunks = [tuple(c) for c in ds.chunks]
    assert sorted(counting.puts) == chunks and sorted(counting.releases) == chunks
    records = got[0].provenance.execution["chunks"]
    assert {r["residency"] for r in records} == {"counting"}


def test_persisted_chunks_are_put_once_and_released_with_the_dataset(
    counting: type[CountingRuntime], rng: np.random.Generator
) -> None:
    data = probe_data(rng, scan=(7, 5), det=(18, 24))
    p = qf.open(data, chunk_rows=3).persist(client="synchronous", backend="counting")
    chunks = [tuple(c) for c in p.chunks]
    assert sorted(counting.puts) == chunks and counting.releases == []
    assert p.resident.resident_bytes == data.nbytes  # Chunk.nbytes: the resident payload
    for _ in range(2):
        qf.compute(*_queries(p), client="synchronous")
    assert sorted(counting.puts) == chunks  # queries put nothing more
    refs = list(p.resident.refs)
    p.release()
    assert sorted(counting.releases) == chunks
    assert all(r.payload is RELEASED for r in refs)


@pytest.mark.cluster
def test_dask_forgetting_a_resident_chunk_releases_it(
    counting: type[CountingRuntime], rng: np.random.Generator
) -> None:
    import psutil
    from distributed import Client

    from quantem_flow.graphs.worker import worker_options

    data = probe_data(rng, scan=(8, 5), det=(18, 24))
    # an in-process worker counts this whole test process (its RSS grows over a long
    # session) against memory_limit: give tasks 2 GiB beyond what the process holds
    rss = int(psutil.Process().memory_info().rss)
    opts = worker_options(runtimes=["cpu", "counting"], memory_limit=int(rss / 0.8) + (2 << 30))
    with (
        dask_thread_cluster(threads_per_worker=2, **opts) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        p = qf.open(data, chunk_rows=2).persist(client=client, backend="counting")
        chunks = [tuple(c) for c in p.chunks]
        assert sorted(counting.puts) == chunks and counting.releases == []
        (bf, total) = qf.compute(*_queries(p), client=client)
        np.testing.assert_array_equal(total.data, data.sum(axis=(0, 1), dtype=np.int64))
        assert {r["resident"] for r in bf.provenance.execution["chunks"]} == {True}

        def held(dask_worker: Any) -> dict[str, int]:
            return dict(dask_worker.data.resident_bytes())

        (on_worker,) = client.run(held).values()
        assert on_worker.get("counting/dense") == data.nbytes
        p.release()
        deadline = time.monotonic() + 20
        while len(counting.releases) < len(chunks) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # a second release would show up here
        assert sorted(counting.releases) == chunks  # each chunk released exactly once
        (on_worker,) = client.run(held).values()
        assert "counting/dense" not in on_worker


# ----------------------------------------------------------------------------- CUDA residency


class FakeDeviceArray(np.ndarray):
    """Stands for a CuPy array: memory "on the device"."""


class FakeCupy(types.ModuleType):
    """Just enough of CuPy for the Python side of the CUDA kernels; records every upload."""

    ndarray = FakeDeviceArray
    int32, int64, uint8, uint32, uint64 = np.int32, np.int64, np.uint8, np.uint32, np.uint64
    float64 = np.float64

    def __init__(self) -> None:
        super().__init__("cupy")
        self.uploads: list[np.ndarray] = []
        device = types.SimpleNamespace(id=0, synchronize=lambda: None)
        self.cuda = types.SimpleNamespace(Device=lambda *a: device)

    def asarray(self, a: Any, dtype: Any = None) -> FakeDeviceArray:
        if isinstance(a, FakeDeviceArray) and (dtype is None or np.dtype(dtype) == a.dtype):
            return a  # what CuPy does: no copy, no transfer
        host = np.asarray(a)
        self.uploads.append(host)
        return np.array(host, dtype=dtype).view(FakeDeviceArray)

    def _make(self, fn: Any, *args: Any, **kwargs: Any) -> FakeDeviceArray:
        out: FakeDeviceArray = fn(*args, **kwargs).view(FakeDeviceArray)
        return out

    def zeros(self, *args: Any, **kwargs: Any) -> FakeDeviceArray:
        return self._make(np.zeros, *args, **kwargs)

    def empty(self, *args: Any, **kwargs: Any) -> FakeDeviceArray:
        return self._make(np.zeros, *args, **kwargs)

    def full(self, *args: Any, **kwargs: Any) -> FakeDeviceArray:
        return self._make(np.full, *args, **kwargs)

    def asnumpy(self, a: Any) -> np.ndarray:
        return np.asarray(a).view(np.ndarray).copy()


class _NoKernels:
    def get_function(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class _FakeCudaRuntime:
    """What grouped_frame_pass asks of the CUDA runtime: the dense pass."""

    def frame_pass(self, frames: Any, weights: Any, *, want_sum: bool, want_max: bool) -> Any:
        return CpuRuntime().frame_pass(
            np.asarray(frames).view(np.ndarray), weights, want_sum=want_sum, want_max=want_max
        )


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> FakeCupy:
    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr("quantem_flow.runtimes.cuda._module", lambda name: _NoKernels())
    import quantem_flow.runtimes as runtimes

    real = runtimes.get_runtime
    monkeypatch.setattr(
        runtimes,
        "get_runtime",
        lambda name: _FakeCudaRuntime() if name == "cuda" else real(name),
    )
    return fake


def _cuda_with(fake: FakeCupy) -> Any:
    from quantem_flow.runtimes.cuda import CudaRuntime

    rt = CudaRuntime()
    rt.to_device = lambda a: fake.asarray(np.ascontiguousarray(a))  # type: ignore[method-assign]
    return rt


@pytest.mark.parametrize("rep", ["paired", "packed", "encoded"])
def test_cuda_keeps_non_dense_payloads_on_the_device(
    rep: str, fake_cupy: FakeCupy, rng: np.random.Generator
) -> None:
    from quantem_flow.runtimes.cuda.resident import DEVICE_FIELDS, DevicePayload

    block = _frames(rng, n=18)
    options: dict[str, Any] = {}
    if rep == "encoded":  # several pieces, several LZ4 blocks each, raw tails
        options = {"codec": "bitshuffle-lz4", "frames_per_piece": 4, "block_size": 64}
    payload = get_representation(rep).from_dense(block, **options)
    rt = _cuda_with(fake_cupy)
    handle = rt.put(chunk_of(rep, payload))
    assert (handle.residency, handle.runtime) == ("cuda:0", "cuda")
    resident = handle.payload
    assert isinstance(resident, DevicePayload)
    assert handle.nbytes == payload.nbytes  # the resident payload's bytes, for placement budgets
    uploaded = {id(a) for a in fake_cupy.uploads}
    for name in DEVICE_FIELDS[rep]:
        assert isinstance(getattr(resident, name), FakeDeviceArray), name
        np.testing.assert_array_equal(np.asarray(getattr(resident, name)), getattr(payload, name))
    assert len(uploaded) == len(DEVICE_FIELDS[rep])
    # running it twice uploads weights and small tables only: never a payload array again
    fake_cupy.uploads.clear()
    w = np.ones((2, DET[0] * DET[1]))
    for _ in range(2):
        rt.run_frame_pass(handle, w, want_sum=True, want_max=True)
    big = max(int(getattr(payload, n).nbytes) for n in DEVICE_FIELDS[rep])
    again = [a.nbytes for a in fake_cupy.uploads if a.nbytes >= big and a.nbytes > w.nbytes]
    assert again == [], f"payload arrays uploaded again: {again} bytes"
    # gather and to_host read the device copy back exactly
    back = resident.to_host(fake_cupy.asnumpy)
    np.testing.assert_array_equal(get_representation(rep).to_dense(back), block)
    idx = np.array([0, 17, 125])
    np.testing.assert_array_equal(rt.run_gather(handle, idx), block.reshape(18, -1)[:, idx])
    rt.release(handle)
    assert handle.payload is RELEASED and resident.freed and not resident.arrays
    rt.release(handle)
    with pytest.raises(ParameterError, match="released"):
        rt.run_frame_pass(handle, w, want_sum=False, want_max=False)


def test_cuda_put_refuses_what_it_cannot_decode(
    fake_cupy: FakeCupy, rng: np.random.Generator
) -> None:
    rt = _cuda_with(fake_cupy)
    block = _frames(rng)
    zstd = get_representation("encoded").from_dense(block, codec="bitshuffle-zstd")
    with pytest.raises(UnsupportedOperationError, match="bitshuffle-lz4"):
        rt.put(chunk_of("encoded", zstd))
    wide = chunk_of("dense", block.astype(np.uint64))
    with pytest.raises(UnsupportedOperationError, match=r"'cuda' has no .*uint64.*\['cpu'"):
        rt.put(wide)
    assert fake_cupy.uploads == []


def test_the_encoded_block_table_of_a_subset_matches_a_fresh_one(rng: np.random.Generator) -> None:
    from quantem_flow.runtimes.cuda.bslz4 import block_table, decode_host, subset_table

    block = rng.poisson(3.0, size=(4, 6, 7, 9)).astype(np.uint16)  # 63 values: raw tails
    payload = get_representation("encoded").from_dense(
        block, codec="bitshuffle-lz4", frames_per_piece=5, block_size=16
    )
    n = payload.n_pieces
    assert n > 2
    full = block_table(payload, np.arange(n))
    for pieces in (np.arange(n), np.array([0]), np.array([n - 1]), np.arange(1, n, 2)):
        fresh = block_table(payload, pieces)
        cut = subset_table(full, pieces, 2)
        for field in ("src_off", "out_off", "raw_dst", "scratch_off", "piece_out", "absent"):
            np.testing.assert_array_equal(getattr(cut, field), getattr(fresh, field), field)
        assert cut.scratch_bytes == fresh.scratch_bytes
        np.testing.assert_array_equal(
            decode_host(payload, pieces, cut), decode_host(payload, pieces)
        )


def test_a_failed_import_of_cupy_is_not_searched_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """``backend="auto"`` asks CUDA twice per pass; without CuPy each ask searched the path."""
    import builtins
    import importlib.util

    from quantem_flow.runtimes import cuda

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: nothing fails to import")
    monkeypatch.setattr(cuda, "_NO_CUPY", [])
    asked: list[str] = []
    real_import = builtins.__import__

    def counting(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "cupy":
            asked.append(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", counting)
    first = cuda.CudaRuntime.available()
    second = cuda.CudaRuntime.available()
    assert first == second and first[0] is False and "CuPy is not installed" in first[1]
    assert asked == ["cupy"]  # the second answer came from the memo
    monkeypatch.setitem(sys.modules, "cupy", FakeCupy())  # a module that appears is seen
    third = cuda.CudaRuntime.available()
    assert asked == ["cupy", "cupy"] and third != first
