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
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow import config
from quantem_flow.errors import CorruptChunkError, ParameterError
from quantem_flow.io.mapped import MappedFile, mapped_file, supported
from quantem_flow.io.read_method import choose_read_method, forget_probes
from tests.io.writers import write_raw

pytestmark = pytest.mark.skipif(
    not supported(), reason="this platform has no madvise(MADV_DONTNEED) for maps"
)


@pytest.fixture(autouse=True)
def _two_probe_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe reads with every CPU; these files are sized for two threads' rounds.

    And every probe counts every round: in a full test run other threads of the test
    process (an embedded cluster's) may work during these files' rounds of microseconds;
    rounds set aside for them are tested in a fresh interpreter (below).
    """
    import quantem_flow.io.read_method as read_method

    monkeypatch.setattr(read_method, "_probe_threads", lambda piece: 2)
    monkeypatch.setattr(read_method, "BUSY_TRIES", 0)


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
    assert {r["method"] for r in reads} <= {"mmap", "pread"}
    # the first chunk makes both probes and every chunk has their verdict
    assert len({(r["method"], r["why"]) for r in reads}) == 1
    assert "2 probes on this file by this worker, back to back" in reads[0]["why"]
    # the probe swept its pieces with the pass's own compiled kernels
    assert "a sweep by the pass's kernels" in reads[0]["why"]
    for r in reads:
        assert set(r["measured_GBps"]) == {"mmap", "pread"}
        assert all(v > 0 for v in r["measured_GBps"].values())


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
    with pytest.raises(CorruptChunkError, match="truncated") as read:
        _run(ds, "pread")  # read into a buffer: the same error
    assert "d.npy" in str(read.value)


def test_read_method_setting_is_checked_and_the_probe_is_kept(tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match="read_method must be one of") as info:
        choose_read_method("fast", None, 0, 0, 1 << 20)
    assert "'fast'" in str(info.value)
    assert pickle.loads(pickle.dumps(info.value)).args == info.value.args
    ds = qf.open(np.zeros((4, 4, 8, 8), dtype=np.uint16))
    with config.set(read_method="fast"), pytest.raises(ParameterError, match="'fast'"):
        qf.compute(qf.sum_diffraction(ds), client="synchronous", progress=False)
    path = tmp_path / "p.bin"
    size = 40 << 20
    np.zeros(size, dtype=np.uint8).tofile(path)
    forget_probes()
    again = choose_read_method("auto", path, 0, size, 1 << 20)  # both probes decide at once
    assert set(again.measured_GBps) == {"mmap", "pread"}
    assert all(v > 0 for v in again.measured_GBps.values())
    assert "2 probes on this file by this worker" in again.why
    assert choose_read_method("auto", path, 0, size, 1 << 20) is again  # kept
    forget_probes()
    assert choose_read_method("auto", path, 0, size, 1 << 20) is not again
    forget_probes()
    short = choose_read_method("auto", path, 0, 1 << 20, 1 << 20)
    assert short.method == "pread" and "too few bytes" in short.why
    # a chunk too short to measure does not count as a probe of the file
    assert choose_read_method("auto", path, 0, size, 1 << 20).measured_GBps
    # while a kernel compiles the probe waits: pread now, measured later
    forget_probes()
    waiting = choose_read_method("auto", path, 0, size, 1 << 20, defer=True)
    assert waiting.method == "pread" and "compiling" in waiting.why
    assert not waiting.measured_GBps
    assert choose_read_method("auto", path, 0, size, 1 << 20).measured_GBps


def _fake_probes(
    monkeypatch: pytest.MonkeyPatch, methods: list[str | dict[str, float]]
) -> list[tuple[int, int, int]]:
    """Make the probes answer ``methods`` in turn; returns each one's (nbytes, start, sweeps).

    A method name stands for rates that choose it alone (the map 2x, or as fast as
    pread); a dict gives the probe's rates (GB/s) itself.
    """
    from quantem_flow.io import read_method

    asked: list[tuple[int, int, int]] = []

    def fake(
        path: Path,
        offset: int,
        nbytes: int,
        piece: int,
        start: int = 0,
        sweeps: int = 2,
        map_piece: int = 0,
        *,
        count_busy: bool = False,
        kernels: object = None,
        piece_cap: int = 0,
    ) -> object:
        given = methods[len(asked)]
        asked.append((nbytes, start, sweeps))
        rates = (
            dict(given)
            if isinstance(given, dict)
            else {"mmap": 2.0, "pread": 1.0}
            if given == "mmap"
            else {"mmap": 1.0, "pread": 1.0}
        )
        method = "mmap" if rates["pread"] <= read_method.MARGIN * rates["mmap"] else "pread"
        why = f"probe {len(asked)} found {method} ({sweeps} sweeps)"
        return read_method.ReadChoice(method, why, rates)

    monkeypatch.setattr(read_method, "_probe", fake)
    forget_probes()
    return asked


@pytest.mark.parametrize(
    ("probes", "decision", "best"),
    [
        (["pread", "pread"], "pread", (1.0, 1.0)),  # both find pread as fast
        (["mmap", "mmap"], "mmap", (2.0, 1.0)),  # both find the map faster
        # one probe's map rounds met other work: the other probe's fastest map decides
        (["mmap", "pread"], "mmap", (2.0, 1.0)),
        (["pread", "mmap"], "mmap", (2.0, 1.0)),
        # one probe's pread rounds met other work (the map looked 3x faster): its pread
        # rounds do not count against the other probe's
        ([{"mmap": 3.0, "pread": 1.0}, {"mmap": 2.9, "pread": 2.8}], "pread", (3.0, 2.8)),
        # both probes met other work each way: their fastest rounds still compare
        ([{"mmap": 1.0, "pread": 1.9}, {"mmap": 2.6, "pread": 1.2}], "mmap", (2.6, 1.9)),
    ],
)
def test_a_read_method_is_decided_by_the_fastest_rounds_of_two_probes(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    probes: list[str | dict[str, float]],
    decision: str,
    best: tuple[float, float],
) -> None:
    path = tmp_path / "p.bin"
    size = 40 << 20
    np.zeros(size, dtype=np.uint8).tofile(path)
    asked = _fake_probes(monkeypatch, probes)
    choices = [choose_read_method("auto", path, 0, size, 1 << 20) for _ in range(5)]
    # the first chunk makes both probes, back to back, each on other pieces of the file
    assert len(asked) == 2
    assert [start for _, start, _ in asked] == [0, size // 2]
    final = choices[0]
    assert final.method == decision
    assert all(c is final for c in choices)  # kept for every later chunk
    assert "2 probes on this file" in final.why
    assert final.measured_GBps == {"mmap": best[0], "pread": best[1]}
    assert f"a map {best[0]:.1f} GB/s and pread {best[1]:.1f} GB/s" in final.why
    rule = "the map at least 1.15x faster" if decision == "mmap" else "pread unless the map"
    assert f"({rule}" in final.why
    forget_probes()


@pytest.mark.parametrize(
    ("rates", "digest_sweep", "decision"),
    [
        # within 1.15x: where the kernels carry the digest the map, else pread
        ({"mmap": 1.05, "pread": 1.0}, False, "mmap"),
        ({"mmap": 1.0, "pread": 1.1}, False, "mmap"),
        ({"mmap": 1.05, "pread": 1.0}, True, "pread"),
        # a clear difference decides either way
        ({"mmap": 1.0, "pread": 1.2}, False, "pread"),
        ({"mmap": 1.2, "pread": 1.0}, True, "mmap"),
    ],
)
def test_a_tie_goes_to_the_way_passes_of_that_sweep_measured_faster(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    rates: dict[str, float],
    digest_sweep: bool,
    decision: str,
) -> None:
    path = tmp_path / "p.bin"
    np.zeros(40 << 20, dtype=np.uint8).tofile(path)
    _fake_probes(monkeypatch, [rates, rates])
    choice = choose_read_method("auto", path, 0, 40 << 20, 1 << 20, digest_sweep=digest_sweep)
    assert choice.method == decision
    lead = "pread at least 1.15x faster" if decision == "pread" else "the map unless pread"
    if digest_sweep:
        lead = "the map at least 1.15x faster" if decision == "mmap" else "pread unless the map"
    assert lead in choice.why
    forget_probes()


def test_the_probe_sweeps_each_piece_as_the_pass_will(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Twice where the digest is a sweep of its own, once where the kernel carries it."""
    from quantem_flow.io import read_method

    path = tmp_path / "p.bin"
    np.zeros(40 << 20, dtype=np.uint8).tofile(path)
    asked = _fake_probes(monkeypatch, ["pread"] * 4)
    own = choose_read_method("auto", path, 0, 40 << 20, 1 << 20)
    carried = choose_read_method("auto", path, 0, 40 << 20, 1 << 20, digest_sweep=False)
    # each asked separately: a choice for one is not the other's
    assert [sweeps for _, _, sweeps in asked] == [2, 2, 1, 1]
    assert "read, digest and a sweep by a sum" in own.why
    assert "read and one sweep by a sum" in carried.why
    # the real probe's rounds and its record say which
    forget_probes()
    monkeypatch.undo()
    choice = read_method._probe(path, 0, 40 << 20, 1 << 20, sweeps=1, count_busy=True)
    assert "one sweep by a sum of the bytes (the digest in the kernel's)" in choice.why
    # with the pass's kernels: every byte of every piece each way goes through them
    seen: list[int] = []
    lock = __import__("threading").Lock()

    def kernels(view: np.ndarray) -> None:
        assert view.dtype == np.uint8 and view.flags.c_contiguous
        with lock:
            seen.append(view.nbytes)

    swept = read_method._probe(
        path, 0, 40 << 20, 1 << 20, sweeps=1, kernels=kernels, count_busy=True
    )
    assert "one sweep by the pass's kernels" in swept.why
    assert set(swept.measured_GBps) == {"mmap", "pread"}
    # 2 ways x 2 rounds x 2 threads x 4 pieces of 1 MiB, and the untimed first call
    assert sum(seen) == 2 * 2 * 2 * 4 * (1 << 20) + (1 << 20)
    assert set(choice.measured_GBps) == {"mmap", "pread"}
    # the map probed in the pieces the pass maps (map_piece_mib), pread in its own
    larger = read_method._probe(
        path, 0, 40 << 20, 1 << 20, sweeps=1, map_piece=8 << 20, count_busy=True
    )
    assert "pread in 1048576-byte pieces, the map in 8388608-byte pieces" in larger.why
    assert set(larger.measured_GBps) == {"mmap", "pread"}
    small = read_method._probe(path, 0, 40 << 20, 1 << 20, sweeps=1, map_piece=16 << 20)
    assert small.method == "pread" and "too few bytes" in small.why  # 2 x 2 x 16 MiB > 40


_BUSY_PROBES = r"""
import json, sys, threading
import numpy as np
from pathlib import Path
from quantem_flow.io import read_method
from quantem_flow.io.read_method import choose_read_method

read_method._probe_threads = lambda piece: 2
path, size = Path(sys.argv[1]), 40 << 20
out = {"quiet": read_method._probe(path, 0, size, 1 << 20, sweeps=1).__dict__}
stop = threading.Event()

def spin():  # one other thread of this process kept busy (NumPy sums release the GIL)
    a = np.ones(1 << 18)
    while not stop.is_set():
        a.sum()

spinner = threading.Thread(target=spin)
spinner.start()
try:
    out["busy"] = read_method._probe(path, 0, size, 1 << 20, sweeps=1).__dict__
    out["choices"] = [
        choose_read_method("auto", path, 0, size, 1 << 20).__dict__
        for _ in range(read_method.BUSY_TRIES + 1)
    ]
finally:
    stop.set()
    spinner.join()
out["busy_tries"] = read_method.BUSY_TRIES
print("RESULT " + json.dumps(out))
"""


def test_probe_rounds_while_other_threads_of_the_process_work_do_not_count(
    tmp_path: Path,
) -> None:
    """In a fresh interpreter (no other thread of its own), then beside one busy thread."""
    import json
    import subprocess
    import sys

    path = tmp_path / "p.bin"
    np.zeros(40 << 20, dtype=np.uint8).tofile(path)
    run = subprocess.run(
        [sys.executable, "-c", _BUSY_PROBES, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    # quiet: every round counts, and the record names none set aside
    quiet = out["quiet"]
    assert set(quiet["measured_GBps"]) == {"mmap", "pread"}, quiet["why"]
    assert "not counted" not in quiet["why"]
    # a probe that found the other thread busy in every round of a way decides nothing and
    # says why; one with some quiet rounds names those it set aside
    busy = out["busy"]
    if busy["measured_GBps"]:
        assert "not counted" in busy["why"]
    else:
        assert busy["method"] == "pread" and busy["why"].startswith("not measured: other threads")
        assert "of a CPU busy" in busy["why"]
    # a chunk whose probe decided nothing is followed by another probe; after BUSY_TRIES
    # such chunks every round counts, and the record says so
    choices = out["choices"]
    decided = [c for c in choices if c["measured_GBps"]]
    undecided = [c for c in choices if not c["measured_GBps"]]
    assert decided, [c["why"] for c in choices]  # by the last chunk at the latest
    assert all(c["method"] == "pread" and "later chunk" in c["why"] for c in undecided)
    assert len(undecided) <= out["busy_tries"] == 3  # the module's own, not this file's 0
    first = choices.index(decided[0])
    assert choices[first:] == [decided[0]] * (len(choices) - first)


def test_tasks_reading_one_file_wait_for_one_pair_of_probes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The second probe is not made beside another task's chunk: every task waits for both."""
    from concurrent.futures import ThreadPoolExecutor

    path = tmp_path / "p.bin"
    size = 40 << 20
    np.zeros(size, dtype=np.uint8).tofile(path)
    asked = _fake_probes(monkeypatch, ["mmap", "mmap"])
    with ThreadPoolExecutor(4) as pool:
        found = list(
            pool.map(lambda _: choose_read_method("auto", path, 0, size, 1 << 20), range(4))
        )
    assert len(asked) == 2  # one pair of probes for the file, made by one task
    assert all(c is found[0] for c in found) and found[0].method == "mmap"
    forget_probes()


def test_a_runtime_sweep_that_fails_leaves_the_probe_to_a_sum_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "p.bin"
    size = 40 << 20
    np.zeros(size, dtype=np.uint8).tofile(path)
    calls: list[int] = []

    def broken(view: np.ndarray) -> None:
        calls.append(view.nbytes)
        raise RuntimeError("this runtime's sweep is broken")

    forget_probes()
    choice = choose_read_method("auto", path, 0, size, 1 << 20, kernels=broken)
    forget_probes()
    assert calls == [1 << 20]  # tried once, on a piece of zeros, then not again
    assert set(choice.measured_GBps) == {"mmap", "pread"}  # measured all the same
    assert "could not sweep a probe's piece (RuntimeError: this runtime's sweep is broken)" in (
        choice.why
    )
    # its rounds and its verdict are a sum's: pread unless the map is 1.15x faster
    assert "read, digest and a sweep by a sum of the bytes" in choice.why


def test_pread_piece_sizes_a_probe_reads_and_the_rule_that_chooses() -> None:
    from quantem_flow.io import read_method

    mib = 1 << 20
    assert read_method._pread_sizes(2 * mib, 16 * mib) == [2 * mib, 8 * mib]
    assert read_method._pread_sizes(2 * mib, 6 * mib) == [2 * mib, 6 * mib]  # whole pieces
    assert read_method._pread_sizes(2 * mib, 3 * mib) == [2 * mib]  # no larger whole piece fits
    assert read_method._pread_sizes(2 * mib, 0) == [2 * mib]  # admission counted one piece
    # the largest piece within 1.05x of the fastest: the setting's only where clearly faster
    chosen, why = read_method._pread_piece({mib: 1.04, 4 * mib: 1.0}, mib)
    assert chosen == 4 * mib
    assert "4194304 bytes, the largest read within 1.05x of the fastest" in why
    assert read_method._pread_piece({mib: 1.0, 4 * mib: 1.3}, mib)[0] == 4 * mib
    kept, why = read_method._pread_piece({mib: 1.06, 4 * mib: 1.0}, mib)
    assert kept == mib and "(the setting's)" in why and "1048576: 1.06" in why
    assert read_method._pread_piece({}, mib)[0] == mib


def test_the_probe_reads_pread_in_a_larger_piece_where_admission_counted_one(
    tmp_path: Path,
) -> None:
    from quantem_flow.io import read_method

    path = tmp_path / "p.bin"
    np.zeros(64 << 20, dtype=np.uint8).tofile(path)
    seen: list[int] = []
    lock = __import__("threading").Lock()

    def kernels(view: np.ndarray) -> None:
        with lock:
            seen.append(view.nbytes)

    probe = read_method._probe(
        path, 0, 64 << 20, 1 << 20, sweeps=1, kernels=kernels, count_busy=True, piece_cap=4 << 20
    )
    assert set(probe.pread_GBps) == {1 << 20, 4 << 20}
    assert probe.measured_GBps["pread"] == max(probe.pread_GBps.values())
    assert "pread in 1048576-byte and 4194304-byte pieces" in probe.why
    # 3 ways (pread 1 and 4 MiB, the map) x 2 rounds x 2 threads x 4 MiB, and the untimed
    # first call over one 4 MiB buffer
    assert sum(seen) == 3 * 2 * 2 * (4 << 20) + (4 << 20)
    assert sorted(set(seen)) == [1 << 20, 4 << 20]
    if probe.method == "pread":
        assert probe.piece_bytes in (0, 4 << 20)
    else:
        assert probe.piece_bytes == 0  # a map reads in the pass's map pieces
    record = probe.record()
    assert set(record["pread_GBps_by_piece_bytes"]) == {"1048576", "4194304"}
    pickle.loads(pickle.dumps(probe))


@pytest.mark.parametrize(
    ("sizes", "method", "piece"),
    [
        # the fastest rounds over both probes: the larger piece 1.2, the setting's 1.1
        ([{1: 1.0, 4: 1.2}, {1: 1.1, 4: 1.0}], "pread", 4),
        # within 1.05x of each other: the larger piece
        ([{1: 1.0, 4: 1.0}, {1: 1.04, 4: 0.9}], "pread", 4),
        # the setting's piece read 1.2x faster in one probe: the setting's
        ([{1: 1.2, 4: 1.0}, {1: 1.0, 4: 0.9}], "pread", 0),
        # the map chosen: no pread piece
        ([{1: 0.5, 4: 0.6}, {1: 0.5, 4: 0.6}], "mmap", 0),
    ],
)
def test_two_probes_choose_the_pread_piece_from_their_fastest_rounds(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    sizes: list[dict[int, float]],
    method: str,
    piece: int,
) -> None:
    from quantem_flow.io import read_method

    mib = 1 << 20
    rates = [
        {"mmap": 1.0, "pread": max(s.values()), "sizes": {k * mib: v for k, v in s.items()}}
        for s in sizes
    ]
    calls: list[int] = []

    def fake(*args: Any, piece_cap: int = 0, **kwargs: Any) -> read_method.ReadChoice:
        r = rates[len(calls) % len(rates)]
        calls.append(piece_cap)
        return read_method.ReadChoice(
            "pread",
            "fake",
            {"mmap": float(r["mmap"]), "pread": float(r["pread"])},
            pread_GBps=dict(r["sizes"]),
        )

    monkeypatch.setattr(read_method, "_probe", fake)
    forget_probes()
    path = tmp_path / "p.bin"
    np.zeros(40 << 20, dtype=np.uint8).tofile(path)
    choice = choose_read_method(
        "auto", path, 0, 40 << 20, mib, digest_sweep=True, piece_cap=16 * mib
    )
    assert calls == [16 * mib, 16 * mib]  # both probes, with what admission counted
    assert choice.method == method
    assert choice.piece_bytes == piece * mib
    assert choice.pread_GBps == {mib: max(s[1] for s in sizes), 4 * mib: max(s[4] for s in sizes)}
    if method == "pread":
        said = "pread pieces of 4194304 bytes, the largest" if piece else "(the setting's)"
        assert said in choice.why
    # another cap is another question
    assert choose_read_method("auto", path, 0, 40 << 20, mib, piece_cap=mib) is not choice
    forget_probes()


def test_a_pass_reads_in_the_pread_piece_its_probe_chose_with_the_same_values(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator, tmp_path: Path
) -> None:
    from quantem_flow.io import read_method

    data = _frames(rng)
    np.save(tmp_path / "d.npy", data)
    ds = qf.open(tmp_path / "d.npy", chunk_rows=3)
    # the setting's piece: 5 frames, cut to 4 (the kernels' frame group); a scan row is 13
    asked_pieces: list[tuple[int, int]] = []

    def fake(
        path: Path, offset: int, nbytes: int, piece: int, *args: Any, piece_cap: int = 0, **kw: Any
    ) -> read_method.ReadChoice:
        asked_pieces.append((piece, piece_cap))
        return read_method.ReadChoice(
            "pread",
            "fake",
            {"mmap": 1.0, "pread": 2.0},
            pread_GBps={piece: 1.0, 4 * piece: 2.0},
        )

    monkeypatch.setattr(read_method, "_probe", fake)
    forget_probes()
    with config.set(stream_piece_mib=PIECE_MIB, map_piece_mib=4 * PIECE_MIB, read_method="auto"):
        chosen = qf.compute(*_ops(ds), client="synchronous", progress=False)
    monkeypatch.undo()
    # the probe was asked with the pass's piece (4 frames) and what admission counted for a
    # task's piece (the larger of the read and mapped pieces: 20 frames' bytes)
    assert asked_pieces and set(asked_pieces) == {(4 * FRAME, int(4 * PIECE_MIB * (1 << 20)))}
    streamed = [r["streamed"] for r in _records(chosen[0])]
    assert all(s["read"]["method"] == "pread" for s in streamed)
    assert all(s["read"]["piece_bytes"] == 16 * FRAME for s in streamed)
    assert all("chosen by this worker's read probe" in s["piece_size"] for s in streamed)
    # a whole scan row of 13 frames fits 16 frames: one row per piece instead of 4 frames
    assert all(s["piece_frames"] == 13 for s in streamed)
    asked = _run(ds, "pread")  # the setting's pieces, no probe
    assert all(r["streamed"]["piece_frames"] == 4 for r in _records(asked[0]))
    _same(chosen, asked)
    forget_probes()
