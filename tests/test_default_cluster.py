"""Defaults of the embedded local cluster (issue 14).

The worker programs get what a Nanny sets before it spawns a worker, except
``MALLOC_TRIM_THRESHOLD_``: setting it turns off glibc's dynamic mmap
threshold, so every buffer above 128 KiB that HDF5 and the codecs allocate
per chunk became a fresh mmap (measured: HDF5 reads several times slower in
the workers than in one process; docs/architecture-notes.md).
"""

from __future__ import annotations

import os

import dask.config
import pytest

from quantem_flow.graphs import cluster as qc


def _env(monkeypatch: pytest.MonkeyPatch, user: str | None) -> dict[str, str]:
    if user is None:
        monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    else:
        monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", user)
    spawn = {"MALLOC_TRIM_THRESHOLD_": 65536, "OMP_NUM_THREADS": 1}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": spawn}):
        return qc.WorkerProgram("tcp://127.0.0.1:1", name="w")._environment()


def test_worker_environment_drops_the_malloc_trim_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = _env(monkeypatch, None)
    assert "MALLOC_TRIM_THRESHOLD_" not in env
    assert env["OMP_NUM_THREADS"] == "1"  # the rest of Dask's pre-spawn environment is kept


def test_a_malloc_trim_threshold_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _env(monkeypatch, "131072")["MALLOC_TRIM_THRESHOLD_"] == "131072"


def test_worker_programs_run_without_the_malloc_trim_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from distributed import Client

    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    cluster = qc.start_local_cluster(n_workers=1, threads_per_worker=1)
    try:
        with Client(cluster, set_as_default=False) as client:
            seen = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
    finally:
        cluster.close()
    assert list(seen.values()) == [None]
