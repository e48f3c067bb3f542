"""Mapped reads of streamed pieces (issue 24, item 1).

A streamed pass may view a piece of contiguous frames in place through a map
of the file and drop its pages afterwards, or ``pread`` it into a reused
buffer; ``read_method="auto"`` measures both on the file.  Whichever runs,
results and content digests are the same bit for bit, the chunk record says
which ran and why, the process keeps no mapped page once a piece is done, and
a file truncated under a map gives the project's error, not SIGBUS.
"""

from __future__ import annotations

import math
import os
import pickle
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow import config
from quantem_flow.errors import CorruptChunkError, ParameterError
from quantem_flow.io.mapped import MappedFile, mapped_file, supported
from quantem_flow.io.read_method import ReadChoice, ReadTrial, choose_read_method, forget_probes
from tests.io.writers import write_raw

pytestmark = pytest.mark.skipif(
    not supported(), reason="this platform has no madvise(MADV_DONTNEED) for maps"
)


@pytest.fixture(autouse=True)
def _alternating_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trials read piece by piece one way then the other (these chunks last less than a turn)."""
    import itertools

    import quantem_flow.io.read_method as read_method

    ways = itertools.cycle(("pread", "mmap"))
    monkeypatch.setattr(read_method.ReadTrial, "method_now", staticmethod(lambda: next(ways)))
    monkeypatch.setattr(read_method, "MIN_PIECES_EACH", 1)


DET = (16, 12)
SCAN = (9, 13)
FRAME = DET[0] * DET[1] * 2
PIECE_MIB = 5 * FRAME / (1 << 20)  # pieces of 4 frames of one row


def _frames(rng: np.random.Generator) -> np.ndarray:
    rr, cc = np.mgrid[: DET[0], : DET[1]]
    lam = np.where(np.hypot(rr - 7.3, cc - 5.6) < 4, 900.0, 3.0)
    return rng.poisson(lam, size=(*SCAN, *DET)).astype(np.uint16)


def _ops(ds: qf.Dataset4D) -> list[Any]:
    kr, kc = ds.shape[2:]
    c = (kr * 0.456, kc * 0.467)
    return [
        qf.virtual_bf(ds, radius=kr / 4, center=c),
        qf.virtual_adf(ds, inner=kr * 0.31, outer=math.inf, center=c),
        qf.center_of_mass(ds, center=c),
        qf.sum_diffraction(ds),
        qf.max_diffraction(ds),
    ]


def _run(ds: qf.Dataset4D, method: str, piece_mib: float = PIECE_MIB) -> list[Any]:
    forget_probes()
    with config.set(stream_piece_mib=piece_mib, read_method=method):
        return qf.compute(*_ops(ds), client="synchronous", progress=False)


def _records(result: Any) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = result.provenance.to_dict()["execution"]["chunks"]
    return chunks


def _digest(result: Any) -> str:
    digest: str = result.provenance.to_dict()["execution"]["content_digest"]["digest"]
    return digest


def _same(a: list[Any], b: list[Any]) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert _digest(a[0]) == _digest(b[0])


def _write_sources(data: np.ndarray, tmp_path: Path) -> dict[str, qf.Dataset4D]:
    import h5py

    np.save(tmp_path / "d.npy", data)
    write_raw(tmp_path / "d.raw", data.reshape(-1, *DET), dtype="<u2")
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("data", data=data.reshape(-1, *DET))  # contiguous, unfiltered
    frames = np.concatenate([data.reshape(-1, *DET)[:5] * 0 + 7, data.reshape(-1, *DET)])
    np.save(tmp_path / "offset.npy", frames)
    return {
        "npy": qf.open(tmp_path / "d.npy", chunk_rows=3),
        "raw": qf.open(
            tmp_path / "d.raw",
            format="raw",
            dtype="<u2",
            frame_shape=DET,
            scan_shape=SCAN,
            chunk_rows=4,
        ),
        "hdf5": qf.open(tmp_path / "d.h5", scan_shape=SCAN, chunk_rows=3),
        "npy-frame-offset": qf.open(
            tmp_path / "offset.npy", scan_shape=SCAN, frame_offset=5, chunk_rows=2
        ),
    }


@pytest.mark.parametrize("fmt", ["npy", "raw", "hdf5", "npy-frame-offset"])
def test_mapped_pieces_equal_pread_pieces_bit_for_bit(
    rng: np.random.Generator, tmp_path: Path, fmt: str
) -> None:
    data = _frames(rng)
    ds = _write_sources(data, tmp_path)[fmt]
    pread = _run(ds, "pread")
    mapped = _run(ds, "mmap")
    auto = _run(ds, "auto")
    _same(pread, mapped)
    _same(pread, auto)
    np.testing.assert_array_equal(np.asarray(mapped[3]), data.sum(axis=(0, 1)))
    for result, method in ((pread, "pread"), (mapped, "mmap")):
        for r in _records(result[0]):
            assert r["made"] == "dense read, streamed"
            assert r["streamed"]["read"]["method"] == method
            assert r["streamed"]["read"]["why"] == f"read_method={method!r} was set"
    mapped_records = _records(mapped[0])
    assert all(r["streamed"]["buffer_bytes"] == 0 for r in mapped_records)
    assert "madvise" in mapped_records[0]["streamed"]["how"]
    reads = [r["streamed"]["read"] for r in _records(auto[0])]
    trials = [r for r in reads if r["method"] == "pread+mmap"]
    decided = [r for r in reads if "2 trials on this file" in r["why"]]
    assert len(trials) == 2  # the first two chunks to run tried both ways
    assert sorted("trial 1 of 2" in r["why"] for r in trials) == [False, True]
    assert sorted("now reads by" in r["why"] for r in trials) == [False, True]
    for r in trials:
        counts = re.search(r"\((\d+) and (\d+) pieces\)", r["why"])
        assert counts is not None and min(int(v) for v in counts.groups()) >= 1, r["why"]
        assert set(r["measured_GBps"]) == {"mmap", "pread"}
        assert all(v > 0 for v in r["measured_GBps"].values())
    # then every chunk has the decision (a chunk too short to try, run first, reads by pread)
    rest = [r for r in reads if r not in trials and r not in decided]
    assert all(r["method"] == "pread" and "too few pieces" in r["why"] for r in rest), rest
    assert len({r["method"] for r in decided}) <= 1
    assert {r["method"] for r in decided} <= {"mmap", "pread"}


def test_views_that_are_not_stored_bytes_read_with_pread_and_say_why(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    data = _frames(rng)
    np.save(tmp_path / "swapped.npy", data.astype(">u2"))
    head = 6
    write_raw(tmp_path / "records.raw", data.reshape(-1, *DET), dtype="<u2", header_bytes=head)
    plain = qf.open(tmp_path / "swapped.npy", chunk_rows=3)
    cases = {
        "another byte order": plain,
        "records with headers": qf.open(
            tmp_path / "records.raw",
            format="raw",
            dtype="<u2",
            frame_shape=DET,
            scan_shape=SCAN,
            frame_header_bytes=head,
            chunk_rows=3,
        ),
        "a cropped view": qf.open(tmp_path / "swapped.npy", chunk_rows=3).crop_detector(
            (1, 15, 0, 12)
        ),
    }
    reference = _run(qf.open(data, chunk_rows=3), "pread")
    for name, ds in cases.items():
        got = _run(ds, "mmap")
        for r in _records(got[0]):
            assert r["streamed"]["read"]["method"] == "pread", name
            assert "not one run of stored bytes" in r["streamed"]["read"]["why"], name
        if name != "a cropped view":
            _same(reference, got)


def _mapping_rss_kib(path: Path) -> int:
    """Resident KiB of this process's maps of ``path`` (from /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="no /proc/self/smaps here")
def test_a_mapped_piece_leaves_no_page_in_the_process(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    piece = 1 << 20
    np.arange(16 * piece // 8, dtype=np.uint64).tofile(path)
    kept = MappedFile(path)
    dropped = MappedFile(path)
    total = 0
    for i in range(16):
        total += int(kept.piece(i * piece, piece).view(np.uint64).sum())
        view = dropped.piece(i * piece, piece)
        assert not view.flags.writeable
        assert int(view.view(np.uint64).sum()) == int(
            kept.piece(i * piece, piece).view(np.uint64).sum()
        )
        del view
        dropped.drop(i * piece, piece)
    n = 16 * piece // 8
    assert total == n * (n - 1) // 2
    # the map that dropped its pieces holds none of the file; the one that kept them holds it all
    kept_kib = _mapping_rss_kib(path)
    assert kept_kib >= 16 * 1024 * 0.9
    del kept
    import gc

    gc.collect()
    assert _mapping_rss_kib(path) <= 8  # at most a page or two


def test_a_file_truncated_under_a_map_gives_the_projects_error(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    data = _frames(rng)
    np.save(tmp_path / "d.npy", data)
    ds = qf.open(tmp_path / "d.npy", chunk_rows=3)
    mapped = mapped_file(tmp_path / "d.npy")
    size = os.path.getsize(tmp_path / "d.npy")
    os.truncate(tmp_path / "d.npy", size - 3 * FRAME)
    with pytest.raises(CorruptChunkError, match="truncated") as info:
        mapped.piece(size - 4 * FRAME, 2 * FRAME, what="frames at the end")
    assert "frames at the end" in str(info.value)
    assert pickle.loads(pickle.dumps(info.value)).args == info.value.args
    with pytest.raises(CorruptChunkError, match="truncated"):
        _run(ds, "mmap")


def test_read_method_setting_is_checked_and_the_decision_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import quantem_flow.io.read_method as read_method

    monkeypatch.setattr(read_method, "MIN_PIECES_EACH", 2)
    with pytest.raises(ParameterError, match="read_method must be one of") as info:
        choose_read_method("fast", None, 0, 1 << 20)
    assert "'fast'" in str(info.value)
    assert pickle.loads(pickle.dumps(info.value)).args == info.value.args
    ds = qf.open(np.zeros((4, 4, 8, 8), dtype=np.uint16))
    with config.set(read_method="fast"), pytest.raises(ParameterError, match="'fast'"):
        qf.compute(qf.sum_diffraction(ds), client="synchronous", progress=False)
    path = tmp_path / "p.bin"
    size = 40 << 20
    np.zeros(size, dtype=np.uint8).tofile(path)
    piece = 1 << 20

    def trial(pread_s: float, mmap_s: float, pieces: int = 3) -> ReadChoice:
        t = choose_read_method("auto", path, size, piece)
        assert isinstance(t, ReadTrial)
        for i in range(pieces):  # the lower quartile decides: one slow piece each way
            t.add("pread", pread_s * (3 if i == 0 else 1), piece)
            t.add("mmap", mmap_s * (3 if i == 1 else 1), piece)
        return t.finish()

    forget_probes()
    first = trial(1e-3, 0.5e-3)
    assert first.method == "pread+mmap" and "trial 1 of 2" in first.why
    assert first.measured_GBps == pytest.approx({"pread": 1.049, "mmap": 2.097}, abs=0.01)
    # a trial with too few pieces one way does not count
    short_trial = trial(1e-3, 0.5e-3, pieces=1)
    assert "too short to count" in short_trial.why and not short_trial.measured_GBps
    second = trial(1e-3, 0.5e-3)
    assert "now reads by mmap" in second.why
    decided = choose_read_method("auto", path, size, piece)
    assert isinstance(decided, ReadChoice) and decided.method == "mmap"
    assert "2 trials on this file" in decided.why
    assert choose_read_method("auto", path, size, piece) is decided  # kept
    # every trial must find the map faster by the margin
    forget_probes()
    trial(1e-3, 0.5e-3)
    assert "now reads by pread" in trial(1e-3, 0.9e-3).why
    assert choose_read_method("auto", path, size, piece).method == "pread"
    forget_probes()
    assert isinstance(choose_read_method("auto", path, size, piece), ReadTrial)
    few = choose_read_method("auto", path, 4 * piece, piece)
    assert isinstance(few, ReadChoice) and few.method == "pread" and "too few pieces" in few.why
    # while a kernel compiles the trial waits: pread now, tried on a later chunk
    waiting = choose_read_method("auto", path, size, piece, defer=True)
    assert isinstance(waiting, ReadChoice) and waiting.method == "pread"
    assert "compiling" in waiting.why and not waiting.measured_GBps
    assert isinstance(choose_read_method("auto", path, size, piece), ReadTrial)


def test_trial_turns_come_from_one_clock() -> None:
    from quantem_flow.io.read_method import TURN_S, _turn_now

    seen = set()
    deadline = time.perf_counter() + 20 * TURN_S
    while time.perf_counter() < deadline and len(seen) < 2:
        seen.add(_turn_now())
    assert seen == {"pread", "mmap"}
