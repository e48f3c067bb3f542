"""qf.compute and persist take a scheduler address, as `quantem-flow run --scheduler` does."""

from __future__ import annotations

import socket
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import ParameterError
from quantem_flow.graphs.runner import client_for_address
from tests.conftest import probe_data


def test_compute_and_persist_by_address(cluster_client: Any, rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(6, 5))
    ds = qf.open(data, chunk_rows=2)
    address = cluster_client.scheduler.address
    assert address.startswith("tcp://127.0.0.1:")
    (by_address,) = qf.compute(qf.virtual_bf(ds, radius=4, center=(8, 14)), client=address)
    (in_process,) = qf.compute(qf.virtual_bf(ds, radius=4, center=(8, 14)), client="synchronous")
    np.testing.assert_array_equal(by_address.data, in_process.data)
    assert address in by_address.provenance.execution["scheduler"]
    assert client_for_address(address) is client_for_address(address)  # connected once
    held = ds.persist(client=address)
    try:
        (again,) = qf.compute(qf.virtual_bf(held, radius=4, center=(8, 14)), client=address)
        np.testing.assert_array_equal(again.data, in_process.data)
    finally:
        held.release()


def test_bad_addresses_say_what_is_accepted() -> None:
    with pytest.raises(
        ParameterError, match=r"scheduler address such as 'tcp://127\.0\.0\.1:8786'"
    ):
        qf.compute(
            qf.virtual_bf(qf.open(np.ones((2, 2, 8, 8))), radius=2, center=(4, 4)),
            client="localhost",
        )
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ParameterError, match="could not connect to the scheduler") as err:
        client_for_address(f"tcp://127.0.0.1:{port}", timeout_s=2)
    assert f"127.0.0.1:{port}" in str(err.value)
