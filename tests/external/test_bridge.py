"""ExternalRuntime (the bridge) against the reference worker: parity, handles, crashes."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantem_flow.errors import (
    ExternalWorkerLostError,
    ParameterError,
    StaleHandleError,
    UnsupportedOperationError,
)
from quantem_flow.representations.chunk import Chunk, chunk_of
from quantem_flow.representations.packed import Packed
from quantem_flow.representations.paired import Paired
from quantem_flow.runtimes import get_runtime
from quantem_flow.runtimes.base import RELEASED
from quantem_flow.runtimes.external.bridge import ExternalHandle, ExternalRuntime
from quantem_flow.runtimes.external.workers import (
    ReferenceRuntime,
    WebGpuBrowserRuntime,
    WebGpuNodeRuntime,
    external_probe,
    register_reference_runtime,
)
from quantem_flow.runtimes.registry import unregister_runtime


@pytest.fixture
def crash_file(tmp_path: Path) -> Path:
    return tmp_path / "crash-now"


@pytest.fixture
def runtime(crash_file: Path) -> Iterator[ExternalRuntime]:
    register_reference_runtime(
        "external-reference-t", budget_bytes=1 << 24, extra_args=("--crash-file", str(crash_file))
    )
    rt = get_runtime("external-reference-t")
    assert isinstance(rt, ExternalRuntime)
    try:
        yield rt
    finally:
        rt.close()
        from quantem_flow.runtimes.registry import instances

        instances().pop("external-reference-t", None)
        unregister_runtime("external-reference-t")


def _data(rng: np.random.Generator, dtype: Any = np.uint16) -> np.ndarray:
    return (rng.poisson(0.7, size=(3, 5, 6, 7)) * rng.integers(1, 9, size=(3, 5, 6, 7))).astype(
        dtype
    )


def _payloads(block: np.ndarray) -> list[tuple[str, Any]]:
    return [
        ("dense", block),
        ("paired", Paired().from_dense(block)),
        ("packed", Packed().from_dense(block)),
    ]


def _same(a: Any, b: Any) -> None:
    np.testing.assert_array_equal(a.per_frame, b.per_frame)
    for x, y in ((a.pattern_sum, b.pattern_sum), (a.pattern_max, b.pattern_max)):
        assert (x is None) == (y is None)
        if x is not None:
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)


def test_parity_with_cpu(runtime: ExternalRuntime, rng: np.random.Generator) -> None:
    cpu = get_runtime("cpu")
    block = _data(rng)
    weights = np.vstack([rng.integers(0, 2, size=42), rng.integers(-3, 4, size=42)]).astype(
        np.float64
    )
    for rep, payload in _payloads(block):
        host = chunk_of(rep, payload)
        chunk = runtime.put(host, reload=lambda p=payload: p)
        assert chunk.residency == "external:external-reference-t" and chunk.runtime == runtime.name
        assert isinstance(chunk.payload, ExternalHandle) and chunk.nbytes == payload.nbytes
        for want_sum, want_max in ((True, True), (False, False), (True, False)):
            _same(
                runtime.run_frame_pass(chunk, weights, want_sum=want_sum, want_max=want_max),
                cpu.run_frame_pass(host, weights, want_sum=want_sum, want_max=want_max),
            )
        idx = np.array([0, 41, 7, 3])  # unique, as PassSpec.gather
        np.testing.assert_array_equal(runtime.run_gather(chunk, idx), cpu.run_gather(host, idx))
        assert runtime.put(chunk) is chunk  # already resident here
    # a float chunk, and a host chunk put just for the call
    real = rng.normal(size=(2, 2, 3, 4)).astype(np.float32)
    out = runtime.run_frame_pass(
        chunk_of("dense", real), weights[:, :12], want_sum=True, want_max=True
    )
    ref = cpu.run_frame_pass(chunk_of("dense", real), weights[:, :12], want_sum=True, want_max=True)
    np.testing.assert_allclose(out.per_frame, ref.per_frame, rtol=1e-12, atol=1e-12)
    assert runtime.stats()["resident_bytes"]["dense"] == block.nbytes  # the transient is gone


def test_weights_sent_once_and_evicted(runtime: ExternalRuntime, rng: np.random.Generator) -> None:
    chunk = runtime.put(chunk_of("dense", _data(rng)))
    w = np.ones((2, 42))
    for _ in range(3):
        runtime.run_frame_pass(chunk, w, want_sum=False, want_max=False)
    assert runtime.stats()["resident_bytes"]["weights"] == w.nbytes
    runtime._weights_cache = 2
    for k in range(4):
        runtime.run_frame_pass(chunk, w * (k + 2), want_sum=False, want_max=False)
    assert runtime.stats()["resident_bytes"]["weights"] == 2 * w.nbytes


def test_release_is_idempotent(runtime: ExternalRuntime, rng: np.random.Generator) -> None:
    chunk = runtime.put(chunk_of("dense", _data(rng)))
    assert runtime.stats()["handles"] == 1
    runtime.release(chunk)
    runtime.release(chunk)
    assert chunk.payload is RELEASED and runtime.stats()["handles"] == 0
    with pytest.raises(ParameterError, match="released"):
        runtime.run_frame_pass(chunk, np.ones((1, 42)), want_sum=False, want_max=False)
    with pytest.raises(ParameterError, match="released"):
        runtime.put(chunk)
    runtime.release(chunk_of("dense", _data(rng)))  # a host chunk: nothing to do


def test_refusals(runtime: ExternalRuntime, rng: np.random.Generator) -> None:
    chunk = runtime.put(chunk_of("dense", _data(rng)))
    with pytest.raises(ParameterError, match="42 pixels"):
        runtime.run_frame_pass(chunk, np.ones((1, 5)), want_sum=False, want_max=False)
    with pytest.raises(ParameterError, match=r"\[0, 42\)"):
        runtime.run_gather(chunk, np.array([42]))
    other = Chunk(
        representation="dense",
        residency="cuda:0",
        scan_slice=((0, 1), (0, 1)),
        payload=np.zeros((1, 1, 1, 1)),
        storage_schema="dense-v1",
        runtime="cuda",
    )
    with pytest.raises(ParameterError, match="never done silently"):
        runtime.put(other)
    big = chunk_of("dense", np.zeros((1, 1, 4096, 4097), dtype=np.uint8))
    from quantem_flow.errors import ExternalWorkerError

    with pytest.raises(ExternalWorkerError) as info:
        runtime.put(big)
    assert info.value.code == "budget" and info.value.worker == "external-reference-t"


def test_unsupported_is_refused_before_sending(rng: np.random.Generator) -> None:
    class Narrow(ReferenceRuntime):
        name = "external-narrow"

    rt = Narrow()
    try:
        info = rt.start()
        # pretend the worker offered only dense uint16
        object.__setattr__(info, "kernels", (("frame_pass", "dense", "uint16"),))
        with pytest.raises(UnsupportedOperationError, match="dense/uint16"):
            rt.put(chunk_of("dense", np.zeros((1, 1, 2, 2), dtype=np.float64)))
        object.__setattr__(info, "storage_schemas", ("dense-v1",))
        with pytest.raises(UnsupportedOperationError, match="cannot hold"):
            rt.put(chunk_of("paired", Paired().from_dense(_data(rng))))
        assert not rt.supports("frame_pass", "paired") and rt.supports("frame_pass", "dense")
    finally:
        rt.close()


def test_killed_mid_pass_gives_identical_result(
    runtime: ExternalRuntime, crash_file: Path, rng: np.random.Generator
) -> None:
    block = _data(rng)
    w = np.vstack([np.ones(42), np.arange(42.0)])
    chunks = {
        rep: runtime.put(chunk_of(rep, p), reload=lambda p=p: p) for rep, p in _payloads(block)
    }
    before = {
        rep: runtime.run_frame_pass(c, w, want_sum=True, want_max=True) for rep, c in chunks.items()
    }
    pid = runtime.session.pid
    crash_file.touch()  # the worker SIGKILLs itself when the next run arrives
    after = runtime.run_frame_pass(chunks["paired"], w, want_sum=True, want_max=True)
    _same(after, before["paired"])
    assert not crash_file.exists() and runtime.session.pid != pid
    events = [e["event"] for e in runtime.events]
    assert events == ["lost", "restarted", "re-placed"]
    lost = runtime.events[0]
    assert lost["exit_code"] == -signal.SIGKILL and lost["during"] == "run frame_pass"
    # the other chunks are re-placed lazily, on their next use
    assert chunks["dense"].payload.generation == 1
    _same(runtime.run_frame_pass(chunks["dense"], w, want_sum=True, want_max=True), before["dense"])
    assert chunks["dense"].payload.generation == 2 and chunks["dense"].payload.replaced == 1
    desc = runtime.describe()
    assert desc["restarts"] == 1 and desc["re_placed_chunks"] == 2
    # a killed worker between calls: the next call re-places just the same
    os.kill(runtime.session.pid or 0, signal.SIGKILL)
    np.testing.assert_array_equal(
        runtime.run_gather(chunks["packed"], np.arange(42)), block.reshape(15, 42)
    )


def test_stale_without_recipe(runtime: ExternalRuntime, rng: np.random.Generator) -> None:
    chunk = runtime.put(chunk_of("dense", _data(rng)))
    os.kill(runtime.session.pid or 0, signal.SIGKILL)
    runtime.session.connection.process.wait(timeout=10)  # type: ignore[union-attr]
    with pytest.raises(StaleHandleError) as info:
        runtime.run_frame_pass(chunk, np.ones((1, 42)), want_sum=False, want_max=False)
    assert info.value.worker == "external-reference-t" and "reload" in str(info.value)
    runtime.release(chunk)  # stale: nothing to send, no error


def test_no_retry_without_recipe_mid_pass(
    runtime: ExternalRuntime, crash_file: Path, rng: np.random.Generator
) -> None:
    chunk = runtime.put(chunk_of("dense", _data(rng)))
    crash_file.touch()
    with pytest.raises(ExternalWorkerLostError) as info:
        runtime.run_frame_pass(chunk, np.ones((1, 42)), want_sum=False, want_max=False)
    assert info.value.exit_code == -signal.SIGKILL and info.value.message_type == "run"


def test_probe_and_describe(runtime: ExternalRuntime) -> None:
    probe = external_probe("external-reference-t")
    assert probe.available and probe.slots == 1 and probe.budget_bytes == 1 << 24
    assert probe.details["hello"]["runtime"] == "external-reference-t"
    desc = runtime.describe()
    assert desc["accumulation"] == {"integer": "int64", "real": "float64"}
    assert desc["protocol"] == "qf-worker/1" and "reference worker" in desc["implementation"]
    assert runtime.precision().integer == "int64"
    assert external_probe("cpu").available is False


def test_webgpu_availability_names_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QF_WEBGPU_WORKER", "/nonexistent/node-worker.js")
    ok, why = WebGpuNodeRuntime.available()
    assert not ok and "npm ci && npm run build" in why
    monkeypatch.setenv("QF_WEBGPU_PAGE", "/nonexistent/page")
    ok, why = WebGpuBrowserRuntime.available()
    assert not ok and "npm run build" in why


def test_release_never_waits_for_a_kernel_in_flight(
    runtime: ExternalRuntime, rng: np.random.Generator
) -> None:
    import threading
    import time

    chunk = runtime.put(chunk_of("dense", _data(rng)))
    busy, done = threading.Event(), threading.Event()

    def kernel_in_flight() -> None:
        with runtime._lock:
            busy.set()
            done.wait(10)

    thread = threading.Thread(target=kernel_in_flight)
    thread.start()
    busy.wait(10)
    t0 = time.monotonic()
    runtime.release(chunk)  # what Dask's event loop does when it forgets the key
    assert time.monotonic() - t0 < 0.5 and chunk.payload is RELEASED
    done.set()
    thread.join()
    assert runtime.stats()["handles"] == 0  # sent before the next request
