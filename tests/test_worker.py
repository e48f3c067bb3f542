"""Quantem-flow workers: probing, advertising capabilities, preload, CLI, local clusters."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from distributed import Client, Scheduler, Worker
from distributed.diagnostics.plugin import SchedulerPlugin

from quantem_flow.cli import main
from quantem_flow.errors import ParameterError, RuntimeUnavailableError
from quantem_flow.graphs.capabilities import parse_resources
from quantem_flow.graphs.cluster import start_local_cluster
from quantem_flow.graphs.worker import (
    PLUGIN_NAME,
    QuantemFlowWorkerPlugin,
    probe_capabilities,
    worker_options,
)
from quantem_flow.graphs.worker_data import ResidentAwareData
from quantem_flow.runtimes import available_runtimes

MODULE = "quantem_flow.graphs.worker"
STARTUP_S = 60.0


# -- probing ----------------------------------------------------------------------------------
def test_probe_returns_cpu_with_a_positive_budget() -> None:
    slots, budgets = probe_capabilities()
    assert slots["cpu"] == 1.0
    assert budgets["cpu"] > 0
    assert set(slots) == set(budgets) == set(available_runtimes())


def test_probe_uses_nthreads_memory_limit_and_fraction() -> None:
    slots, budgets = probe_capabilities(
        runtimes=["cpu"], nthreads=3, memory_limit=10_000, budget_fraction=0.5
    )
    assert slots == {"cpu": 3.0}
    assert budgets == {"cpu": 5_000}


def test_probe_restricts_to_the_requested_runtimes() -> None:
    if "mps" not in available_runtimes():
        pytest.skip("the mps runtime (MLX) is not available here")
    slots, budgets = probe_capabilities(runtimes=["mps"], memory_limit=10_000)
    assert set(slots) == set(budgets) == {"mps"}
    assert slots["mps"] == 1.0
    assert budgets["mps"] > 0


def test_asking_for_cuda_without_a_gpu_names_what_is_available() -> None:
    if "cuda" in available_runtimes():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeUnavailableError, match=r"cuda.*available.*'cpu'"):
        probe_capabilities(runtimes=["cpu", "cuda"])
    # cuda is a registered runtime: the client may lack the GPU its workers have, so
    # availability is checked on the worker (at setup), never on the client
    QuantemFlowWorkerPlugin(runtimes=["cuda"])
    with pytest.raises(RuntimeUnavailableError, match="cpu"):
        QuantemFlowWorkerPlugin(runtimes=["warp"])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget_fraction": 0.0}, "budget_fraction"),
        ({"budget_fraction": 1.5}, "budget_fraction"),
        ({"runtimes": []}, "at least one runtime"),
        ({"nthreads": 0}, "nthreads"),
        ({"memory_limit": -1}, "memory_limit"),
    ],
)
def test_probe_rejects_bad_parameters(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ParameterError, match=match):
        probe_capabilities(**kwargs)


def test_plugin_rejects_budgets_for_unknown_runtimes() -> None:
    with pytest.raises(ParameterError, match="unknown runtime"):
        QuantemFlowWorkerPlugin(budgets={"tpu": 10})
    with pytest.raises(ParameterError, match="bytes"):
        QuantemFlowWorkerPlugin(budgets={"cpu": -1})


def test_worker_options() -> None:
    opts = worker_options(runtimes=["cpu"], memory_limit="1 GiB")
    assert opts["memory_limit"] == 2**30
    (plugin,) = opts["plugins"]
    assert isinstance(plugin, QuantemFlowWorkerPlugin)
    assert plugin.runtimes == ("cpu",)
    cls, kwargs = opts["data"]
    assert cls is ResidentAwareData
    assert kwargs == {"memory_limit": 2**30}
    with pytest.raises(ParameterError, match="memory_limit"):
        worker_options(memory_limit="lots")


# -- advertising in-process ------------------------------------------------------------------
class RecordRegistrations(SchedulerPlugin):  # type: ignore[misc]
    """Record each worker's resources at the moment it registers."""

    name = "record-registrations"

    def __init__(self) -> None:
        self.at_registration: dict[str, dict[str, float]] = {}

    def add_worker(self, scheduler: Any, worker: str) -> None:
        self.at_registration[worker] = dict(scheduler.workers[worker].resources)


def _qf_resources(resources: dict[str, float]) -> dict[str, float]:
    # the memory pool (qf-memory-*) and the process's own share (qf-reserve-host) depend on
    # the process's own memory: tests/test_admission.py
    return {
        k: v
        for k, v in resources.items()
        if k.startswith("qf-") and not k.startswith(("qf-memory-", "qf-reserve-"))
    }


async def _scheduler(recorder: RecordRegistrations | None = None) -> Scheduler:
    plugins = [recorder] if recorder is not None else []
    return await Scheduler(
        host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0", plugins=plugins
    )


def _run(coro: Any) -> Any:
    """Run an in-process cluster test (no gen_cluster: its leak checks trip on the
    session-scoped process cluster of other test modules)."""
    return asyncio.run(asyncio.wait_for(coro, STARTUP_S))


def test_plugin_at_construction_advertises_before_registration() -> None:
    async def body() -> None:
        recorder = RecordRegistrations()
        async with (
            await _scheduler(recorder) as s,
            Worker(
                s.address,
                nthreads=2,
                dashboard_address="127.0.0.1:0",
                **worker_options(runtimes=["cpu"], memory_limit="1 GiB", nthreads=2),
            ) as a,
            Worker(s.address, nthreads=1, dashboard_address="127.0.0.1:0") as b,
            Client(s.address, asynchronous=True) as c,
        ):
            expected = {"qf-runtime-cpu": 2.0, "qf-budget-cpu": float(int(0.8 * 2**30))}
            assert _qf_resources(recorder.at_registration[a.address]) == expected
            assert _qf_resources(recorder.at_registration[b.address]) == {}
            assert not s.tasks  # nothing has run
            info = await c.scheduler.identity(n_workers=-1)
            assert _qf_resources(info["workers"][a.address]["resources"]) == expected
            assert list(info["workers"][a.address]["quantem_flow"]["runtimes"]) == ["cpu"]
            assert a.state.available_resources["qf-runtime-cpu"] == 2.0
            assert isinstance(a.data, ResidentAwareData)
            assert a.data.memory_limit == 2**30
            caps = parse_resources(a.address, s.workers[a.address].resources, nthreads=2)
            assert caps.runtimes == frozenset({"cpu"})
            assert caps.budgets == {"cpu": int(0.8 * 2**30)}
            # tasks asking for the runtime slot run on the advertising worker only
            futs = c.map(lambda i: i, range(4), resources={"qf-runtime-cpu": 1}, pure=False)
            assert await c.gather(futs) == [0, 1, 2, 3]
            assert set(a.data) == {f.key for f in futs}
            assert not b.data

    _run(body())


def test_register_plugin_on_a_running_worker() -> None:
    async def body() -> None:
        async with (
            await _scheduler() as s,
            Worker(s.address, nthreads=1, dashboard_address="127.0.0.1:0") as a,
            Client(s.address, asynchronous=True) as c,
        ):
            assert _qf_resources(s.workers[a.address].resources) == {}
            await c.register_plugin(QuantemFlowWorkerPlugin(runtimes=["cpu"], budget_fraction=0.5))
            resources = _qf_resources(s.workers[a.address].resources)
            assert resources["qf-runtime-cpu"] == 1.0
            assert resources["qf-budget-cpu"] > 0
            assert isinstance(a.plugins[PLUGIN_NAME], QuantemFlowWorkerPlugin)
            assert a.metrics["qf-runtimes"](a) == "cpu"
            # registering again with other runtimes withdraws the ones left out
            if "mps" in available_runtimes():
                await c.register_plugin(QuantemFlowWorkerPlugin(runtimes=["mps"]))
                resources = _qf_resources(s.workers[a.address].resources)
                assert resources["qf-runtime-cpu"] == 0.0
                assert resources["qf-runtime-mps"] == 1.0

    _run(body())


def test_preload_in_process() -> None:
    async def body() -> None:
        recorder = RecordRegistrations()
        async with (
            await _scheduler(recorder) as s,
            Worker(
                s.address,
                nthreads=1,
                memory_limit="512 MiB",
                dashboard_address="127.0.0.1:0",
                preload=[MODULE],
                preload_argv=["--qf-runtimes", "cpu", "--qf-budget-fraction", "0.25"],
            ) as w,
        ):
            assert _qf_resources(recorder.at_registration[w.address]) == {
                "qf-runtime-cpu": 1.0,
                "qf-budget-cpu": float(int(0.25 * 512 * 2**20)),
            }
            assert isinstance(w.data, ResidentAwareData)
            assert w.state.data is w.data
            assert w.data.memory_limit == 512 * 2**20

    _run(body())


def test_preload_with_an_unavailable_runtime_fails_the_worker() -> None:
    if "cuda" in available_runtimes():
        pytest.skip("this machine has CUDA")

    async def body() -> None:
        async with await _scheduler() as s:
            with pytest.raises(RuntimeError, match="failed to start") as info:
                async with Worker(
                    s.address,
                    nthreads=1,
                    dashboard_address="127.0.0.1:0",
                    preload=[MODULE],
                    preload_argv=["--qf-runtimes", "cuda"],
                ):
                    pass
            assert isinstance(info.value.__cause__, RuntimeUnavailableError)
            assert not s.workers

    _run(body())


# -- processes: dask scheduler / dask worker / quantem-flow worker ---------------------------
def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


@pytest.fixture(scope="module")
def scheduler_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``dask scheduler`` subprocess on 127.0.0.1, a random port."""
    folder = tmp_path_factory.mktemp("scheduler")
    scheduler_file = folder / "scheduler.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "distributed.cli.dask_scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--dashboard-address",
            "127.0.0.1:0",
            "--scheduler-file",
            str(scheduler_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=(folder / "scheduler.log").open("wb"),
        cwd=folder,
    )
    try:
        deadline = time.monotonic() + STARTUP_S
        address = None
        while address is None:
            assert proc.poll() is None, (folder / "scheduler.log").read_text()
            assert time.monotonic() < deadline, "the dask scheduler did not start"
            try:
                address = json.loads(scheduler_file.read_text())["address"]
            except (OSError, ValueError, KeyError):
                time.sleep(0.1)
        assert address.startswith("tcp://127.0.0.1:")
        yield address
    finally:
        _stop(proc)


def _wait_for_worker(client: Client, name: str, proc: subprocess.Popen[bytes], log: Path) -> Any:
    deadline = time.monotonic() + STARTUP_S
    while True:
        for info in client.scheduler_info()["workers"].values():
            if info["name"] == name:
                return info
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"worker {name} did not register: {log.read_text()}"
        time.sleep(0.2)


def _run_worker(cmd: list[str], scheduler: str, name: str, tmp_path: Path) -> dict[str, Any]:
    log = tmp_path / f"{name}.log"
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        with Client(scheduler, set_as_default=False, timeout=10) as client:
            info: dict[str, Any] = _wait_for_worker(client, name, proc, log)
            assert info["host"] == "127.0.0.1"
            return info
    finally:
        _stop(proc)


@pytest.mark.cluster
def test_dask_worker_with_the_preload_registers_its_resources(
    scheduler_address: str, tmp_path: Path
) -> None:
    cmd = [
        sys.executable,
        "-m",
        "distributed.cli.dask_worker",
        scheduler_address,
        "--host",
        "127.0.0.1",
        "--dashboard-address",
        "127.0.0.1:0",
        "--nthreads",
        "2",
        "--memory-limit",
        "1 GiB",
        "--name",
        "preloaded",
        "--preload",
        MODULE,
        "--qf-runtimes",
        "cpu",
    ]
    info = _run_worker(cmd, scheduler_address, "preloaded", tmp_path)
    assert _qf_resources(info["resources"]) == {
        "qf-runtime-cpu": 2.0,
        "qf-budget-cpu": float(int(0.8 * 2**30)),
    }
    assert list(info["quantem_flow"]["runtimes"]) == ["cpu"]


@pytest.mark.cluster
def test_quantem_flow_worker_cli_registers(scheduler_address: str, tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "quantem_flow",
        "worker",
        scheduler_address,
        "--runtimes",
        "cpu",
        "--nthreads",
        "1",
        "--memory-limit",
        "512 MiB",
        "--name",
        "qf-cli",
    ]
    info = _run_worker(cmd, scheduler_address, "qf-cli", tmp_path)
    assert _qf_resources(info["resources"]) == {
        "qf-runtime-cpu": 1.0,
        "qf-budget-cpu": float(int(0.8 * 512 * 2**20)),
    }


def test_worker_cli_dry_run_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["worker", "tcp://127.0.0.1:8786", "--runtimes", "cpu", "--name", "w0", "--dry-run"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "distributed.cli.dask_worker tcp://127.0.0.1:8786 --host 127.0.0.1" in out
    assert "--dashboard-address 127.0.0.1:0" in out
    assert f"--preload {MODULE} --qf-runtimes cpu" in out
    assert "--name w0" in out
    if "cuda" not in available_runtimes():
        assert main(["worker", "tcp://127.0.0.1:8786", "--runtimes", "cuda"]) == 2
        err = capsys.readouterr().err
        assert "worker: error:" in err and "available: cpu" in err
    assert main(["worker", "tcp://127.0.0.1:8786", "--nthreads", "0"]) == 2
    assert "--nthreads" in capsys.readouterr().err


# -- local clusters ----------------------------------------------------------------------------
def test_start_local_cluster_rejects_bad_workers() -> None:
    with pytest.raises(ParameterError, match="not both"):
        start_local_cluster(workers=[{"runtimes": ["cpu"]}], n_workers=1)
    with pytest.raises(ParameterError, match="unknown key"):
        start_local_cluster(workers=[{"runtime": ["cpu"]}])
    with pytest.raises(ParameterError, match="at least one"):
        start_local_cluster(workers=[])
    with pytest.raises(ParameterError, match="repeats"):
        start_local_cluster(workers=[{"name": "x"}, {"name": "x"}])
    if "cuda" not in available_runtimes():
        with pytest.raises(RuntimeUnavailableError, match="cpu"):
            start_local_cluster(workers=[{"runtimes": ["cuda"]}])


@pytest.mark.cluster
def test_heterogeneous_local_cluster() -> None:
    pytest.importorskip("mlx.core", reason="MLX is not importable: no mps runtime here")
    if "mps" not in available_runtimes():
        pytest.skip("MLX imports but the mps runtime is not available")
    cluster = start_local_cluster(
        workers=[{"runtimes": ["cpu"]}, {"runtimes": ["mps"], "name": "mlx-0"}],
        threads_per_worker=1,
    )
    try:
        with Client(cluster, set_as_default=False) as client:
            workers = client.scheduler_info()["workers"]
            by_name = {w["name"]: w for w in workers.values()}
            assert set(by_name) == {"qf-0-cpu", "mlx-0"}
            cpu = _qf_resources(by_name["qf-0-cpu"]["resources"])
            mps = _qf_resources(by_name["mlx-0"]["resources"])
            assert set(cpu) == {"qf-runtime-cpu", "qf-budget-cpu"}
            assert set(mps) == {"qf-runtime-mps", "qf-budget-mps"}
            assert all(w["host"] == "127.0.0.1" for w in workers.values())
            assert client.scheduler.address.startswith("tcp://127.0.0.1:")
            # a task needing the mps slot lands on the mps worker
            fut = client.submit(lambda: 1, resources={"qf-runtime-mps": 1}, pure=False)
            assert fut.result(timeout=30) == 1
            where = client.who_has([fut])[fut.key]
            mps_addr = next(a for a, w in workers.items() if w["name"] == "mlx-0")
            assert list(where) == [mps_addr]
            kinds = client.run(lambda dask_worker: type(dask_worker.data).__name__)
            assert set(kinds.values()) == {"ResidentAwareData"}
    finally:
        cluster.close()
