"""Laziness, execution on a local cluster, annotations, dispatch and bad inputs."""

from __future__ import annotations

from typing import Any

import h5py
import hdf5plugin
import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import (
    AnnotationError,
    CorruptChunkError,
    DatasetPathError,
    RuntimeUnavailableError,
    ScanShapeError,
    ShapeError,
    SourceNotFoundError,
)
from quantem_flow.graphs import lower_pass, validate_annotations
from quantem_flow.graphs.lowering import LoweredPass
from quantem_flow.io.base import Source
from tests.conftest import probe_data
from tests.reference import ref_annulus, ref_com, ref_virtual


def test_opening_and_building_compute_nothing(
    rng: np.random.Generator, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = probe_data(rng)
    np.save(tmp_path / "d.npy", data)
    calls: list[object] = []

    def boom(self: Source, *args: object, **kwargs: object) -> np.ndarray:
        calls.append(args)
        raise AssertionError("read during build")

    from quantem_flow.io.npy import NpySource

    monkeypatch.setattr(NpySource, "read", boom)
    monkeypatch.setattr(NpySource, "read_frames", boom)
    ds = qf.open(tmp_path / "d.npy").crop_scan((1, 6, 0, 9)).bin_detector(2)
    lazy = [
        qf.virtual_bf(ds),
        qf.virtual_adf(ds),
        qf.center_of_mass(ds),
        qf.idpc(ds),
        qf.mean_diffraction(ds),
        qf.dpc(qf.center_of_mass(ds)),
    ]
    _ = ds.to_dask()
    assert all(isinstance(x, qf.LazyResult) for x in lazy)
    assert calls == []


def test_to_dask_matches_the_data(rng: np.random.Generator) -> None:
    data = probe_data(rng)
    arr = qf.open(data, chunk_rows=3).to_dask()
    assert arr.chunks[0] == (3, 3, 1)
    np.testing.assert_array_equal(arr.compute(scheduler="sync"), data)


@pytest.mark.cluster
def test_one_pass_on_a_local_cluster(rng: np.random.Generator, tmp_path, cluster_client) -> None:
    data = probe_data(rng, scan=(10, 7))
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset(
            "data",
            data=data.reshape(70, *data.shape[2:]),
            chunks=(1, *data.shape[2:]),
            **hdf5plugin.Bitshuffle(cname="lz4"),
        )
    ds = qf.open(tmp_path / "d.h5", dataset_path="/data", scan_shape=(10, 7), chunk_rows=2)
    center = (8.6, 14.2)
    bf, adf, com = qf.compute(
        qf.virtual_bf(ds, radius=4.5, center=center),
        qf.virtual_adf(ds, inner=7, center=center),
        qf.center_of_mass(ds, center=center),
        client=cluster_client,
    )
    np.testing.assert_array_equal(bf.data, ref_virtual(data, ref_annulus((20, 26), center, 0, 4.5)))
    np.testing.assert_array_equal(
        adf.data, ref_virtual(data, ref_annulus((20, 26), center, 7, np.inf))
    )
    np.testing.assert_allclose(com.data, ref_com(data, center), rtol=1e-5)
    ex = bf.provenance.execution
    assert ex["read_once"] and ex["bytes_read"] == data.nbytes
    assert "given distributed.Client" in ex["scheduler"]
    workers = {r["worker"] for r in ex["chunks"]}
    assert workers <= set(cluster_client.scheduler_info()["workers"])
    assert all(r["worker"].startswith("tcp://127.0.0.1:") for r in ex["chunks"])
    assert bf.provenance.source["format"] == "hdf5"
    assert bf.provenance.source["file_sizes"][0] > 0
    assert len(bf.provenance.source["header_sha256"]) == 64


@pytest.mark.cluster
def test_corrupt_chunk_raises_clear_error_on_the_cluster(
    rng: np.random.Generator, tmp_path, cluster_client
) -> None:
    data = probe_data(rng, scan=(4, 5))
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "data",
            data=data.reshape(20, *data.shape[2:]),
            chunks=(1, *data.shape[2:]),
            **hdf5plugin.Bitshuffle(cname="lz4"),
        )
    with h5py.File(path, "r") as f:
        info = f["data"].id.get_chunk_info(13)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + 12)
        fh.write(b"\xff" * 40)
    ds = qf.open(path, dataset_path="/data", scan_shape=(4, 5), chunk_rows=1)
    with pytest.raises(CorruptChunkError, match=r"bad\.h5"):
        qf.compute(qf.virtual_bf(ds, radius=3, center=(8, 14)), client=cluster_client)
    # rows without the corrupt frame still compute
    (ok,) = qf.compute(
        qf.virtual_bf(ds.crop_scan((0, 2, 0, 5)), radius=3, center=(8, 14)), client=cluster_client
    )
    assert ok.shape == (2, 5)


def test_bad_inputs_raise_project_errors(rng: np.random.Generator, tmp_path) -> None:
    with pytest.raises(SourceNotFoundError, match=r"nope\.h5"):
        qf.open(tmp_path / "nope.h5", dataset_path="/data")
    data = probe_data(rng, scan=(3, 4))
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["frames"] = data.reshape(12, *data.shape[2:])
    with pytest.raises(DatasetPathError, match="/frames"):
        qf.open(tmp_path / "d.h5", dataset_path="/data")
    with pytest.raises(ScanShapeError, match="12"):
        qf.open(tmp_path / "d.h5", dataset_path="/frames", scan_shape=(5, 5))
    with pytest.raises(ShapeError):
        qf.open(np.zeros((3, 4, 5)))
    with pytest.raises(ScanShapeError, match="square"):
        qf.open(tmp_path / "d.h5", dataset_path="/frames")


def test_square_guess_is_recorded(rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(4, 4))
    ds = qf.open(data.reshape(16, *data.shape[2:]), scan_shape="square")
    (bf,) = qf.compute(qf.virtual_bf(ds, radius=3, center=(8, 14)), client="synchronous")
    assert any("assumed square" in n for n in bf.provenance.notes)


def test_annotations_are_validated_on_the_client() -> None:
    assert validate_annotations({"qf_runtime": "cpu", "resources": {}})["resources"] == {}
    with pytest.raises(AnnotationError, match="resources"):
        validate_annotations({"resources": None})
    with pytest.raises(AnnotationError, match="positive"):
        validate_annotations({"resources": {"cuda": 0}})
    with pytest.raises(AnnotationError, match="warp"):
        validate_annotations({"qf_runtime": "warp"})
    with pytest.raises(AnnotationError, match="unknown annotation"):
        validate_annotations({"colour": "red"})


def test_lowered_graph_carries_annotations_per_layer(rng: np.random.Generator) -> None:
    ds = qf.open(probe_data(rng), chunk_rows=2)
    lp = lower_pass(
        ds, {"a": np.ones(ds.detector_shape)}, want_sum=True, want_max=False, runtime="cpu"
    )
    layers = lp.graph.layers
    pass_layer = next(v for k, v in layers.items() if k.startswith("qf-pass-"))
    assert pass_layer.annotations["qf_runtime"] == "cpu"
    assert pass_layer.annotations["qf_representation"] == "dense"
    assert len(lp.chunk_keys) == len(ds.chunks) == 4


def test_scan_blocks_are_merged_by_the_client_and_patterns_by_a_tree(
    rng: np.random.Generator,
) -> None:
    from quantem_flow.graphs.lowering import PATTERN_FAN_IN

    ds = qf.open(probe_data(rng, scan=(20, 3)), chunk_rows=1)  # 20 chunks
    weights = {"a": np.ones(ds.detector_shape)}

    def combines(lp: LoweredPass) -> list[object]:
        layer = [v for k, v in lp.graph.layers.items() if k.startswith("qf-combine-")]
        return [] if not layer else list(layer[0])

    blocks = lower_pass(ds, weights, want_sum=False, want_max=False, runtime="cpu")
    # no combine task after the last chunk: the client merges the 20 partials it fetches
    assert len(blocks.chunk_keys) == 20 and blocks.output_key is None
    assert combines(blocks) == []
    pattern = lower_pass(ds, weights, want_sum=True, want_max=False, runtime="cpu")
    # 20 partials of a detector-sized sum: merges of 8, 8 and 4, then one of those 3
    assert len(combines(pattern)) == 3 + 1 and PATTERN_FAN_IN == 8
    assert pattern.output_key in combines(pattern)
    narrow = lower_pass(ds, weights, want_sum=False, want_max=False, runtime="cpu", fan_in=4)
    assert len(combines(narrow)) == 5 + 2 + 1


@pytest.mark.parametrize("client", ["synchronous", "threads", "cluster"])
def test_blocks_merged_by_the_client_equal_a_combine_tree(
    rng: np.random.Generator, client: str, cluster_client: Any
) -> None:
    from quantem_flow.graphs.runner import Runner

    ds = qf.open(probe_data(rng, scan=(9, 5)), chunk_rows=2)  # 5 chunks, the last short
    weights = {"a": rng.random(ds.detector_shape), "b": rng.random(ds.detector_shape)}
    here = lower_pass(ds, weights, want_sum=False, want_max=False, runtime="cpu")
    tree = lower_pass(ds, weights, want_sum=False, want_max=False, runtime="cpu", fan_in=2)
    assert here.output_key is None and tree.output_key is not None
    runner = Runner(cluster_client if client == "cluster" else client)
    merged, combined = runner.run([here, tree], progress=client == "threads")
    assert [b[0] for b in merged.blocks] == [b[0] for b in combined.blocks] == list(ds.chunks)
    for (_, a), (_, b) in zip(merged.blocks, combined.blocks, strict=True):
        np.testing.assert_array_equal(a, b)
    assert [r["chunk"] for r in merged.records] == list(range(len(ds.chunks)))


def test_explicit_unavailable_runtime_is_an_error_naming_what_is_available(
    rng: np.random.Generator,
) -> None:
    ds = qf.open(probe_data(rng))
    with pytest.raises(RuntimeUnavailableError, match="cpu"):
        qf.compute(
            qf.virtual_bf(ds, radius=3, center=(8, 14)), backend="cuda", client="synchronous"
        )
    (bf,) = qf.compute(qf.virtual_bf(ds, radius=3, center=(8, 14)), client="synchronous")
    assert bf.provenance.execution["backend"]["requested"] == "auto"
    assert bf.provenance.execution["backend"]["chosen"] == "cpu"


def _gather_op(idx: np.ndarray) -> object:
    from quantem_flow.operators.base import ChunkOperator, ChunkPlan
    from quantem_flow.results import ScanImage

    class Gather(ChunkOperator):
        name = "gather_test"

        def parameters(self) -> dict[str, object]:
            return {}

        def plan(self, ctx):  # type: ignore[no-untyped-def]
            def finalize(out):  # type: ignore[no-untyped-def]
                rows = np.searchsorted(out.gather_indices, idx)
                return ScanImage(
                    data=np.asarray(out.gathered[rows[1]], dtype=np.float64),
                    units="counts",
                    axes=ctx.dataset.calibration.scan_axes(ctx.dataset.scan_shape),
                    provenance=qf.Provenance(operator="gather_test"),
                )

            return ChunkPlan(
                weights={},
                want_sum=False,
                want_max=False,
                parameters={},
                finalize=finalize,
                gather=idx,
            )

    return Gather()


@pytest.mark.parametrize("where", ["synchronous", "cluster", "cluster-disk"])
def test_gathered_pixels_reach_the_operator(
    rng: np.random.Generator, where: str, request: pytest.FixtureRequest
) -> None:
    from quantem_flow.operators.base import LazyResult

    data = probe_data(rng, scan=(7, 5))
    ds = qf.open(data, chunk_rows=2)
    idx = np.array([40, 17, 3, 500])
    client: object = "synchronous"
    if where != "synchronous":
        client = request.getfixturevalue("cluster_client")
    limit = 0.0 if where == "cluster-disk" else 1024.0
    with qf.config.set(gather_memory_mib=limit):
        (img,) = qf.compute(LazyResult(_gather_op(idx), dataset=ds), client=client)
    np.testing.assert_array_equal(img.data, data.reshape(7, 5, -1)[:, :, 17])
