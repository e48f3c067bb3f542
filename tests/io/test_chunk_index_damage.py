"""The last foreign exceptions of fuzzed files: the bitshuffle chunk index and fill values.

A chunk offset beyond 2**63 (``OverflowError``), a contiguous dataset where a chunked one
was expected (``TypeError: 'NoneType' object is not iterable``) and h5py's "Can't get fill
value" each become the project's error naming the file and the dataset (issue 23, item 8).
The damaged HDF5 structures are stood in for by small fakes of the h5py objects, as the
fuzzed files themselves are not kept.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import h5py
import numpy as np
import pytest

from quantem_flow.errors import CorruptChunkError, FormatError
from quantem_flow.io import bslz4_read


def _real(tmp_path: Path, *, chunks: Any = (1, 4, 4)) -> tuple[Any, Any]:
    f = h5py.File(tmp_path / "d.h5", "w")
    dset = f.create_dataset("data", data=np.ones((3, 4, 4), np.uint16), chunks=chunks)
    return f, dset


class _Id:
    """A dataset id whose chunk iterator reports what a damaged index holds."""

    def __init__(self, real: Any, infos: list[Any]) -> None:
        self._real = real
        self._infos = infos

    def chunk_iter(self, visit: Any) -> None:
        for info in self._infos:
            visit(info)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _Dataset:
    def __init__(self, real: Any, **override: Any) -> None:
        self._real = real
        self.__dict__.update(override)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_chunk_offset_beyond_int64_is_a_corrupt_chunk(tmp_path: Path) -> None:
    f, real = _real(tmp_path)
    try:
        info = SimpleNamespace(
            chunk_offset=(0, 0, 0), byte_offset=2**64 - 1, size=10, filter_mask=0
        )
        fake = _Dataset(real, id=_Id(real.id, [info]))
        bslz4_read._cache.clear()
        with pytest.raises(CorruptChunkError) as err:
            bslz4_read.chunk_index(fake)
        assert "'/data'" in str(err.value) and "d.h5" in str(err.value)
    finally:
        f.close()


def test_a_contiguous_dataset_is_a_format_error_not_a_type_error(tmp_path: Path) -> None:
    f, real = _real(tmp_path, chunks=None)
    try:
        assert real.chunks is None
        bslz4_read._cache.clear()
        with pytest.raises(FormatError, match="stored contiguously") as err:
            bslz4_read.chunk_index(real)
        assert "'/data'" in str(err.value)
    finally:
        f.close()


def test_a_fill_value_that_cannot_be_read_names_the_dataset(tmp_path: Path) -> None:
    f, real = _real(tmp_path)
    try:

        class NoFill(_Dataset):
            @property
            def fillvalue(self) -> Any:
                raise RuntimeError("Can't get fill value (invalid fill value message)")

        with pytest.raises(CorruptChunkError) as err:
            bslz4_read.fill_value(NoFill(real), "/x/d.h5")
        text = str(err.value)
        assert "'/data'" in text and "/x/d.h5" in text and "Can't get fill value" in text
        assert bslz4_read.fill_value(real, "d.h5") == 0
    finally:
        f.close()
