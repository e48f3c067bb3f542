"""Inputs that used to hang, exhaust memory or give a foreign exception (issue 23, item 9).

Each gets the project's error naming what was expected, what was given and what to do:
a FIFO given as ``.npy`` (the detection's read blocked), a raw ``dtype="nonsense"`` (a
``TypeError``), an electron-counted file declaring 100000 x 100000 scan positions (a
``MemoryError``), a Zarr shape rewritten to 99,999,999 frames (read on as fill value; now
refused unless ``allow_fill=True``), an all-NaN pattern ("pattern is flat"), a Merlin
header with negative sizes ("-168 records of -128 bytes").
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import DtypeError, FormatError, ParameterError
from tests.io.writers import mib_header, write_stempy, write_zarr


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "scan.npy"
    os.mkfifo(fifo)
    result: dict[str, object] = {}

    def open_it() -> None:
        try:
            qf.open(fifo)
        except Exception as exc:
            result["error"] = exc

    t = threading.Thread(target=open_it, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(10)
    assert not t.is_alive(), "opening a FIFO still blocks"
    error = result.get("error")
    assert isinstance(error, FormatError), error
    assert "FIFO" in str(error) and "regular files" in str(error)
    assert time.monotonic() - t0 < 10
    with pytest.raises(FormatError, match="FIFO"):
        qf.open(fifo, format="npy")


def test_a_raw_dtype_that_is_not_one_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "x.raw"
    np.zeros(16, np.uint16).tofile(path)
    with pytest.raises(DtypeError, match="'nonsense'") as info:
        qf.open(path, format="raw", dtype="nonsense", frame_shape=(2, 2), scan_shape=(2, 2))
    assert isinstance(info.value, TypeError)  # still a TypeError for callers catching that
    assert "'uint16'" in str(info.value)


def test_a_counted_file_declaring_a_vast_scan_is_refused(tmp_path: Path) -> None:
    import h5py

    events = [np.array([1, 2, 3]) for _ in range(4)]
    path = write_stempy(tmp_path / "c.h5", events, (2, 2), (8, 8), positions=[0, 1, 2, 3])
    with h5py.File(path, "r+") as f:  # the scan shape attributes damaged
        f["electron_events/scan_positions"].attrs["Nx"] = 100_000
        f["electron_events/scan_positions"].attrs["Ny"] = 100_000
    with pytest.raises(FormatError) as info:
        qf.open(path)
    text = str(info.value)
    assert "10000000000 scan positions" in text and "4 frame entries" in text
    assert "damaged" in text


def test_a_zarr_shape_far_beyond_its_chunks_needs_allow_fill(tmp_path: Path) -> None:
    data = np.arange(20 * 4 * 4, dtype=np.uint16).reshape(20, 4, 4)
    store = write_zarr(tmp_path / "s.zarr", data, chunks=(2, 4, 4))
    meta_path = store / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["shape"][0] = 99_999_999
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(FormatError) as info:
        qf.open(store, scan_shape=(99_999_999, 1))
    text = str(info.value)
    assert "49999999" in text or "50000000" in text  # the chunks declared
    assert "10 chunk files" in text and "allow_fill=True" in text
    ds = qf.open(store, scan_shape=(99_999_999, 1), allow_fill=True)  # asked for: opens
    assert ds.shape == (99_999_999, 1, 4, 4)
    # a store that is merely incomplete (a few chunks missing) still opens without it
    meta["shape"][0] = 24
    meta_path.write_text(json.dumps(meta))
    assert qf.open(store, scan_shape=(24, 1)).shape == (24, 1, 4, 4)


def test_an_all_nan_pattern_is_said_so() -> None:
    from quantem_flow.operators.probe import find_probe

    with pytest.raises(ParameterError, match="no finite value"):
        find_probe(np.full((16, 16), np.nan))


def test_a_merlin_header_with_negative_sizes_is_named(tmp_path: Path) -> None:
    header = mib_header(1, width=4, height=4)
    bad = header.replace(b",00004,00004,", b",-0004,00004,", 1)
    assert bad != header
    path = tmp_path / "x.mib"
    path.write_bytes((bad + bytes(32)) * 3)
    with pytest.raises(FormatError) as info:
        qf.open(path, scan_shape=(3, 1))
    assert "positive sizes" in str(info.value) or "header" in str(info.value)
    assert "-168" not in str(info.value)
