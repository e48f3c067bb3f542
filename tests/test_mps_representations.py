"""Issue 16: the mps (MLX) runtime runs every representation on payloads resident in MLX.

The per-triple conformance (every declared (operation, representation,
dtype) against the CPU reference) runs in tests/test_runtime_conformance.py,
driven by the mps declaration; this module checks what the suite does not:
residency of paired/packed/encoded payloads as MLX arrays across passes,
the paths recorded in provenance (host decode for encoded, the plain-MLX
unpacking where Metal does not answer), edge layouts, and placement of a
persisted paired dataset on the MLX worker of a mixed cluster.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import ParameterError, RuntimeUnavailableError
from quantem_flow.representations import chunk_of, get_representation
from quantem_flow.runtimes import get_runtime
from quantem_flow.runtimes.cpu import CpuRuntime
from quantem_flow.testing.runtime_conformance import check_frame_pass
from tests.conftest import probe_data

mx = pytest.importorskip("mlx.core", reason="MLX is not installed")
pytestmark = pytest.mark.mps
CENTER = (8.6, 14.2)
REPS = ("paired", "packed", "encoded")
VARIANT = {"paired": "scatter", "packed": "unpack", "encoded": "host decode"}


def _mps() -> Any:
    try:
        return get_runtime("mps")
    except RuntimeUnavailableError as exc:  # pragma: no cover - MLX installed but broken
        pytest.skip(f"mps unavailable: {exc}")


def _host_chunk(representation: str, block: np.ndarray, **options: Any) -> Any:
    payload = get_representation(representation).from_dense(block, **options)
    return chunk_of(representation, payload)


def _frames(rng: np.random.Generator, n: int, k: int, dtype: Any = np.uint16) -> np.ndarray:
    out = rng.poisson(0.4, size=(n, k)).astype(dtype)
    out[:, : k // 7] *= 40  # a bright region: wider packed blocks
    return out


@pytest.mark.parametrize("representation", REPS)
def test_put_keeps_the_payload_resident_in_mlx_across_passes(
    representation: str, rng: np.random.Generator
) -> None:
    rt = _mps()
    det = (11, 17)
    frames = _frames(rng, 23, det[0] * det[1])
    host = _host_chunk(representation, frames.reshape(1, 23, *det))
    handle = rt.put(host)
    assert (handle.residency, handle.runtime) == ("mps", "mps")
    payload = handle.payload
    arrays = dict(payload.arrays)
    assert arrays and all(isinstance(a, mx.array) for a in arrays.values()), arrays
    assert handle.nbytes == host.payload.nbytes == payload.nbytes  # resident bytes reported
    assert payload.mlx_nbytes <= payload.nbytes
    weights = np.stack([np.ones(frames.shape[1]), np.linspace(-1, 2, frames.shape[1])])
    ref = CpuRuntime().frame_pass(frames, weights, want_sum=True, want_max=True)
    for _ in range(2):  # the same MLX arrays serve every pass: nothing re-uploaded
        got = rt.run_frame_pass(handle, weights, want_sum=True, want_max=True)
        check_frame_pass(
            got, ref, frames, weights, want_sum=True, want_max=True, what=representation
        )
        assert all(payload.arrays[k] is a for k, a in arrays.items())
    np.testing.assert_array_equal(
        rt.run_gather(handle, np.array([0, 5, 186])), frames[:, [0, 5, 186]]
    )
    rt.release(handle)
    assert payload.freed and not payload.arrays
    with pytest.raises(ParameterError, match="released"):
        rt.run_frame_pass(handle, weights, want_sum=False, want_max=False)


def test_packed_unpacks_a_zero_width_last_block_at_the_pad_word(rng: np.random.Generator) -> None:
    """A width-0 block at the end starts at the padding word: nothing is read past it."""
    rt = _mps()
    det = (8, 40)  # 320 values: blocks of 128, 128, 64
    frames = _frames(rng, 5, 320)
    frames[-1, 256:] = 0  # the last block of the last frame is all zeros: width 0
    frames[2] = 0  # an all-zero frame in the middle
    host = _host_chunk("packed", frames.reshape(1, 5, *det))
    assert int(host.payload.widths[-1]) == 0
    assert int(host.payload.offsets[-1]) == host.payload.data.size - 1  # at the pad word
    handle = rt.put(host)
    w = rng.standard_normal((3, 320))
    got = rt.run_frame_pass(handle, w, want_sum=True, want_max=True)
    ref = CpuRuntime().frame_pass(frames, w, want_sum=True, want_max=True)
    check_frame_pass(got, ref, frames, w, want_sum=True, want_max=True, what="pad word")
    np.testing.assert_array_equal(rt.run_gather(handle, np.arange(320)), frames)


def test_paired_nonfinite_weight_matches_the_cpu_paired_kernel(rng: np.random.Generator) -> None:
    """A non-finite weight at a pixel a frame misses gives NaN there, as 0 * inf does."""
    from quantem_flow.runtimes.cpu.paired_kernels import frame_pass_paired

    rt = _mps()
    det = (6, 9)
    frames = _frames(rng, 9, 54)
    frames[:, 3] = 0
    frames[4, 3] = 2  # only frame 4 hits pixel 3
    host = _host_chunk("paired", frames.reshape(1, 9, *det))
    w = np.ones((2, 54))
    w[0, 3] = np.inf
    got = rt.run_frame_pass(rt.put(host), w, want_sum=False, want_max=False)
    ref = frame_pass_paired(host.payload, w, want_sum=False, want_max=False)
    np.testing.assert_array_equal(np.isnan(got.per_frame), np.isnan(ref.per_frame))
    assert np.isnan(got.per_frame[:, 0]).sum() == 8 and got.per_frame[4, 0] == np.inf
    np.testing.assert_array_equal(got.per_frame[:, 1], ref.per_frame[:, 1])


def test_paired_events_in_many_blocks_join_up(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tiny event blocks: the scatter-adds of consecutive blocks add up exactly."""
    from quantem_flow.runtimes.mps import payloads

    monkeypatch.setattr(payloads, "EVENT_BLOCK_BYTES", 8 * 3 * 7)  # 7 events a block
    monkeypatch.setattr(payloads, "GROUP_BYTES", 3 * 64)
    rt = _mps()
    frames = _frames(rng, 31, 64, np.uint8)
    w = (rng.random((3, 64)) < 0.5).astype(np.float64)
    ref = CpuRuntime().frame_pass(frames, w, want_sum=True, want_max=True)
    for rep in REPS:
        handle = rt.put(_host_chunk(rep, frames.reshape(1, 31, 8, 8)))
        got = rt.run_frame_pass(handle, w, want_sum=True, want_max=True)
        check_frame_pass(got, ref, frames, w, want_sum=True, want_max=True, what=rep)
        np.testing.assert_array_equal(rt.run_gather(handle, np.arange(64)), frames)


def test_paths_are_recorded_and_encoded_is_decoded_on_the_host(rng: np.random.Generator) -> None:
    _mps()
    data = probe_data(rng, scan=(6, 5))
    dense = qf.open(data, chunk_rows=2)
    for rep in REPS:
        ds = dense.to_representation(rep)
        (bf_mps, mean_mps) = qf.compute(
            qf.virtual_bf(ds, radius=4.5, center=CENTER),
            qf.mean_diffraction(ds),
            backend="mps",
            client="synchronous",
        )
        (bf_cpu, mean_cpu) = qf.compute(
            qf.virtual_bf(ds, radius=4.5, center=CENTER),
            qf.mean_diffraction(ds),
            backend="cpu",
            client="synchronous",
        )
        np.testing.assert_array_equal(bf_mps.data, bf_cpu.data)
        np.testing.assert_array_equal(mean_mps.data, mean_cpu.data)
        ex = bf_mps.provenance.execution
        assert ex["representation"] == rep and len(ex["chunks"]) == 3
        for rec in ex["chunks"]:
            assert (rec["runtime"], rec["residency"]) == ("mps", "mps")
        (detail,) = ex["runtime_details"]
        assert detail["runtime"] == "mps"
        path = detail["payload_paths"][rep]
        assert "resident" in path
        variants = [r["frame_pass_variant"] for r in ex["chunks"]]
        assert all(v["variant"] == f"mps {rep} {VARIANT[rep]}" for v in variants), variants
        if rep == "encoded":
            assert "decoded on the HOST" in path and "MLX has no" in path
            assert "host" in detail["host_decode"]["encoded"]
            # each chunk's record says its pieces were decoded on the host, and by which codec
            assert all(v["decode"] == "host" and v["codec"] == "bitshuffle-lz4" for v in variants)
        if rep == "packed":
            assert "plain MLX integer ops" in path  # no Metal here: recorded as such
            assert "metal_kernel" not in detail
            assert all(v["unpack"].startswith("plain MLX") for v in variants)


def test_detector_views_run_on_resident_payloads(rng: np.random.Generator) -> None:
    """Binned and cropped views (encoded: post-decode ops) give the CPU's results on mps."""
    _mps()
    data = probe_data(rng, scan=(5, 4))
    for rep in REPS:
        ds = qf.open(data, chunk_rows=2).to_representation(rep)
        view = ds.crop_detector((1, 19, 2, 25)).bin_detector(2)
        lazy = [qf.sum_diffraction(view), qf.max_diffraction(view), qf.virtual_mask(view, MASK)]
        on_mps = qf.compute(*lazy, backend="mps", client="synchronous")
        on_cpu = qf.compute(*lazy, backend="cpu", client="synchronous")
        for a, b in zip(on_mps, on_cpu, strict=True):
            assert a.data.dtype == b.data.dtype, (rep, a.name)
            np.testing.assert_array_equal(a.data, b.data, err_msg=f"{rep} {a.name}")


MASK = np.indices((9, 12)).sum(axis=0) % 3 == 0


def _chunk_bytes_moved(client: Any, keys: set[str]) -> int:
    def moved(dask_worker: Any) -> int:
        return int(
            sum(
                nbytes
                for entry in dask_worker.transfer_incoming_log
                for key, nbytes in entry.get("keys", {}).items()
                if str(key) in keys
            )
        )

    return sum(client.run(moved).values())


@pytest.mark.cluster
def test_persisted_payloads_stay_on_the_mlx_worker_of_a_mixed_cluster(
    rng: np.random.Generator,
) -> None:
    """Paired, packed and encoded chunks persisted for mps: resident in MLX, 0 chunk bytes moved."""
    from distributed import Client

    from quantem_flow.graphs.cluster import start_local_cluster

    cluster = start_local_cluster(workers=[{"runtimes": ["cpu"]}, {"runtimes": ["mps"]}])
    client = Client(cluster, set_as_default=False)
    try:
        workers = client.scheduler_info()["workers"]
        (mlx_worker,) = [a for a, w in workers.items() if "qf-runtime-mps" in w["resources"]]
        data = probe_data(rng, scan=(12, 5))
        ref = qf.compute(
            qf.virtual_bf(qf.open(data), radius=4.5, center=CENTER),
            qf.virtual_adf(qf.open(data), inner=7.0, center=CENTER),
            qf.center_of_mass(qf.open(data), center=CENTER),
            client="synchronous",
            backend="cpu",
        )

        def held(dask_worker: Any) -> dict[str, int]:
            return dict(dask_worker.data.resident_bytes())

        for rep in REPS:
            ds = qf.open(data, chunk_rows=2).to_representation(rep)
            p = ds.persist(client=client, backend="mps")
            try:
                holders = p.resident.holders()
                assert {w for ws in holders.values() for w in ws} == {mlx_worker}, rep
                keys = {str(k) for k in p.resident.keys}
                assert len(keys) == 6
                on_mlx = client.run(held)[mlx_worker]
                assert on_mlx.get(f"mps/{rep}", 0) > 0, on_mlx  # MLX payloads, not host data
                assert not any(k.endswith(f"/{rep}") and k != f"mps/{rep}" for k in on_mlx)
                chunk_bytes_before = _chunk_bytes_moved(client, keys)
                for _ in range(2):
                    bf, adf, com = qf.compute(
                        qf.virtual_bf(p, radius=4.5, center=CENTER),
                        qf.virtual_adf(p, inner=7.0, center=CENTER),
                        qf.center_of_mass(p, center=CENTER),
                        client=client,
                    )
                    recs = bf.provenance.execution["chunks"]
                    assert {r["worker"] for r in recs} == {mlx_worker}
                    assert {(r["runtime"], r["residency"]) for r in recs} == {("mps", "mps")}
                    assert all(r["resident"] and r["bytes_read"] == 0 for r in recs)
                assert _chunk_bytes_moved(client, keys) - chunk_bytes_before == 0, rep
                np.testing.assert_array_equal(bf.data, ref[0].data)
                np.testing.assert_array_equal(adf.data, ref[1].data)
                np.testing.assert_allclose(com.data, ref[2].data, rtol=1e-12)
            finally:
                p.release()
    finally:
        client.close()
        cluster.close()
