"""Shared fixtures: fresh random inputs each run, a local cluster on 127.0.0.1."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded freshly each run; the seed is printed for reproduction."""
    seed = secrets.randbits(32)
    print(f"random seed for {request.node.nodeid}: {seed}")
    return np.random.default_rng(seed)


def probe_data(
    rng: np.random.Generator,
    scan: tuple[int, int] = (7, 9),
    det: tuple[int, int] = (20, 26),
    *,
    center: tuple[float, float] = (8.6, 14.2),
    radius: float = 4.5,
    dtype: Any = np.uint16,
    bright: int = 60,
    background: float = 1.5,
) -> np.ndarray:
    """Random frames with a probe disk off the detector centre (rectangular everything)."""
    rr, cc = np.indices(det)
    disk = (rr - center[0]) ** 2 + (cc - center[1]) ** 2 < radius**2
    lam = background + bright * disk
    shifts = rng.integers(-1, 2, size=(*scan, 2))
    data = np.empty((*scan, *det), dtype=dtype)
    for i in range(scan[0]):
        for j in range(scan[1]):
            data[i, j] = rng.poisson(np.roll(lam, tuple(shifts[i, j]), axis=(0, 1)))
    return data


def dask_thread_cluster(n_workers: int = 1, threads_per_worker: int = 1, **options: Any) -> Any:
    """A plain ``distributed.LocalCluster`` in this process (not quantem-flow's), on 127.0.0.1.

    ``processes=False`` needs ``protocol="tcp://"``: Dask's in-process transport has no host.
    """
    from distributed import LocalCluster

    return LocalCluster(
        n_workers=n_workers,
        threads_per_worker=threads_per_worker,
        processes=False,
        protocol="tcp://",
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
        **options,
    )


def _local_client(n_workers: int, threads_per_worker: int) -> Iterator[Any]:
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    cluster = start_local_cluster(n_workers=n_workers, threads_per_worker=threads_per_worker)
    client = Client(cluster, set_as_default=False)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture(scope="session")
def cluster_client() -> Iterator[Any]:
    """A 2-process LocalCluster bound to 127.0.0.1 (dashboard included)."""
    yield from _local_client(2, 1)


@pytest.fixture(scope="module")
def one_worker_client() -> Iterator[Any]:
    """A LocalCluster of one worker process with two threads (the embedded default's shape)."""
    yield from _local_client(1, 2)


def five_operators(ds: Any, center: tuple[float, float] = (8.6, 14.2)) -> list[Any]:
    """BF, ADF, CoM, sum and maximum pattern over ``ds`` around ``center`` (px)."""
    import quantem_flow as qf

    return [
        qf.virtual_bf(ds, radius=4.5, center=center),
        qf.virtual_adf(ds, inner=7.0, center=center),
        qf.center_of_mass(ds, center=center),
        qf.sum_diffraction(ds),
        qf.max_diffraction(ds),
    ]
