"""Provenance names its data exactly (issue 12, item 8).

A content digest of the bytes each pass read (xxh3_128, docs/data-integrity.md),
the same on every runtime, worker count, client and chunking (dense), and
different when one byte of pixel data differs; the paths as given and
resolved; Python and OS versions; JIT compile time apart from kernel time.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numba
import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.dataset import Dataset4D
from quantem_flow.graphs.digest import payload_digests
from quantem_flow.provenance import Provenance, combine_digests, environment
from quantem_flow.runtimes import get_runtime
from quantem_flow.runtimes.cpu import CpuRuntime
from tests.conftest import probe_data
from tests.io import writers

CENTER = (8.6, 14.2)


def _digest(ds: Dataset4D, **options: Any) -> dict[str, Any]:
    options.setdefault("client", "synchronous")
    (img,) = qf.compute(qf.virtual_bf(ds, radius=3, center=CENTER), **options)
    found: dict[str, Any] = img.provenance.source["content_digest"]
    assert found == img.provenance.execution["content_digest"]
    return found


def _npy(tmp_path: Path, rng: np.random.Generator, name: str = "d.npy") -> tuple[Path, Any]:
    data = probe_data(rng, scan=(9, 7))
    np.save(tmp_path / name, data)
    return tmp_path / name, data


def test_dense_digest_is_the_same_for_every_run_chunking_and_residency(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    path, data = _npy(tmp_path, rng)
    first = _digest(qf.open(path, chunk_rows=2))
    assert first["algorithm"] == "xxh3_128" and len(first["digest"]) == 32
    assert first["unit"] == "scan row" and first["chunking_independent"] is True
    for rows in (1, 2, 4, 9):  # chunkings, and a second run of the first one
        assert _digest(qf.open(path, chunk_rows=rows))["digest"] == first["digest"]
    # an in-memory array of the same values reads the same bytes
    assert _digest(qf.open(data, chunk_rows=3))["digest"] == first["digest"]
    # persisted: hashed once when loaded, reused by every pass over the resident chunks
    p = qf.open(path, chunk_rows=2).persist(client="synchronous")
    try:
        for _ in range(2):
            (img,) = qf.compute(qf.virtual_bf(p, radius=3, center=CENTER))
            ex = img.provenance.execution
            assert ex["bytes_read"] == 0
            assert ex["content_digest"]["digest"] == first["digest"]
            assert all(r["content_digest"] for r in ex["chunks"])
            assert all(r["hash_s"] == 0.0 for r in ex["chunks"])  # nothing hashed again
    finally:
        p.release()


def test_chunk_records_carry_their_digest_and_the_dataset_digest_combines_them(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    path, data = _npy(tmp_path, rng)
    ds = qf.open(path, chunk_rows=4)
    (img,) = qf.compute(qf.virtual_bf(ds, radius=3, center=CENTER), client="synchronous")
    ex = img.provenance.execution
    assert [r["rows"] for r in ex["chunks"]] == [[0, 4], [4, 8], [8, 9]]
    assert all("digest_units" not in r for r in ex["chunks"])  # per-row units stay out
    assert all(r["hash_s"] >= 0.0 for r in ex["chunks"])
    units = [u for r0, r1 in ds.chunks for u in payload_digests("dense", data[r0:r1], (r0, r1))]
    expected = combine_digests(units, header=ex["content_digest"]["header"])
    assert ex["content_digest"]["digest"] == expected
    assert combine_digests(units[::-1], header="h") == combine_digests(units, header="h")
    chunk0 = payload_digests("dense", data[0:4], (0, 4))
    assert ex["chunks"][0]["content_digest"] == combine_digests(
        chunk0, header=ex["content_digest"]["header"]
    )
    # the result as saved and loaded keeps it
    qf.save_results({"bf": img}, tmp_path / "r.h5")
    loaded = qf.load_results(tmp_path / "r.h5")["bf"]
    assert loaded.provenance.source["content_digest"]["digest"] == expected


def test_one_changed_pixel_byte_changes_the_digest(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    path, data = _npy(tmp_path, rng)
    before = _digest(qf.open(path, chunk_rows=2))["digest"]
    raw = bytearray(path.read_bytes())
    offset = len(raw) - data.nbytes + int(rng.integers(0, data.nbytes))  # a pixel byte
    raw[offset] ^= 0x01
    changed = tmp_path / "changed.npy"
    changed.write_bytes(bytes(raw))
    assert np.count_nonzero(np.load(changed) != data) == 1
    assert _digest(qf.open(changed, chunk_rows=2))["digest"] != before
    assert _digest(qf.open(path, chunk_rows=2))["digest"] == before


@pytest.mark.parametrize("representation", ["encoded", "paired", "packed"])
def test_other_representations_digest_per_chunk(
    rng: np.random.Generator, representation: str
) -> None:
    data = probe_data(rng, scan=(6, 5))
    ds = qf.open(data, chunk_rows=2).to_representation(representation)
    first = _digest(ds)
    assert first["digest"] and first["unit"] == "chunk"
    assert first["chunking_independent"] is False and first["chunk_rows"] == 2
    assert _digest(ds)["digest"] == first["digest"]
    other = data.copy()
    other[3, 2, 5, 5] += 1
    changed = qf.open(other, chunk_rows=2).to_representation(representation)
    assert _digest(changed)["digest"] != first["digest"]


def test_dectris_compressed_bytes_as_read(tmp_path: Path, rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(7, 9))
    frames = data.reshape(-1, *data.shape[2:])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    master = writers.write_dectris(tmp_path / "a", "acq", frames, frames_per_file=10)
    ds = qf.open(master, scan_shape=(7, 9), chunk_rows=2).to_representation("encoded")
    first = _digest(ds)
    assert "compressed" in first["hashed"]
    assert _digest(ds)["digest"] == first["digest"]
    frames2 = frames.copy()
    frames2[40, 3, 3] += 1
    master2 = writers.write_dectris(tmp_path / "b", "acq", frames2, frames_per_file=10)
    ds2 = qf.open(master2, scan_shape=(7, 9), chunk_rows=2).to_representation("encoded")
    assert _digest(ds2)["digest"] != first["digest"]


@pytest.mark.mps
def test_digest_is_the_same_on_cpu_and_mps(tmp_path: Path, rng: np.random.Generator) -> None:
    ok, why = get_runtime("mps").available()
    if not ok:
        pytest.skip(f"mps runtime unavailable: {why}")
    path, _ = _npy(tmp_path, rng)
    ds = qf.open(path, chunk_rows=3)
    cpu = _digest(ds, backend="cpu")
    assert _digest(ds, backend="mps")["digest"] == cpu["digest"]
    p = ds.persist(client="synchronous", backend="mps")
    try:
        (img,) = qf.compute(qf.virtual_bf(p, radius=3, center=CENTER))
        assert img.provenance.execution["content_digest"]["digest"] == cpu["digest"]
    finally:
        p.release()


@pytest.mark.cluster
def test_digest_is_the_same_on_a_cluster_and_in_process(
    tmp_path: Path, rng: np.random.Generator, cluster_client: Any
) -> None:
    path, _ = _npy(tmp_path, rng)
    ds = qf.open(path, chunk_rows=1)
    local = _digest(ds)
    (img,) = qf.compute(qf.virtual_bf(ds, radius=3, center=CENTER), client=cluster_client)
    ex = img.provenance.execution
    # Which worker reads which chunk is the scheduler's choice (under load one worker may
    # read them all); the digest must not depend on it either way.
    assert 1 <= len(ex["workers"]) <= 2
    assert ex["content_digest"]["digest"] == local["digest"]
    p = ds.persist(client=cluster_client)
    try:
        (img,) = qf.compute(qf.virtual_bf(p, radius=3, center=CENTER))
        assert img.provenance.execution["content_digest"]["digest"] == local["digest"]
    finally:
        p.release()


def test_paths_as_given_and_resolved(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = _npy(tmp_path, rng)
    (tmp_path / "links").mkdir()
    os.symlink(path, tmp_path / "links" / "alias.npy")
    monkeypatch.chdir(tmp_path / "links")
    (img,) = qf.compute(
        qf.virtual_bf(qf.open("alias.npy"), radius=3, center=CENTER), client="synchronous"
    )
    source = img.provenance.source
    assert source["paths_given"] == ["alias.npy"]
    assert source["paths_resolved"] == [os.path.realpath(path)]
    (mem,) = qf.compute(
        qf.virtual_bf(qf.open(np.load(path)), radius=3, center=CENTER), client="synchronous"
    )
    assert mem.provenance.source["paths_given"] == []


def test_python_and_os_versions_and_old_documents(rng: np.random.Generator) -> None:
    data = probe_data(rng, scan=(4, 3))
    (img,) = qf.compute(qf.virtual_bf(qf.open(data), radius=3, center=CENTER), client="synchronous")
    env = img.provenance.environment
    assert env == environment()
    assert env["python"].count(".") == 2 and env["os"] and env["machine"]
    assert img.provenance.versions["xxhash"] != "not installed"
    again = Provenance.from_json(img.provenance.to_json())
    assert again.environment == env
    old = json.loads(img.provenance.to_json())
    del old["environment"]
    assert Provenance.from_dict(old).environment == {}  # unknown, never this process's


def _fresh_kernel() -> Any:
    """A Numba function no other test compiled (a new dispatcher, no cache)."""

    @numba.njit(cache=False)
    def fresh(x: np.ndarray) -> float:
        total = 0.0
        for v in x.ravel():
            total += v * 1.5
        return total

    return fresh


def test_compile_timer_counts_this_threads_compilation_only() -> None:
    runtime = get_runtime("cpu")
    fresh = _fresh_kernel()
    x = np.arange(12.0)
    with runtime.compile_timer() as first:
        fresh(x)
    assert first.compilations == 1 and first.seconds > 0
    with runtime.compile_timer() as second:
        fresh(x)
    assert second.compilations == 0 and second.seconds == 0.0
    other = _fresh_kernel()
    with runtime.compile_timer() as mine:
        t = threading.Thread(target=other, args=(x,))
        t.start()
        t.join()
    assert mine.compilations == 0 and mine.seconds == 0.0


def test_first_chunk_compile_time_is_not_kernel_time(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = _fresh_kernel()
    original = CpuRuntime.frame_pass

    def frame_pass(self: Any, frames: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        fresh(np.asarray(frames[:1], dtype=np.float64))  # compiles on the first chunk run
        return original(self, frames, *args, **kwargs)

    monkeypatch.setattr(CpuRuntime, "frame_pass", frame_pass)
    data = probe_data(rng, scan=(6, 5))
    (img,) = qf.compute(
        qf.virtual_bf(qf.open(data, chunk_rows=1), radius=3, center=CENTER),
        client="synchronous",
        backend="cpu",
    )
    ex = img.provenance.execution
    chunks = ex["chunks"]
    compiled = [r for r in chunks if r["compilations"] > 0]
    assert len(compiled) == 1  # the first chunk run compiled, once
    first = compiled[0]
    assert first["compile_s"] > 0
    assert first["kernel_s"] < first["compile_s"] / 4  # compilation is not kernel time
    assert all(r["compile_s"] == 0.0 for r in chunks if r is not first)
    assert ex["compile_s_total"] == pytest.approx(sum(r["compile_s"] for r in chunks))
