"""A stalled external worker is found quickly and handled as a lost one (issue 23, item 3).

Before: a SIGSTOP of the worker process mid-pass cost the fixed 300 s reply timeout, then
failed the compute, while a SIGKILL was retried.  Now a request's deadline is
``external_timeout_s`` plus its bytes at ``external_min_mib_s``, and while a reply is
awaited the bridge checks that the process is not stopped (``/proc``: state ``T``); a
stalled worker is killed, restarted, its chunks re-placed and the request re-run once,
with an identical result and the stall in provenance.  The settings reach workers through
``qf.config``, the environment, ``start_local_cluster(config=)`` and
``quantem-flow worker --config``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import ExternalWorkerTimeoutError
from quantem_flow.representations.chunk import chunk_of
from quantem_flow.runtimes import get_runtime
from quantem_flow.runtimes.external.workers import register_reference_runtime
from tests.conftest import probe_data
from tests.swift_toolchain import require_swift_build

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the stopped-process check reads /proc (Linux)"
)


def _when_in_flight(runtime: Any, act: Any) -> threading.Thread:
    """Call ``act(pid)`` as soon as a request of ``runtime`` is in flight."""
    lock = runtime.session._lock

    def watch() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if lock.acquire(blocking=False):
                lock.release()
                time.sleep(0.0005)
                continue
            pid = runtime.session.pid
            if pid is not None:
                time.sleep(0.05)  # inside the request: the worker is sleeping its run delay
                act(pid)
                return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_a_sigstopped_worker_is_killed_restarted_and_the_pass_rerun(
    rng: np.random.Generator,
) -> None:
    register_reference_runtime("ext-stall", extra_args=("--run-delay", "0.5"))
    runtime = get_runtime("ext-stall")
    try:
        block = rng.integers(0, 100, size=(2, 3, 4, 5)).astype(np.uint16)
        host = chunk_of("dense", block)
        handle = runtime.put(host, reload=lambda: block)
        weights = np.ones((2, 20))
        weights[1, ::2] = 3.0
        expected = runtime.run_frame_pass(handle, weights, want_sum=True, want_max=False)
        stopped: dict[str, int] = {}

        def stop(pid: int) -> None:
            os.kill(pid, signal.SIGSTOP)
            stopped["pid"] = pid

        with qf.config.set(external_stall_grace_s=1.0):
            runtime.session._conn.stall_grace_s = 1.0  # type: ignore[union-attr]
            t0 = time.monotonic()
            watcher = _when_in_flight(runtime, stop)
            out = runtime.run_frame_pass(handle, weights, want_sum=True, want_max=False)
            elapsed = time.monotonic() - t0
        watcher.join(5)
        assert "pid" in stopped, "the worker was not stopped during the request"
        np.testing.assert_array_equal(out.per_frame, expected.per_frame)
        np.testing.assert_array_equal(out.pattern_sum, expected.pattern_sum)
        assert elapsed < 20, f"the stall cost {elapsed:.1f} s"
        detail = runtime.describe()
        assert detail["stalls"] == 1 and detail["restarts"] == 1 and detail["re_placed_chunks"] >= 1
        (event,) = [e for e in runtime.events if e["event"] == "stalled"]
        assert "stopped (SIGSTOP" in event["reason"]
        with pytest.raises(ProcessLookupError):
            os.kill(stopped["pid"], 0)  # the stopped process was killed (and reaped)
    finally:
        runtime.close()


def test_a_hung_worker_fails_after_its_deadline_not_300_s(rng: np.random.Generator) -> None:
    register_reference_runtime("ext-hung", extra_args=("--run-delay", "30"))
    runtime = get_runtime("ext-hung")
    try:
        block = rng.integers(0, 100, size=(1, 2, 4, 5)).astype(np.uint16)
        handle = runtime.put(chunk_of("dense", block), reload=lambda: block)
        runtime.session.timeout = 1.0  # qf.config external_timeout_s for a new runtime
        t0 = time.monotonic()
        with pytest.raises(ExternalWorkerTimeoutError) as info:
            runtime.run_frame_pass(handle, np.ones((1, 20)), want_sum=False, want_max=False)
        elapsed = time.monotonic() - t0
        assert elapsed < 25, f"{elapsed:.1f} s"  # two tries of ~1 s each, plus two restarts
        assert info.value.code == "timeout" and "external_timeout_s" in str(info.value)
        assert runtime.describe()["stalls"] == 2  # the request and its one re-run
    finally:
        runtime.close()


def test_the_deadline_scales_with_the_bytes_and_the_settings() -> None:
    from quantem_flow.runtimes.external.session import ExternalSession

    with qf.config.set(external_timeout_s=7.0, external_min_mib_s=2.0):
        s = ExternalSession(lambda: None, name="x")  # type: ignore[arg-type,return-value]
    assert s.timeout == 7.0 and s.min_mib_s == 2.0
    assert s.deadline(0) == 7.0
    assert s.deadline(64 * 2**20) == pytest.approx(7.0 + 32.0)


def test_settings_reach_worker_processes_through_start_local_cluster_and_the_cli(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from quantem_flow.cli import main
    from quantem_flow.errors import ParameterError
    from quantem_flow.graphs.cluster import start_local_cluster

    assert (
        main(
            [
                "worker",
                "tcp://127.0.0.1:8786",
                "--runtime",
                "cpu",
                "--dry-run",
                "--config",
                "external_timeout_s=12",
                "--config",
                "external_stall_grace_s=0.5",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "QUANTEM_FLOW_EXTERNAL_TIMEOUT_S=12" in out
    assert "QUANTEM_FLOW_EXTERNAL_STALL_GRACE_S=0.5" in out
    assert main(["worker", "tcp://x:1", "--config", "external_timeout_s", "--dry-run"]) == 2
    with pytest.raises(ParameterError, match="takes a float"):
        start_local_cluster(n_workers=1, config={"external_timeout_s": "soon"})
    with pytest.raises(ParameterError, match="unknown quantem-flow setting"):
        start_local_cluster(n_workers=1, config={"external_timeout": 3})


@pytest.mark.cluster
@pytest.mark.slow
def test_a_sigstopped_swift_worker_mid_pass_in_a_cluster(rng: np.random.Generator) -> None:
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    require_swift_build()
    cluster = start_local_cluster(
        workers=[
            {"runtimes": ["cpu"], "name": "cpu-0"},
            {"runtimes": ["swift"], "name": "swift-0", "env": {"QF_SWIFT_ARGS": "--run-delay 0.3"}},
        ],
        config={"external_stall_grace_s": 1.0, "external_timeout_s": 20.0},
    )
    client = Client(cluster, set_as_default=False)
    try:
        workers = client.scheduler_info()["workers"]
        (sw,) = [a for a, w in workers.items() if "qf-runtime-swift" in w["resources"]]
        data = probe_data(rng, scan=(8, 5))
        queries = [qf.virtual_bf, qf.center_of_mass]
        p = qf.open(data, chunk_rows=2).persist(client=client, backend="swift")
        try:
            before = qf.compute(*(q(p) for q in queries), client=client)

            def stop_next_request(dask_worker: Any) -> None:
                rt = get_runtime("swift")

                def stop(pid: int) -> None:
                    os.kill(pid, signal.SIGSTOP)
                    dask_worker.qf_stopped_pid = pid

                _when_in_flight(rt, stop)

            client.run(stop_next_request, workers=[sw])
            t0 = time.monotonic()
            after = qf.compute(*(q(p) for q in queries), client=client)
            elapsed = time.monotonic() - t0
            stopped = client.run(lambda dask_worker: getattr(dask_worker, "qf_stopped_pid", None))
            assert stopped[sw] is not None
            for a, b in zip(after, before, strict=True):
                np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
            assert elapsed < 30, f"{elapsed:.1f} s"
            details = after[0].provenance.execution["runtime_details"]
            assert max(d["stalls"] for d in details) >= 1
            assert {d["timeouts"]["reply_s"] for d in details} == {20.0}  # config= reached it
        finally:
            p.release()
    finally:
        client.close()
        cluster.close()
