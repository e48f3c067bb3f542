"""One suite every reader passes: shapes, dtypes, exact reads, orientation, pickling.

The checks are :mod:`quantem_flow.testing.readers` (shipped, so a third-party
reader runs the same ones).  Each case here writes a rectangular scan of fresh
random data in its format with the independent writers in
:mod:`tests.io.writers`, and the checks compare what the reader returns with
the array that was written.

Cases of further formats live in modules ``tests/io/conformance_cases_<fmt>.py``,
each exporting ``CASES: dict[str, Callable[[Path, np.random.Generator], Case]]``
(importing :class:`Case` and :func:`_random` from this module); they are
collected here, and every registered built-in reader must have at least one
case (:func:`test_every_registered_reader_has_a_case`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from quantem_flow.testing.readers import (
    DETECTOR,
    READER_CHECKS,
    SCAN,
    ReaderCase,
    random_values,
)

from . import writers

Case = ReaderCase
_random = random_values
__all__ = ["DETECTOR", "SCAN", "Case", "_random"]


def _memory(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "float32")
    return Case(a, {}, a, "memory")


def _npy_4d(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "uint16")
    return Case(writers.write_npy(tmp / "data.npy", a), {}, a, "npy")


def _npy_3d(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), ">i4")
    p = writers.write_npy(tmp / "frames.npy", a.reshape(-1, *DETECTOR))
    return Case(p, {"scan_shape": SCAN}, a, "npy")


def _raw(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), ">u2")
    p = writers.write_raw(
        tmp / "data.bin",
        a.reshape(-1, *DETECTOR),
        dtype=">u2",
        offset=16,
        header_bytes=8,
        footer_bytes=4,
    )
    opts = {
        "format": "raw",
        "dtype": ">u2",
        "frame_shape": DETECTOR,
        "scan_shape": SCAN,
        "offset": 16,
        "frame_header_bytes": 8,
        "frame_footer_bytes": 4,
    }
    return Case(p, opts, a, "raw")


def _hdf5_3d(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "uint32")
    p = writers.write_hdf5(tmp / "frames.h5", a.reshape(-1, *DETECTOR), dataset_path="/scan/frames")
    return Case(p, {"dataset_path": "/scan/frames", "scan_shape": SCAN}, a, "hdf5")


def _hdf5_4d(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "uint16")
    p = writers.write_hdf5(tmp / "cube.h5", a, dataset_path="/entry/cube", bitshuffle=True)
    return Case(p, {"dataset_path": "/entry/cube"}, a, "hdf5")


def _dectris_single(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "uint16")
    p = writers.write_dectris(tmp, "scan", a.reshape(-1, *DETECTOR), frames_per_file=1000)
    return Case(p, {"scan_shape": SCAN}, a, "dectris")


def _dectris_multi(tmp: Path, rng: np.random.Generator) -> Case:
    # 35 frames in files of 8: file boundaries fall inside scan rows.
    a = _random(rng, (*SCAN, *DETECTOR), "uint32")
    p = writers.write_dectris(
        tmp, "multi", a.reshape(-1, *DETECTOR), frames_per_file=8, bit_depth=32
    )
    return Case(p, {"scan_shape": SCAN}, a, "dectris")


def _dectris_8bit(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "uint8")
    p = writers.write_dectris(
        tmp, "eight", a.reshape(-1, *DETECTOR), frames_per_file=10, bit_depth=8
    )
    return Case(p, {"scan_shape": SCAN}, a, "dectris")


def _zarr_3d(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "uint16")
    p = writers.write_zarr(
        tmp / "frames.zarr",
        a.reshape(-1, *DETECTOR),
        array_path="scan/frames",
        chunks=(4, *DETECTOR),
        compressor="zstd",
    )
    return Case(p, {"array_path": "scan/frames", "scan_shape": SCAN}, a, "zarr")


def _zarr_4d(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (*SCAN, *DETECTOR), "float32")
    p = writers.write_zarr(tmp / "cube.zarr", a, chunks=(2, 3, *DETECTOR), compressor="blosc")
    return Case(p, {}, a, "zarr")


def _empad(tmp: Path, rng: np.random.Generator) -> Case:
    a = _random(rng, (3, 4, 128, 128), "float32")
    return Case(writers.write_empad(tmp, "acq", a), {}, a, "empad")


def _mib(depth: str, quad: bool) -> Callable[[Path, np.random.Generator], Case]:
    def make(tmp: Path, rng: np.random.Generator) -> Case:
        k = 512 if quad else 256
        scan = (2, 3)
        native = {"U08": "uint8", "U16": "uint16", "U32": "uint32"}[depth]
        a = _random(rng, (*scan, k, k), native)
        p = writers.write_mib(tmp / "scan.mib", a.reshape(-1, k, k), depth=depth, quad=quad)
        return Case(p, {"scan_shape": scan}, a, "mib")

    return make


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    "memory": _memory,
    "npy-4d": _npy_4d,
    "npy-3d-bigendian": _npy_3d,
    "raw-bigendian": _raw,
    "hdf5-3d": _hdf5_3d,
    "hdf5-4d-bslz4": _hdf5_4d,
    "dectris-single": _dectris_single,
    "dectris-multi": _dectris_multi,
    "dectris-8bit": _dectris_8bit,
    "zarr-3d-zstd": _zarr_3d,
    "zarr-4d-blosc": _zarr_4d,
    "empad": _empad,
    "mib-U08": _mib("U08", False),
    "mib-U16": _mib("U16", False),
    "mib-U32": _mib("U32", False),
    "mib-U16-quad": _mib("U16", True),
    "mib-U32-quad": _mib("U32", True),
}


def _collect_case_modules() -> dict[str, Callable[[Path, np.random.Generator], Case]]:
    """The ``CASES`` of every ``conformance_cases_*.py`` module next to this one."""
    found: dict[str, Callable[[Path, np.random.Generator], Case]] = {}
    package = __package__ or "tests.io"
    for path in sorted(Path(__file__).parent.glob("conformance_cases_*.py")):
        module = importlib.import_module(f"{package}.{path.stem}")
        cases = getattr(module, "CASES", None)
        if not isinstance(cases, dict) or not all(callable(f) for f in cases.values()):
            raise TypeError(f"{path.name} must export CASES: dict[str, Callable -> Case]")
        for key, make in cases.items():
            if key in CASES or key in found:
                raise ValueError(f"conformance case {key!r} of {path.name} is already defined")
            found[key] = make
    return found


CASES.update(_collect_case_modules())


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Case:
    rng = np.random.default_rng()  # fresh data every run
    return CASES[request.param](tmp_path, rng)


@pytest.mark.parametrize("check", READER_CHECKS, ids=lambda c: c.__name__)
def test_reader_conforms(case: Case, check: Callable[[Case], None]) -> None:
    check(case)


def test_every_registered_reader_has_a_case(tmp_path: Path) -> None:
    from quantem_flow.io.registry import readers

    rng = np.random.default_rng()
    covered: dict[str, list[str]] = {}
    for key, make in CASES.items():
        where = tmp_path / key
        where.mkdir()
        covered.setdefault(make(where, rng).format, []).append(key)
    builtin = {name for name, entry in readers().items() if entry.origin == "built-in"}
    missing = sorted(builtin - set(covered))
    assert not missing, (
        f"registered readers without a conformance case: {missing}; add their cases in a "
        "tests/io/conformance_cases_<fmt>.py module exporting CASES"
    )
