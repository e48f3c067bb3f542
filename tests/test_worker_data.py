"""ResidentAwareData: device payloads stay in memory, host data spills as usual."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest

from quantem_flow.errors import ParameterError
from quantem_flow.graphs.worker_data import ResidentAwareData, is_device_payload
from quantem_flow.representations.chunk import Chunk

KIB = 1024


class NeverPickled:
    """A payload that fails the test if anything tries to pickle it."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def __reduce__(self) -> Any:
        raise AssertionError("a device payload was pickled")


class FakeCupyArray(NeverPickled):
    """Looks like a CuPy array by its module."""


FakeCupyArray.__module__ = "cupy._core.core"


def device_chunk(nbytes: int, residency: str = "mps") -> Chunk:
    return Chunk(
        representation="dense",
        residency=residency,
        scan_slice=((0, 1), (0, 4)),
        payload=NeverPickled(nbytes),
        storage_schema="dense-v1",
    )


def host_array(nbytes: int, value: int = 1) -> np.ndarray:
    return np.full(nbytes // 8, value, dtype=np.float64)


@pytest.fixture
def data(tmp_path: Path) -> ResidentAwareData:
    """A mapping whose host target is 4 KiB."""
    with dask.config.set({"distributed.worker.memory.target": 0.5}):
        return ResidentAwareData(tmp_path, memory_limit=8 * KIB)


def spill_files(folder: Path) -> list[str]:
    storage = folder / "storage"
    return sorted(os.listdir(storage)) if storage.exists() else []


def test_target_follows_distributed(data: ResidentAwareData, tmp_path: Path) -> None:
    assert data.target == 4 * KIB
    assert data.spill_directory == str(tmp_path / "storage")
    unlimited = ResidentAwareData(tmp_path / "other")
    assert unlimited.memory_limit is None
    assert unlimited.target > 2**60
    unlimited.set_memory_limit("10 MiB")
    assert unlimited.memory_limit == 10 * 2**20
    assert unlimited.target == int(10 * 2**20 * dask.config.get("distributed.worker.memory.target"))
    with pytest.raises(ParameterError, match="memory_limit"):
        ResidentAwareData(tmp_path, memory_limit="plenty")


def test_host_arrays_spill_to_disk(data: ResidentAwareData, tmp_path: Path) -> None:
    arrays = {f"h{i}": host_array(3 * KIB, i) for i in range(3)}
    for key, value in arrays.items():
        data[key] = value
    assert len(data.slow) >= 1
    assert data.spilled_total.disk > 0
    assert spill_files(tmp_path)
    for key, value in arrays.items():  # round trip through disk
        np.testing.assert_array_equal(data[key], value)
    big = host_array(8 * KIB)  # larger than the target: straight to disk
    data["big"] = big
    assert "big" in data.slow


def test_device_payloads_stay_in_memory_and_are_never_pickled(
    data: ResidentAwareData, tmp_path: Path
) -> None:
    data["chunk-mps"] = device_chunk(64 * KIB)  # 16x the target
    data["chunk-cuda"] = device_chunk(64 * KIB, residency="cuda:0")
    data["raw-cupy"] = FakeCupyArray(64 * KIB)
    for i in range(4):
        data[f"h{i}"] = host_array(3 * KIB)
    while data.evict() != -1:  # what the memory monitor does under pressure
        pass
    assert set(data.device) == {"chunk-mps", "chunk-cuda", "raw-cupy"}
    assert not data.fast
    assert set(data.slow) == {f"h{i}" for i in range(4)}
    assert len(spill_files(tmp_path)) == 4
    assert isinstance(data["chunk-mps"].payload, NeverPickled)


def test_raw_mlx_arrays_stay_in_memory(data: ResidentAwareData, tmp_path: Path) -> None:
    mx = pytest.importorskip("mlx.core", reason="MLX is not importable")
    a = mx.ones((64, 64))  # 16 KiB of float32
    data["mlx"] = a
    chunk = Chunk("dense", "mps", ((0, 1), (0, 1)), mx.zeros((1, 1, 64, 64)), "dense-v1")
    data["mlx-chunk"] = chunk
    for i in range(3):
        data[f"h{i}"] = host_array(3 * KIB)
    while data.evict() != -1:
        pass
    assert data["mlx"] is a
    assert data["mlx-chunk"] is chunk
    assert set(data.device) == {"mlx", "mlx-chunk"}
    assert len(spill_files(tmp_path)) == 3
    assert data.resident_bytes()["mps/mlx-array"] == 64 * 64 * 4


def test_is_device_payload() -> None:
    assert is_device_payload(device_chunk(8))
    assert is_device_payload(FakeCupyArray(8))
    assert not is_device_payload(np.zeros(3))
    assert not is_device_payload(
        Chunk("dense", "host", ((0, 1), (0, 1)), np.zeros((1, 1, 2, 2)), "dense-v1")
    )
    assert not is_device_payload({"a": 1})


def test_mapping_semantics(data: ResidentAwareData) -> None:
    data["d"] = device_chunk(16)
    data["h"] = host_array(64)
    assert len(data) == 2
    assert sorted(data) == ["d", "h"]
    assert "d" in data and "h" in data and "x" not in data
    assert data.get("x") is None
    with pytest.raises(KeyError):
        data["x"]
    # overwrite: device -> host
    data["d"] = host_array(64, 7)
    assert "d" not in data.device and "d" in data.host
    assert data["d"][0] == 7
    # overwrite: host -> device
    data["h"] = device_chunk(32)
    assert "h" in data.device and "h" not in data.host
    assert len(data) == 2
    del data["d"]
    del data["h"]
    assert len(data) == 0 and not data.device and not data.fast
    with pytest.raises(KeyError):
        del data["d"]
    assert data.resident_bytes() == {}


def test_membership_does_not_unspill(data: ResidentAwareData) -> None:
    for i in range(3):
        data[f"h{i}"] = host_array(3 * KIB)
    spilled = next(iter(data.slow))
    assert spilled in data
    assert spilled in data.slow and spilled not in data.fast


def test_resident_bytes(data: ResidentAwareData) -> None:
    data["d"] = device_chunk(1000)
    data["c"] = device_chunk(500, residency="cuda:1")
    data["h0"] = host_array(3 * KIB)
    data["h1"] = host_array(3 * KIB)  # pushes h0 to disk
    data["x"] = "a string"
    got = data.resident_bytes()
    assert got["mps/dense"] == 1000
    assert got["cuda:1/dense"] == 500
    assert got["disk/other"] == 3 * KIB
    assert got["host/other"] >= 3 * KIB
    assert "evict" not in repr(data) and "device" in repr(data)


def test_evict_with_only_device_data(data: ResidentAwareData) -> None:
    data["d"] = device_chunk(64 * KIB)
    assert not data.fast
    assert data.evict() == -1
    assert "d" in data.device


def make_device_chunk(nbytes: int) -> Chunk:
    return device_chunk(nbytes)


def make_host_array(nbytes: int) -> np.ndarray:
    return host_array(nbytes)


def inspect_worker(keys: list[str], dask_worker: Any = None) -> dict[str, Any]:
    data = dask_worker.data
    folder = Path(data.spill_directory)
    return {
        "type": type(data).__name__,
        "device": sorted(k for k in keys if k in data.device),
        "slow": sorted(k for k in keys if k in data.slow),
        "files": sorted(os.listdir(folder)) if folder.exists() else [],
        "target": data.target,
    }


@pytest.mark.cluster
def test_local_cluster_keeps_device_payloads_out_of_the_spill_directory() -> None:
    from distributed import Client, wait

    from quantem_flow.graphs.cluster import start_local_cluster

    no_monitor = {
        "distributed.worker.memory.target": 0.5,
        "distributed.worker.memory.spill": False,
        "distributed.worker.memory.pause": False,
        "distributed.worker.memory.terminate": False,
    }
    with dask.config.set(no_monitor):
        cluster = start_local_cluster(
            n_workers=1,
            threads_per_worker=1,
            processes=False,
            protocol="tcp://",
            memory_limit=256 * KIB,  # target 128 KiB
        )
    try:
        # distributed.wait() finds the client with default_client()
        with Client(cluster) as client:
            device = client.submit(make_device_chunk, 1024 * KIB, key="device-chunk")
            hosts = [client.submit(make_host_array, 96 * KIB, key=f"host-{i}") for i in range(3)]
            wait([device, *hosts])
            (info,) = client.run(inspect_worker, ["device-chunk"] + [f.key for f in hosts]).values()
            assert info["type"] == "ResidentAwareData"
            assert info["target"] == 128 * KIB
            assert info["device"] == ["device-chunk"]
            assert info["slow"]  # host data does spill
            assert len(info["files"]) == len(info["slow"])
            assert not any("device" in name for name in info["files"])
            with pytest.raises(Exception, match="pickled"):
                pickle.dumps(make_device_chunk(8))  # the payload really refuses pickling
    finally:
        cluster.close()
