"""A compute that no worker can run fails promptly with the project's error (issue 23, item 1).

Before: once the local cluster's supervisor stopped restarting a worker that kept dying,
the next compute waited forever ("tasks wait until a worker joins").  Now the scheduler
plugin fails the waiting tasks: at once when no worker is left and none is being
restarted, with the workers' exit history and what to do; after ``no_worker_timeout_s``
otherwise.  With several workers the work goes to those left.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import PlacementError
from quantem_flow.graphs.stuck_tasks import StuckTasks
from tests.conftest import probe_data


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    pytest.fail(f"{what} within {timeout:.0f} s")


def _kill_one(client: Any) -> str:
    pids = client.run(os.getpid)
    victim = sorted(pids)[0]
    os.kill(pids[victim], signal.SIGKILL)
    _wait(lambda: victim not in client.scheduler_info()["workers"], 30, f"{victim} did not leave")
    return victim


@pytest.mark.cluster
@pytest.mark.slow
def test_a_compute_after_the_supervisor_gave_up_fails_at_once_with_the_exit_history() -> None:
    from distributed import Client

    from quantem_flow.graphs.cluster import MAX_RESTARTS, start_local_cluster

    cluster = start_local_cluster(n_workers=1, threads_per_worker=1, memory_limit="1 GiB")
    client = Client(cluster, set_as_default=False)
    try:
        client.wait_for_workers(1, timeout=60)
        for i in range(MAX_RESTARTS + 1):  # the idle worker killed 4 times
            _kill_one(client)
            if i < MAX_RESTARTS:
                _wait(lambda: len(client.scheduler_info()["workers"]) == 1, 60, "no restart")
        time.sleep(1.0)  # the supervisor's report reaches the scheduler
        assert client.scheduler_info()["workers"] == {}
        ds = qf.open(np.ones((4, 4, 8, 8), dtype=np.uint16))
        t0 = time.monotonic()
        with pytest.raises(PlacementError) as info:
            qf.compute(qf.virtual_bf(ds, radius=2.0, center=(4.0, 4.0)), client=client)
        waited = time.monotonic() - t0
        assert waited < 20, f"the compute failed only after {waited:.0f} s"
        text = str(info.value)
        assert "no worker left and none is being restarted" in text, text
        assert text.count("killed by signal 9") == MAX_RESTARTS + 1, text
        assert "MiB at its last heartbeat" in text and "of a 1024 MiB limit" in text, text
        assert "stopped restarting it" in text and "start a new cluster" in text, text
    finally:
        client.close()
        cluster.close()


@pytest.mark.cluster
@pytest.mark.slow
def test_with_two_workers_the_work_goes_to_the_one_left(monkeypatch: pytest.MonkeyPatch) -> None:
    from distributed import Client

    from quantem_flow.graphs import cluster as cluster_module

    monkeypatch.setattr(cluster_module, "MAX_RESTARTS", 0)  # the first death is one too many
    cluster = cluster_module.start_local_cluster(
        n_workers=2, threads_per_worker=1, memory_limit="1 GiB"
    )
    client = Client(cluster, set_as_default=False)
    try:
        client.wait_for_workers(2, timeout=60)
        _kill_one(client)
        time.sleep(1.0)
        assert len(client.scheduler_info()["workers"]) == 1
        rng = np.random.default_rng(0)
        data = probe_data(rng, scan=(6, 4))
        (bf,) = qf.compute(qf.virtual_bf(qf.open(data, chunk_rows=1)), client=client)
        (ref,) = qf.compute(qf.virtual_bf(qf.open(data)), client="synchronous")
        np.testing.assert_array_equal(bf.data, ref.data)
    finally:
        client.close()
        cluster.close()


def test_stuck_tasks_wait_for_a_restart_and_not_for_a_worker_given_up() -> None:
    stuck = StuckTasks(timeout_s=60)
    stuck.joined("tcp://a", "w")
    stuck.heartbeat("tcp://a", 300 * 2**20, 1 << 30)
    stuck.left("tcp://a", "w", lost=True, now=100.0)
    stuck.report("w", "restarting", "exited with signal 9; restarting it", [(100.0, -9)])
    waiting = {"k1": 10.0, "k2": 10.0}
    kw: dict[str, Any] = dict(refused={}, n_workers=0, offered="-", needs={}, now=20.0)
    assert stuck.check(waiting, **kw) == []  # a restart is on its way: wait
    stuck.report("w", "gave-up", "exited 4 times within 300 s", [(100.0, -9), (101.0, -9)])
    (verdict,) = stuck.check(waiting, **kw)
    assert set(verdict.keys) == {"k1", "k2"}
    assert "2 exit(s)" in verdict.reason and "300 MiB at its last heartbeat" in verdict.reason
    assert "stopped restarting it" in verdict.reason
    # a worker that came back is running again: nothing failed before the timeout
    stuck.joined("tcp://b", "w")
    assert stuck.check(waiting, **kw) == []


def test_stuck_tasks_fail_refusals_at_once_and_the_rest_after_the_timeout() -> None:
    stuck = StuckTasks(timeout_s=5)
    waiting = {"refused": 0.0, "early": 9.0, "late": 0.0}
    verdicts = stuck.check(
        waiting,
        refused={"refused": "no worker can run runtime 'cuda'"},
        n_workers=1,
        offered="runtimes {'tcp://x': ['cpu']}",
        needs={"late": "runtime 'swift'", "early": "runtime 'swift'"},
        now=10.0,
    )
    assert [v.keys for v in verdicts] == [("refused",), ("late",)]
    assert verdicts[0].reason == "no worker can run runtime 'cuda'"
    assert "they need runtime 'swift'" in verdicts[1].reason
    assert "offer runtimes {'tcp://x': ['cpu']}" in verdicts[1].reason
    assert "no_worker_timeout_s" in verdicts[1].reason
    # a worker that closed on purpose is not a reason to fail, nor history
    stuck.joined("tcp://y", "v")
    stuck.left("tcp://y", "v", lost=False)
    assert "v" not in stuck.workers
