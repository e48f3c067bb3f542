"""A killed worker of the local cluster is restarted, and the exit is logged (issue 11, item 7)."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

pytestmark = pytest.mark.cluster


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
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    workers = client.scheduler_info()["workers"]
                    if len(workers) == 2 and victim not in workers:
                        break
                    time.sleep(0.2)
                else:
                    pytest.fail(f"no worker came back within 60 s after SIGKILL of {victim}")
        text = caplog.text
        assert "exited with signal 9; restarting it" in text, text
        assert "is back at tcp://127.0.0.1:" in text, text
    finally:
        client.close()
        cluster.close()
