"""External runtimes through the command line, the cluster helper and a person's browser."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.cli import main
from quantem_flow.runtimes.external.reference_worker import ReferenceWorker, serve_websocket
from quantem_flow.runtimes.external.workers import WebGpuBrowserRuntime, WebGpuNodeRuntime
from tests.conftest import probe_data
from tests.external.test_cluster import chunk_bytes_moved


def test_worker_command_names_external_runtimes(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["worker", "tcp://127.0.0.1:8786", "--runtime", "external-reference,cpu", "--dry-run"])
        == 0
    )
    out = capsys.readouterr().out
    assert "--qf-runtimes external-reference,cpu" in out
    assert main(
        [
            "worker",
            "tcp://127.0.0.1:8786",
            "--runtime",
            "webgpu-browser",
            "--no-launch",
            "--dry-run",
        ]
    ) in (0, 2)
    out = capsys.readouterr()
    if WebGpuBrowserRuntime.available()[0]:
        assert out.out.startswith("QF_WEBGPU_BROWSER_LAUNCH=0 ")
    # an in-process call changes nothing here (later browser runtimes still launch Chromium)
    assert os.environ.get("QF_WEBGPU_BROWSER_LAUNCH") != "0"
    assert main(["worker", "tcp://127.0.0.1:8786", "--runtime", "webgpu-nope", "--dry-run"]) == 2
    assert "available" in capsys.readouterr().err


def test_person_opens_the_printed_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """``--no-launch``: the bridge prints a loopback URL; whoever opens it becomes the worker."""
    (tmp_path / "index.html").write_text("<p>page</p>")
    monkeypatch.setenv("QF_WEBGPU_PAGE", str(tmp_path))
    monkeypatch.setenv("QF_WEBGPU_BROWSER_LAUNCH", "0")
    rt = WebGpuBrowserRuntime(hello_timeout=30)
    started: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: started.setdefault("hello", rt.start()))
    thread.start()
    url = None
    deadline = time.monotonic() + 20
    text = ""
    while url is None and time.monotonic() < deadline:
        text += capfd.readouterr().err
        found = re.search(r"open (http://127\.0\.0\.1:\d+/\?token=[\w-]+) in a browser", text)
        url = found.group(1) if found else None
        time.sleep(0.05)
    assert url is not None, text
    socket_url = url.replace("http://", "ws://").replace("/?token=", "/qf-worker?token=")
    page = threading.Thread(
        target=lambda: asyncio.run(serve_websocket(socket_url, ReferenceWorker(runtime="webgpu"))),
        daemon=True,
    )
    page.start()
    thread.join(30)
    try:
        assert started["hello"].runtime == "webgpu"
        assert rt.session.ping() < 5
    finally:
        rt.close()


@pytest.mark.cluster
@pytest.mark.slow
def test_local_cluster_with_a_webgpu_worker(rng: np.random.Generator) -> None:
    from distributed import Client

    from quantem_flow.runtimes.external.workers import web_dist
    from tests.npm_registry import require_web_build

    require_web_build(web_dist() / "node-worker.js", what="the Node WebGPU worker")
    ok, why = WebGpuNodeRuntime.available()
    assert ok, why

    from quantem_flow.graphs.cluster import start_local_cluster

    cluster = start_local_cluster(workers=[{"runtimes": ["cpu"]}, {"runtimes": ["webgpu"]}])
    client = Client(cluster, set_as_default=False)
    try:
        workers = client.scheduler_info()["workers"]
        (gpu,) = [a for a, w in workers.items() if "qf-runtime-webgpu" in w["resources"]]
        assert workers[gpu]["resources"]["qf-budget-webgpu"] > 0
        data = probe_data(rng, scan=(6, 5))
        ds = qf.open(data, chunk_rows=2)
        (bf,) = qf.compute(
            qf.virtual_bf(ds, radius=4.5, center=(8.6, 14.2)), client=client, backend="webgpu"
        )
        (ref,) = qf.compute(qf.virtual_bf(ds, radius=4.5, center=(8.6, 14.2)), client="synchronous")
        np.testing.assert_array_equal(bf.data, ref.data)
        assert {r["worker"] for r in bf.provenance.execution["chunks"]} == {gpu}
        details = bf.provenance.execution["runtime_details"]
        assert details[0]["accumulation"]["integer"] == "u32x2"
        # persisted on the WebGPU worker: queries run there and no chunk byte moves
        p = ds.persist(client=client, backend="webgpu")
        try:
            assert {w for ws in p.resident.holders().values() for w in ws} == {gpu}
            for _ in range(2):
                (bf2,) = qf.compute(qf.virtual_bf(p, radius=4.5, center=(8.6, 14.2)), client=client)
                np.testing.assert_array_equal(bf2.data, ref.data)
                recs = bf2.provenance.execution["chunks"]
                assert {r["worker"] for r in recs} == {gpu}
                assert all(r["resident"] for r in recs)
            assert chunk_bytes_moved(client, p.resident.keys) == 0
        finally:
            p.release()
    finally:
        client.close()
        cluster.close()


def test_a_client_knows_external_runtimes_by_name() -> None:
    """A fresh process (a client of a remote cluster) resolves ``backend="webgpu"`` by name."""
    import subprocess
    import sys

    code = (
        "from quantem_flow.runtimes import resolve_backend, runtime_specs\n"
        "assert 'webgpu' not in runtime_specs()\n"
        "print(resolve_backend('webgpu-browser').chosen if "
        "__import__('quantem_flow.runtimes.external.workers', fromlist=['x'])"
        ".WebGpuBrowserRuntime.available()[0] else 'webgpu-browser')\n"
        "from quantem_flow.runtimes import get_spec\n"
        "print(get_spec('webgpu').residency, get_spec('external-reference').name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["webgpu-browser", "external", "external-reference"]
