"""A bounded, seeded fuzzer over every reader (issue 11, item 10; issue 15).

Run as a program (``python -m tests.fuzz_readers SEED SECONDS [--only
READER ...] [--verbose]``) so that a crash or a hang of one mutation is
seen by the parent test, not suffered by it.  It writes one small valid
input per reader, then for each mutation copies it, changes a few bytes
(mostly in the first KiB, where headers live), opens it with ``qf.open``
and reads every scan row.  Anything raised that is not a
:class:`~quantem_flow.errors.QuantemFlowError` is a failure: the program
prints ``FOREIGN <reader> #<k> [<mutation>] <type>: <message>`` and exits
1 at the end; a try that runs over ``--hang`` seconds prints ``HANG`` with
every stack and exits 2.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import zlib
from pathlib import Path
from typing import Any

import numpy as np


def _inputs(root: Path) -> dict[str, tuple[Path, Path, dict[str, Any]]]:
    """``{reader: (path to open, file to mutate, open options)}``.

    Each input lives in its own directory ``root/<reader>`` (what one mutation
    copies), so adding a reader does not slow the others down.
    """
    from tests.io.writers import (
        write_dectris,
        write_empad,
        write_hdf5,
        write_mib,
        write_npy,
        write_raw,
        write_stempy,
        write_zarr,
    )
    from tests.io.writers_blockfile import write_blockfile
    from tests.io.writers_dm4 import write_dm4_4d
    from tests.io.writers_emd import write_emd
    from tests.io.writers_mib import write_raw_mib
    from tests.io.writers_mrc import write_de_info, write_mrc
    from tests.io.writers_ser import write_emi, write_ser
    from tests.io.writers_tvips import write_tvips
    from tests.io.writers_velox import write_velox

    def d(name: str) -> Path:
        (root / name).mkdir()
        return root / name

    rng = np.random.default_rng(0)
    frames = rng.poisson(2, size=(6, 16, 16)).astype(np.uint16)
    cube = frames.reshape(2, 3, 16, 16)
    out: dict[str, tuple[Path, Path, dict[str, Any]]] = {}
    p = write_npy(d("npy") / "d.npy", cube)
    out["npy"] = (p, p, {})
    p = write_raw(d("raw") / "d.raw", frames, dtype="<u2", offset=16, header_bytes=8)
    out["raw"] = (
        p,
        p,
        {
            "format": "raw",
            "dtype": "<u2",
            "frame_shape": (16, 16),
            "scan_shape": (2, 3),
            "offset": 16,
            "frame_header_bytes": 8,
        },
    )
    p = write_hdf5(d("hdf5") / "d.h5", cube)
    out["hdf5"] = (p, p, {"dataset_path": "/data"})
    p = write_hdf5(d("hdf5-plain") / "plain.h5", frames, bitshuffle=False)
    out["hdf5-plain"] = (p, p, {"dataset_path": "/data", "scan_shape": (2, 3)})
    for name in ("dectris", "dectris-master"):
        master = write_dectris(d(name), "acq", frames, frames_per_file=4)
        target = master if name == "dectris-master" else master.parent / "acq_data_000001.h5"
        out[name] = (master, target, {"scan_shape": (2, 3)})
    p = write_mib(d("mib") / "d.mib", frames)
    out["mib"] = (p, p, {"scan_shape": (2, 3)})
    p = write_raw_mib(d("mib-raw") / "r.mib", frames.astype(np.uint8) % 64, counter_depth=6)
    out["mib-raw"] = (p, p, {"scan_shape": (2, 3)})
    xml = write_empad(d("empad"), "e", rng.random((2, 3, 128, 128)).astype(np.float32))
    out["empad"] = (xml, xml, {})
    events = [np.flatnonzero(f).astype(np.uint32) for f in frames]
    p = write_stempy(d("counted") / "c.h5", events, (2, 3), (16, 16))
    out["counted"] = (p, p, {})
    for name in ("zarr-meta", "zarr-chunk"):
        store = write_zarr(d(name) / "d.zarr", cube)
        chunk = next(q for q in sorted(store.rglob("*")) if q.is_file() and q.name != "zarr.json")
        out[name] = (store, store / "zarr.json" if name == "zarr-meta" else chunk, {})
    p = write_blockfile(d("blockfile") / "d.blo", cube.astype(np.uint8))
    out["blockfile"] = (p, p, {})
    for name in ("ser", "ser-emi"):
        p = write_ser(d(name) / "s_1.ser", cube)
        emi = write_emi(p.parent / "s.emi")
        out[name] = (p, emi if name == "ser-emi" else p, {})
    # two files of 4 frames: the second file's header is mutated as often as the first's
    p = write_tvips(d("tvips"), "t", frames, frames_per_file=4)
    out["tvips"] = (p, p, {"scan_shape": (2, 3)})
    for name in ("mrc", "mrc-info"):
        p = write_mrc(d(name) / "m_movie.mrc", frames, extended=bytes(256))
        info = write_de_info(p.parent / "m_info.txt", (2, 3))
        out[name] = (p, info if name == "mrc-info" else p, {})
    p = write_dm4_4d(d("dm4") / "d.dm4", cube)
    out["dm4"] = (p, p, {})
    p = write_emd(d("emd") / "d.emd", cube)
    out["emd"] = (p, p, {})
    p = write_velox(d("velox") / "v.emd", cube)
    out["velox"] = (p, p, {})
    return out


def _mutate(data: bytearray, rng: np.random.Generator) -> str:
    n = len(data)
    kind = int(rng.integers(0, 4))
    head = min(n, 1024)
    if kind == 0:  # flip bits
        pos = [int(rng.integers(0, head if rng.random() < 0.8 else n)) for _ in range(3)]
        for q in pos:
            data[q] ^= 1 << int(rng.integers(0, 8))
        return f"flip bits at {pos}"
    if kind == 1:  # random bytes
        q = int(rng.integers(0, head))
        k = int(rng.integers(1, 9))
        data[q : q + k] = rng.integers(0, 256, size=k, dtype=np.uint8).tobytes()
        return f"random bytes at {q}..{q + k}"
    if kind == 2:  # truncate
        cut = int(rng.integers(0, n))
        del data[cut:]
        return f"truncate to {cut}"
    q = int(rng.integers(0, head))  # a digit into another (headers written as text)
    data[q : q + 1] = bytes([int(rng.choice(list(b"0123456789-9e\x00 ")))])
    return f"text byte at {q}"


def _read_all(path: Path, options: dict[str, Any]) -> None:
    import quantem_flow as qf

    ds = qf.open(path, **options)
    for r0, r1 in ds.chunks:
        ds.load_block((r0, r1))
    ds.source.close()


def _watchdog(limit: float, state: dict[str, Any]) -> threading.Thread:
    """A daemon thread: a try running longer than ``limit`` seconds is a hang.

    It prints ``HANG <reader> [<mutation>]`` and every thread's stack, then
    ends the process (exit status 2); ``faulthandler`` ends it too, at twice
    the limit, should the thread not get the interpreter lock.
    """

    def watch() -> None:
        while True:
            time.sleep(limit / 10)
            started = state.get("started")
            if started is not None and time.monotonic() - started > limit:
                print(f"HANG {state['name']} [{state['what']}] over {limit:g} s", flush=True)
                faulthandler.dump_traceback(file=sys.stdout, all_threads=True)
                sys.stdout.flush()
                os._exit(2)

    thread = threading.Thread(target=watch, name="fuzz-watchdog", daemon=True)
    thread.start()
    return thread


def main(
    seed: int,
    seconds: float,
    *,
    only: list[str] | None = None,
    verbose: bool = False,
    hang_s: float = 30.0,
) -> int:
    """Fuzz every reader for about ``seconds``; return the number of foreign exceptions.

    Each valid input is read once first (a failure there is counted too:
    the fuzzer would test nothing), which also warms imports and compiled
    kernels.  The time is shared fairly: the next try goes to the reader
    that has used the least time so far, so a slow reader (an HDF5 file opened anew each
    try) does not starve a fast one.  Each reader draws its mutations from its
    own generator, seeded by ``(seed, reader)``, so the ``k``-th mutation of a
    reader is the same whatever the others cost (``only=[reader]`` with the
    same seed reproduces it).  ``verbose`` prints each try before it runs
    (``TRY``), which names the culprit of a crash.
    """
    from quantem_flow.errors import QuantemFlowError

    faulthandler.enable()
    failures = 0
    tries = 0
    state: dict[str, Any] = {"started": None}
    _watchdog(hang_s, state)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "valid"
        root.mkdir()
        inputs = _inputs(root)
        names = sorted(n for n in inputs if only is None or n in only)
        if not names:
            raise SystemExit(f"no reader among {only}; the inputs are {sorted(inputs)}")
        rngs = {n: np.random.default_rng([seed, zlib.crc32(n.encode())]) for n in names}
        spent = dict.fromkeys(names, 0.0)
        count = dict.fromkeys(names, 0)
        deadline = time.monotonic() + seconds
        for name in names:  # each valid input reads cleanly (and imports, JIT, caches are warm)
            path, _, options = inputs[name]
            state.update(name=name, what="valid input", started=time.monotonic())
            try:
                _read_all(path, options)
            except Exception as exc:
                failures += 1
                print(f"INVALID {name}: the valid input fails: {type(exc).__name__}: {exc}")
            state["started"] = None
        while time.monotonic() < deadline:
            name = min(names, key=lambda n: (spent[n], n))
            t0 = time.monotonic()
            tries += 1
            count[name] += 1
            path, target, options = inputs[name]
            work = Path(tmp) / f"try{tries}"
            shutil.copytree(root / name, work)
            mpath = work / path.relative_to(root / name)
            mtarget = work / target.relative_to(root / name)
            data = bytearray(mtarget.read_bytes())
            what = _mutate(data, rngs[name]) if data else "empty"
            mtarget.write_bytes(bytes(data))
            if verbose:
                print(f"TRY {name} #{count[name]} [{what}]", flush=True)
            state.update(name=name, what=what, started=time.monotonic())
            faulthandler.dump_traceback_later(2 * hang_s, exit=True)
            try:
                _read_all(mpath, options)
            except QuantemFlowError:
                pass
            except Exception as exc:  # the point: report anything foreign
                failures += 1
                last = traceback.extract_tb(exc.__traceback__)[-1]
                print(
                    f"FOREIGN {name} #{count[name]} [{what}] "
                    f"{type(exc).__module__}.{type(exc).__name__}: "
                    f"{str(exc)[:200]} (at {last.filename}:{last.lineno})",
                    flush=True,
                )
            faulthandler.cancel_dump_traceback_later()
            if verbose:
                print(f"    {time.monotonic() - state['started']:.3f} s", flush=True)
            state["started"] = None
            shutil.rmtree(work, ignore_errors=True)
            spent[name] += time.monotonic() - t0
    per = ", ".join(f"{n} {count[n]}" for n in names)
    print(f"DONE {tries} mutations, {failures} foreign exceptions ({per})", flush=True)
    return failures


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.fuzz_readers")
    parser.add_argument("seed", type=int)
    parser.add_argument("seconds", type=float)
    parser.add_argument("--only", nargs="+", help="fuzz only these inputs")
    parser.add_argument("--verbose", action="store_true", help="print each try first")
    parser.add_argument("--hang", type=float, default=30.0, help="seconds a try may take")
    args = parser.parse_args()
    found = main(args.seed, args.seconds, only=args.only, verbose=args.verbose, hang_s=args.hang)
    sys.exit(1 if found else 0)
