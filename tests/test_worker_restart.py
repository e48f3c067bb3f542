"""A lost worker is restored or reported: log, dashboard state, pass provenance (issue 11, item 7).

A killed worker of the local cluster is restarted by its supervisor; a worker
lost during a pass (on any cluster) is logged with its address and what
happens next, recorded by the scheduler plugin (which the dashboard draws)
and named in the provenance of the pass that ran while it was lost, with
whether it was restored.  A restart that gives up is reported too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.dataset import Dataset4D
from tests.conftest import probe_data
from tests.slow_source import SlowArraySource

CENTER = (8.6, 14.2)


def _wait_for_workers(client: Any, n: int, gone: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = client.scheduler_info()["workers"]
        if len(workers) == n and gone not in workers:
            return
        time.sleep(0.2)
    pytest.fail(f"no worker came back within {timeout:.0f} s after SIGKILL of {gone}")


@pytest.mark.cluster
def test_a_sigkilled_worker_comes_back_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    cluster = start_local_cluster(n_workers=2, threads_per_worker=1, memory_limit="1 GiB")
    client = Client(cluster, set_as_default=False)
    try:
        client.wait_for_workers(2, timeout=60)
        with caplog.at_level(logging.WARNING, logger="quantem_flow.cluster"):
            for _ in range(2):
                pids = client.run(os.getpid)
                victim = sorted(pids)[0]
                os.kill(pids[victim], signal.SIGKILL)
                _wait_for_workers(client, 2, victim)
        text = caplog.text
        assert "exited with signal 9; restarting it" in text, text
        assert "is back at tcp://127.0.0.1:" in text, text
    finally:
        client.close()
        cluster.close()


@contextlib.contextmanager
def _two_workers() -> Iterator[Any]:
    """A client of a local cluster of two one-thread worker processes (restarted when killed)."""
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    cluster = start_local_cluster(n_workers=2, threads_per_worker=1, memory_limit="1 GiB")
    client = Client(cluster, set_as_default=False)
    try:
        client.wait_for_workers(2, timeout=60)
        yield client
    finally:
        client.close()
        cluster.close()


def _pass_in_thread(
    ds: Dataset4D, client: Any, out: dict[str, Any], **settings: Any
) -> threading.Thread:
    """Start the queries' pass in a thread; its results (or its error) go to ``out``."""

    def run() -> None:
        try:
            with qf.config.set(**settings):
                out["results"] = qf.compute(*_queries(ds), client=client)
        except BaseException as exc:  # surfaced by the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _kill_and_finish(
    client: Any, pid: int, victim: str, thread: threading.Thread, out: dict[str, Any]
) -> None:
    """SIGKILL the worker ``victim``; the pass must still finish, and the worker come back."""
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=120)
    assert not thread.is_alive(), "the pass did not finish after the worker was killed"
    assert "error" not in out, out.get("error")
    _wait_for_workers(client, 2, victim)


def _same_as(results: Any, expected: Any) -> None:
    bf, adf, com = results
    np.testing.assert_array_equal(bf.data, expected[0].data)
    np.testing.assert_array_equal(adf.data, expected[1].data)
    np.testing.assert_allclose(com.data, expected[2].data, rtol=1e-12)


def _queries(ds: Dataset4D) -> list[Any]:
    return [
        qf.virtual_bf(ds, radius=4.5, center=CENTER),
        qf.virtual_adf(ds, inner=7.0, center=CENTER),
        qf.center_of_mass(ds, center=CENTER),
    ]


def _chunks_done(client: Any) -> int:
    def done(dask_scheduler: Any) -> int:
        return sum(
            1
            for k, ts in dask_scheduler.tasks.items()
            if str(k).startswith("('qf-pass-") and ts.state == "memory"
        )

    return int(client.run_on_scheduler(done))


@pytest.mark.cluster
@pytest.mark.slow
def test_a_worker_sigkilled_mid_pass_is_named_in_provenance_log_and_dashboard(
    rng: np.random.Generator, caplog: pytest.LogCaptureFixture
) -> None:
    from quantem_flow.graphs.scheduler_plugin import PLUGIN_NAME

    data = probe_data(rng, scan=(16, 6))
    expected = qf.compute(*_queries(qf.open(data)), client="synchronous")
    with _two_workers() as client:
        ds = Dataset4D(SlowArraySource(data, delay_s=0.4), chunk_rows=1)
        pids = client.run(os.getpid)
        names = {a: str(w["name"]) for a, w in client.scheduler_info()["workers"].items()}
        victim = sorted(pids)[0]
        out: dict[str, Any] = {}
        with caplog.at_level(logging.INFO, logger="quantem_flow"):
            # one task per chunk: many short tasks, so the kill lands on a running one (a
            # group of chunks killed mid-group: the test after this one)
            t = _pass_in_thread(ds, client, out, pass_tasks_per_thread=1000)
            deadline = time.monotonic() + 60
            while _chunks_done(client) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            _kill_and_finish(client, pids[victim], victim, t, out)

        # the result is the clean run's
        _same_as(out["results"], expected)
        bf = out["results"][0]

        # provenance of the pass names the lost worker and whether it was restored
        scheduler = bf.provenance.execution["scheduler"]
        assert scheduler.startswith("given distributed.Client at tcp://"), scheduler
        assert f"1 worker(s) lost during the pass: {victim} (name {names[victim]!r})" in scheduler
        assert ("restored: a worker of the same name joined at tcp://" in scheduler) or (
            "not restored by the end of the pass" in scheduler
        ), scheduler
        departed = bf.provenance.execution["workers_departed"]  # the same, as records
        assert [d["worker"] for d in departed if d["lost"]] == [victim], departed
        assert json.loads(json.dumps(departed)) == departed  # saved with the result

        # the log: the scheduler plugin at the loss, the client after the pass
        lost_logs = [
            r
            for r in caplog.records
            if r.levelno == logging.WARNING
            and victim in r.getMessage()
            and "lost" in r.getMessage()
        ]
        loggers = {r.name for r in lost_logs}
        assert {"quantem_flow.placement", "quantem_flow.runner"} <= loggers, caplog.text
        at_loss = next(r for r in lost_logs if r.name == "quantem_flow.placement").getMessage()
        assert "will run again on the 1 remaining worker(s)" in at_loss, at_loss

        # the dashboard's state: the loss, restored by the restarted worker of the same name
        def departures(dask_scheduler: Any) -> list[dict[str, Any]]:
            return list(dask_scheduler.plugins[PLUGIN_NAME].state()["departures"])

        deadline = time.monotonic() + 30
        record: dict[str, Any] = {}
        while time.monotonic() < deadline:
            lost = [d for d in client.run_on_scheduler(departures) if d["worker"] == victim]
            record = lost[0] if lost else {}
            if record.get("restored"):
                break
            time.sleep(0.2)
        assert record.get("lost") is True and record.get("name") == names[victim], record
        assert record["restored"] is True and record["restored_by"] in set(
            client.scheduler_info()["workers"]
        ), record
        assert record["restart"]["restart"] == "restarting", record  # the supervisor's report
        assert record["chunk_tasks_running"] >= 1, record


@pytest.mark.cluster
@pytest.mark.slow
def test_a_group_of_chunks_on_a_killed_worker_runs_again_whole(rng: np.random.Generator) -> None:
    """A task running several chunks (graphs/pass_groups.py) lost mid-group runs again elsewhere.

    Every chunk's values and record arrive once, the same as a clean run's.
    """
    data = probe_data(rng, scan=(16, 6))
    expected = qf.compute(*_queries(qf.open(data)), client="synchronous")
    with _two_workers() as client:
        ds = Dataset4D(SlowArraySource(data, delay_s=0.3), chunk_rows=1)  # 16 chunks
        pids = client.run(os.getpid)
        out: dict[str, Any] = {}

        def running_group(dask_scheduler: Any) -> str | None:
            for ts in dask_scheduler.tasks.values():
                if str(ts.key).startswith("('qf-pass-") and ts.state == "processing":
                    return str(ts.processing_on.address) if ts.processing_on else None
            return None

        t = _pass_in_thread(ds, client, out)  # the default groups: 4 tasks of 4 chunks
        deadline = time.monotonic() + 60
        victim = None
        while victim is None and time.monotonic() < deadline:
            time.sleep(0.5)  # into the first group (4 chunks of 0.3 s each)
            victim = client.run_on_scheduler(running_group)
        assert victim is not None, "no group task was running"
        _kill_and_finish(client, pids[victim], victim, t, out)
    _same_as(out["results"], expected)
    execution = out["results"][0].provenance.execution
    assert execution["tasks"]["n_tasks"] == 4 and execution["tasks"]["chunks_per_task"] == [4]
    assert sorted(r["chunk"] for r in execution["chunks"]) == list(range(16))
    assert execution["content_digest"] == expected[0].provenance.execution["content_digest"]
    assert [d["worker"] for d in execution["workers_departed"] if d["lost"]] == [victim]


def test_a_restart_that_gives_up_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    """The supervisor's report reaches the loss record (dashboard, provenance) and the log."""
    from quantem_flow.graphs.runner import _describe_loss
    from quantem_flow.graphs.scheduler_plugin import PlacementSchedulerPlugin

    class FakeScheduler:
        def __init__(self) -> None:
            self.workers: dict[str, Any] = {}
            self.tasks: dict[str, Any] = {}

    plugin = PlacementSchedulerPlugin()
    plugin.scheduler = FakeScheduler()
    plugin._names["tcp://127.0.0.1:1"] = "qf-w"
    with caplog.at_level(logging.WARNING, logger="quantem_flow.placement"):
        plugin.remove_worker(plugin.scheduler, "tcp://127.0.0.1:1", stimulus_id="test")
        answer = plugin.report(
            name="qf-w", address="tcp://127.0.0.1:1", restart="gave-up", detail="exited 4 times"
        )
    assert answer == "recorded"
    (record,) = plugin.departures_since(0)
    assert record["lost"] and not record["restored"]
    assert record["restart"]["restart"] == "gave-up"
    assert "no worker is left" in record["what_next"]
    assert "not restored: exited 4 times" in _describe_loss(record)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and "will not be restored: exited 4 times" in errors[0].getMessage()
    # a worker that closes on purpose announces it first: it is not a loss
    plugin._names["tcp://127.0.0.1:2"] = "qf-v"
    plugin.log_event("tcp://127.0.0.1:2", {"action": "worker-status-change", "status": "closing"})
    plugin.remove_worker(plugin.scheduler, "tcp://127.0.0.1:2", stimulus_id="test")
    assert plugin.departures_since(1)[0]["lost"] is False


@pytest.mark.cluster
def test_a_supervisor_that_gives_up_reports_it_to_the_scheduler(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from distributed import Client

    from quantem_flow.graphs import cluster as cluster_module
    from quantem_flow.graphs.scheduler_plugin import PLUGIN_NAME

    monkeypatch.setattr(cluster_module, "MAX_RESTARTS", 0)  # the first death is one too many
    cluster = cluster_module.start_local_cluster(
        n_workers=2, threads_per_worker=1, memory_limit="1 GiB"
    )
    client = Client(cluster, set_as_default=False)
    try:
        client.wait_for_workers(2, timeout=60)
        pids = client.run(os.getpid)
        victim = sorted(pids)[0]

        def departures(dask_scheduler: Any) -> list[dict[str, Any]]:
            return list(dask_scheduler.plugins[PLUGIN_NAME].state()["departures"])

        with caplog.at_level(logging.WARNING, logger="quantem_flow"):
            os.kill(pids[victim], signal.SIGKILL)
            deadline = time.monotonic() + 30
            record: dict[str, Any] = {}
            while time.monotonic() < deadline:
                found = [d for d in client.run_on_scheduler(departures) if d["worker"] == victim]
                record = found[0] if found else {}
                if (record.get("restart") or {}).get("restart") == "gave-up":
                    break
                time.sleep(0.2)
        assert record.get("lost") is True and record.get("restored") is False, record
        assert record["restart"]["restart"] == "gave-up", record
        assert "not restarted: it exited 1 times within 300 s" in record["restart"]["detail"]
        assert victim not in client.scheduler_info()["workers"]
        assert len(client.scheduler_info()["workers"]) == 1  # not restarted
        errors = {r.name for r in caplog.records if r.levelno == logging.ERROR}
        assert {"quantem_flow.cluster", "quantem_flow.placement"} <= errors, caplog.text
    finally:
        client.close()
        cluster.close()
