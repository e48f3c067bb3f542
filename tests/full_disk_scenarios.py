"""Saves onto a full and a read-only file system, run inside a private mount namespace.

Run by tests/test_full_disk.py as ``unshare --user --map-root-user --mount python -m
tests.full_disk_scenarios OUT.json``: it mounts a 2 MiB tmpfs (then remounts it read-only)
that only this process sees, saves results onto it, and writes what happened as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def _result(name: str, nbytes: int) -> Any:
    from quantem_flow.provenance import Provenance
    from quantem_flow.results import Axis, ScanImage

    side = int(np.sqrt(max(1, nbytes // 8))) + 1
    return ScanImage(
        data=np.random.default_rng(0).random((side, side)),
        units="counts",
        axes=(Axis("scan_row", side), Axis("scan_col", side)),
        provenance=Provenance(operator=name),
        name=name,
    )


def main(out: str) -> int:
    import quantem_flow as qf
    from quantem_flow.errors import StorageError

    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        mnt = Path(d) / "disk"
        mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
        small = {"bf": _result("bf", 64 * 1024)}
        big = {"bf": _result("bf", 8 * 2**20)}  # 8 MiB onto a 2 MiB disk
        for fmt, name in (("hdf5", "r.h5"), ("zarr", "r.zarr")):
            target = mnt / name
            qf.save_results(small, target)
            before = qf.load_results(target)["bf"].data.copy()
            case: dict[str, Any] = {}
            try:
                qf.save_results(big, target, overwrite=True)
                case["raised"] = None
            except StorageError as exc:
                case.update(
                    raised="StorageError",
                    message=str(exc),
                    needed=exc.needed_bytes,
                    free=exc.free_bytes,
                    oserror=isinstance(exc, OSError),
                )
            except Exception as exc:  # what a user saw before: the foreign error
                case.update(raised=type(exc).__name__, message=str(exc))
            case["intact"] = bool(np.array_equal(qf.load_results(target)["bf"].data, before))
            case["leftovers"] = sorted(p.name for p in mnt.iterdir() if p.name.startswith("."))
            # the pre-check aside: a write that fills the disk midway (the free space looks
            # enough, then another writer takes it) must also leave nothing behind
            filler = mnt / "filler"
            case["midway"] = _midway(qf, StorageError, target, fmt, filler)
            case["leftovers_after_midway"] = sorted(
                p.name for p in mnt.iterdir() if p.name.startswith(".")
            )
            report[fmt] = case
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        try:
            qf.save_results(small, mnt / "new.h5")
            report["readonly"] = {"raised": None}
        except StorageError as exc:
            report["readonly"] = {"raised": "StorageError", "message": str(exc)}
        except Exception as exc:
            report["readonly"] = {"raised": type(exc).__name__, "message": str(exc)}
        subprocess.run(["umount", str(mnt)], check=False)
    Path(out).write_text(json.dumps(report))
    return 0


def _midway(qf: Any, storage_error: type, target: Path, fmt: str, filler: Path) -> dict[str, Any]:
    import shutil

    from quantem_flow.io import results_store

    real = results_store._free_bytes
    results_store._free_bytes = lambda directory: 1 << 40  # the pre-check is fooled
    try:
        free = shutil.disk_usage(filler.parent).free
        filler.write_bytes(b"\0" * max(0, free - 256 * 1024))  # leave 256 KiB
        name = "mid.h5" if fmt == "hdf5" else "mid.zarr"
        try:
            qf.save_results({"bf": _result("bf", 2**20)}, target.parent / name)
            return {"raised": None}
        except storage_error as exc:
            return {"raised": "StorageError", "message": str(exc)}
        except Exception as exc:
            return {"raised": type(exc).__name__, "message": str(exc)}
    finally:
        results_store._free_bytes = real
        filler.unlink()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
