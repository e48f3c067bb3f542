"""A bounded, seeded fuzzer over every reader (issue 11, item 10).

Run as a program (``python -m tests.fuzz_readers SEED SECONDS``) so that a
crash or a hang of one mutation is seen by the parent test, not suffered by
it.  It writes one small valid input per reader, then for each mutation
copies it, changes a few bytes (mostly in the first KiB, where headers
live), opens it with ``qf.open`` and reads every scan row.  Anything raised
that is not a :class:`~quantem_flow.errors.QuantemFlowError` is a failure:
the program prints ``FOREIGN <reader> <mutation> <type>: <message>`` and
exits 1 at the end.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np


def _inputs(root: Path) -> dict[str, tuple[Path, Path, dict[str, Any]]]:
    """``{reader: (path to open, file to mutate, open options)}``."""
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

    rng = np.random.default_rng(0)
    frames = rng.poisson(2, size=(6, 16, 16)).astype(np.uint16)
    out: dict[str, tuple[Path, Path, dict[str, Any]]] = {}
    p = write_npy(root / "d.npy", frames.reshape(2, 3, 16, 16))
    out["npy"] = (p, p, {})
    p = write_raw(root / "d.raw", frames, dtype="<u2", offset=16, header_bytes=8)
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
    p = write_hdf5(root / "d.h5", frames.reshape(2, 3, 16, 16))
    out["hdf5"] = (p, p, {"dataset_path": "/data"})
    p = write_hdf5(root / "plain.h5", frames, bitshuffle=False)
    out["hdf5-plain"] = (p, p, {"dataset_path": "/data", "scan_shape": (2, 3)})
    (root / "dectris").mkdir()
    (root / "empad").mkdir()
    master = write_dectris(root / "dectris", "acq", frames, frames_per_file=4)
    out["dectris"] = (master, root / "dectris" / "acq_data_000001.h5", {"scan_shape": (2, 3)})
    out["dectris-master"] = (master, master, {"scan_shape": (2, 3)})
    p = write_mib(root / "d.mib", frames)
    out["mib"] = (p, p, {"scan_shape": (2, 3)})
    xml = write_empad(root / "empad", "e", rng.random((2, 3, 128, 128)).astype(np.float32))
    out["empad"] = (xml, xml, {})
    events = [np.flatnonzero(f).astype(np.uint32) for f in frames]
    p = write_stempy(root / "c.h5", events, (2, 3), (16, 16))
    out["counted"] = (p, p, {})
    store = write_zarr(root / "d.zarr", frames.reshape(2, 3, 16, 16))
    meta = store / "zarr.json"
    out["zarr-meta"] = (store, meta, {})
    chunk = next(q for q in sorted(store.rglob("*")) if q.is_file() and q.name != "zarr.json")
    out["zarr-chunk"] = (store, chunk, {})
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


def main(seed: int, seconds: float) -> int:
    """Fuzz every reader for about ``seconds``; return the number of foreign exceptions."""
    from quantem_flow.errors import QuantemFlowError

    rng = np.random.default_rng(seed)
    failures = 0
    tries = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "valid"
        root.mkdir()
        inputs = _inputs(root)
        names = sorted(inputs)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            name = names[tries % len(names)]
            tries += 1
            path, target, options = inputs[name]
            work = Path(tmp) / f"try{tries}"
            shutil.copytree(root, work)
            mpath = work / path.relative_to(root)
            mtarget = work / target.relative_to(root)
            data = bytearray(mtarget.read_bytes())
            what = _mutate(data, rng) if data else "empty"
            mtarget.write_bytes(bytes(data))
            try:
                _read_all(mpath, options)
            except QuantemFlowError:
                pass
            except Exception as exc:  # the point: report anything foreign
                failures += 1
                last = traceback.extract_tb(exc.__traceback__)[-1]
                print(
                    f"FOREIGN {name} [{what}] {type(exc).__module__}.{type(exc).__name__}: "
                    f"{str(exc)[:200]} (at {last.filename}:{last.lineno})",
                    flush=True,
                )
            shutil.rmtree(work, ignore_errors=True)
    print(f"DONE {tries} mutations, {failures} foreign exceptions", flush=True)
    return failures


if __name__ == "__main__":
    sys.exit(1 if main(int(sys.argv[1]), float(sys.argv[2])) else 0)
