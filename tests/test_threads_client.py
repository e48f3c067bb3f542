"""``client="threads"``: this process on a thread per CPU, no cluster to start."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import CorruptChunkError, ParameterError
from quantem_flow.graphs.runner import in_process_threads

CENTER = (11.6, 9.3)


def _ops(ds: qf.Dataset4D) -> list[Any]:
    return [
        qf.virtual_bf(ds, radius=5, center=CENTER),
        qf.virtual_adf(ds, inner=7, outer=11, center=CENTER),
        qf.center_of_mass(ds, center=CENTER),
        qf.sum_diffraction(ds),
    ]


def _same(a: Any, b: Any) -> None:
    for x, y in zip(a, b, strict=True):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


@pytest.fixture
def npy(rng: np.random.Generator, tmp_path: Path) -> Path:
    path = tmp_path / "d.npy"
    np.save(path, rng.poisson(6, size=(16, 11, 24, 20)).astype(np.uint16))
    return path


def test_threads_equal_synchronous_and_say_where_they_ran(npy: Path) -> None:
    ds = qf.open(npy, chunk_rows=2)
    one = qf.compute(*_ops(ds), client="synchronous", progress=False)
    many = qf.compute(*_ops(ds), client="threads", progress=False)
    _same(one, many)
    execution = many[0].provenance.to_dict()["execution"]
    n = in_process_threads()
    assert n >= 1
    assert execution["scheduler"] == f"threads (in this process on {n} threads, no workers)"
    workers = {c["worker"] for c in execution["chunks"]}
    assert len(execution["chunks"]) == 8
    prefix = "in-process (thread " if n > 1 else "in-process (synchronous)"
    assert all(w.startswith(prefix) for w in workers), workers
    assert execution["content_digest"] == one[0].provenance.to_dict()["execution"]["content_digest"]


def test_persisted_in_process_computes_with_either_and_refuses_a_cluster(npy: Path) -> None:
    ds = qf.open(npy, chunk_rows=3)
    want = qf.compute(*_ops(ds), client="synchronous", progress=False)
    p = ds.persist(client="threads")
    _same(want, qf.compute(*_ops(p), client="threads", progress=False))
    _same(want, qf.compute(*_ops(p), client="synchronous", progress=False))
    _same(want, qf.compute(*_ops(p), progress=False))  # None: where it is held
    with pytest.raises(ParameterError, match="'threads'") as info:
        qf.compute(qf.sum_diffraction(p), client="tcp://127.0.0.1:1", progress=False)
    assert "tcp://127.0.0.1:1" in str(info.value)
    assert pickle.loads(pickle.dumps(info.value)).args == info.value.args


def test_a_damaged_file_gives_the_projects_error_from_a_thread(npy: Path) -> None:
    ds = qf.open(npy, chunk_rows=2)
    with open(npy, "r+b") as f:  # the file loses its last scan rows after it was opened
        f.truncate(npy.stat().st_size - 3 * 11 * 24 * 20 * 2)
    with pytest.raises(CorruptChunkError) as info:
        qf.compute(qf.sum_diffraction(ds), client="threads", progress=False)
    assert str(npy) in str(info.value) or npy.name in str(info.value)


def test_a_threads_compute_starts_no_cluster_and_imports_no_distributed(npy: Path) -> None:
    code = (
        "import json, sys\n"
        "import quantem_flow as qf\n"
        f"ds = qf.open({str(npy)!r}, chunk_rows=4)\n"
        f"(r,) = qf.compute(qf.virtual_bf(ds, radius=5, center={CENTER}), client='threads',\n"
        "                  progress=False)\n"
        "print(json.dumps({'distributed': 'distributed' in sys.modules,\n"
        "                  'total': float(r.data.sum())}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["distributed"] is False
    ds = qf.open(npy, chunk_rows=4)
    (ref,) = qf.compute(qf.virtual_bf(ds, radius=5, center=CENTER), client="synchronous")
    assert out["total"] == float(ref.data.sum())


def test_the_cli_and_pipelines_take_threads() -> None:
    from quantem_flow.cli import _start_client
    from quantem_flow.pipeline.run import _connect

    client, where = _start_client("threads")
    assert client == "threads" and where.startswith("threads (this process on ")
    assert _connect("threads") == ("threads", False)
    with pytest.raises(ParameterError, match="'threads'"):
        _connect("fast")
