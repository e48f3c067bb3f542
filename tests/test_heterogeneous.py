"""A heterogeneous local cluster: an MLX worker and a NumPy worker."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import PlacementError
from tests.conftest import probe_data

mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
CENTER = (8.6, 14.2)


@pytest.fixture(scope="module")
def hetero() -> Any:
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    cluster = start_local_cluster(workers=[{"runtimes": ["cpu"]}, {"runtimes": ["mps"]}])
    client = Client(cluster, set_as_default=False)
    workers = client.scheduler_info()["workers"]
    mlx = [a for a, w in workers.items() if "qf-runtime-mps" in w["resources"]]
    numpy_only = [a for a, w in workers.items() if "qf-runtime-mps" not in w["resources"]]
    assert len(mlx) == 1 and len(numpy_only) == 1
    try:
        yield client, mlx[0], numpy_only[0]
    finally:
        client.close()
        cluster.close()


@pytest.mark.cluster
@pytest.mark.mps
def test_mlx_tasks_land_only_on_the_mlx_worker(rng: np.random.Generator, hetero: Any) -> None:
    client, mlx_worker, numpy_worker = hetero
    data = probe_data(rng, scan=(12, 5))
    ds = qf.open(data, chunk_rows=1)
    lazy = [qf.virtual_bf(ds, radius=4.5, center=CENTER), qf.center_of_mass(ds, center=CENTER)]
    bf_mps, com_mps = qf.compute(*lazy, client=client, backend="mps")
    bf_cpu, com_cpu = qf.compute(*lazy, client=client, backend="cpu")
    np.testing.assert_array_equal(bf_mps.data, bf_cpu.data)
    np.testing.assert_allclose(com_mps.data, com_cpu.data, rtol=1e-12)
    mps_records = bf_mps.provenance.execution["chunks"]
    cpu_records = bf_cpu.provenance.execution["chunks"]
    assert {r["worker"] for r in mps_records} == {mlx_worker}
    assert {r["runtime"] for r in mps_records} == {"mps"}
    assert {r["worker"] for r in cpu_records} == {numpy_worker}  # the MLX worker runs no cpu
    assert {r["runtime"] for r in cpu_records} == {"cpu"}
    details = bf_mps.provenance.execution["runtime_details"]
    assert details and details[0]["runtime"] == "mps"


@pytest.mark.cluster
@pytest.mark.mps
def test_persisted_for_mlx_stays_on_the_mlx_worker(rng: np.random.Generator, hetero: Any) -> None:
    client, mlx_worker, _ = hetero
    data = probe_data(rng, scan=(8, 5))
    p = qf.open(data, chunk_rows=2).persist(client=client, backend="mps")
    try:
        assert {w for ws in p.resident.holders().values() for w in ws} == {mlx_worker}

        def residency(dask_worker: Any) -> dict[str, int]:
            return dict(dask_worker.data.resident_bytes())

        held = client.run(residency)[mlx_worker]
        assert any(k.startswith("mps/") for k in held), held  # MLX payloads, not host data
        (bf,) = qf.compute(qf.virtual_bf(p, radius=4.5, center=CENTER))
        assert {r["worker"] for r in bf.provenance.execution["chunks"]} == {mlx_worker}
        (ref,) = qf.compute(
            qf.virtual_bf(qf.open(data), radius=4.5, center=CENTER), client="synchronous"
        )
        np.testing.assert_array_equal(bf.data, ref.data)
    finally:
        p.release()


@pytest.mark.cluster
def test_runtime_no_worker_has_is_refused_loudly(rng: np.random.Generator) -> None:
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    cluster = start_local_cluster(workers=[{"runtimes": ["cpu"]}])
    client = Client(cluster, set_as_default=False)
    try:
        ds = qf.open(probe_data(rng, scan=(3, 4)))
        with pytest.raises(PlacementError, match="no worker can run runtime 'mps'"):
            qf.compute(qf.virtual_bf(ds, radius=3, center=CENTER), client=client, backend="mps")
    finally:
        client.close()
        cluster.close()
