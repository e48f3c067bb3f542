"""``read_frames(out=)``: one contract kept by ``FrameSource`` for every reader, plug-ins too."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from quantem_flow.errors import DtypeError, ShapeError
from quantem_flow.io.base import FrameSource, SourceIdentity


class CarelessSource(FrameSource):
    """A plug-in reader that ignores ``out`` and returns a new array (allowed)."""

    format = "careless"

    def __init__(self) -> None:
        self.seen: list[object] = []
        self._set_frames(
            n_frames=6, frame_shape=(2, 3), dtype=np.uint16, scan_shape=(2, 3), path=None
        )

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        self.seen.append(None if out is None else (out.shape, out.dtype, out.flags.c_contiguous))
        return (np.arange(6 * 6, dtype=np.uint16) * 300).reshape(6, 2, 3)[start:stop]

    @property
    def path(self) -> Path:
        return Path("/nowhere")

    @property
    def identity(self) -> SourceIdentity:
        return SourceIdentity(format="careless", paths=(), file_sizes=(), header_sha256="0" * 64)

    @property
    def metadata(self) -> dict[str, object]:
        return {}


def _want(start: int, stop: int) -> np.ndarray:
    return (np.arange(36, dtype=np.uint16) * 300).reshape(6, 2, 3)[start:stop]


def test_an_exact_out_reaches_the_reader_and_is_returned_filled() -> None:
    src = CarelessSource()
    out = np.zeros((2, 2, 3), np.uint16)
    assert src.read_frames(1, 3, out=out) is out
    assert src.seen == [((2, 2, 3), np.dtype(np.uint16), True)]
    np.testing.assert_array_equal(out, _want(1, 3))


def test_wider_or_strided_outs_are_filled_by_copying() -> None:
    src = CarelessSource()
    wide = np.zeros((2, 2, 3), np.float64)
    assert src.read_frames(0, 2, out=wide) is wide
    np.testing.assert_array_equal(wide, _want(0, 2))
    strided = np.zeros((2, 2, 6), np.uint16)[:, :, ::2]
    src.read_frames(4, 6, out=strided)
    np.testing.assert_array_equal(strided, _want(4, 6))
    assert src.seen == [None, None]  # the reader never saw a buffer it could not fill in place


@pytest.mark.parametrize(
    ("out", "error", "says"),
    [
        (np.zeros((2, 2, 3), np.uint8), DtypeError, "dtype uint8 cannot hold"),
        (np.zeros((2, 2, 3), np.int16), DtypeError, "dtype int16 cannot hold"),
        (np.zeros((4, 2, 3), np.uint16), ShapeError, r"shape \(4, 2, 3\)"),
        (np.zeros((1, 2, 3), np.uint16), ShapeError, r"shape \(1, 2, 3\)"),
    ],
)
def test_outs_that_would_wrap_or_broadcast_are_refused(
    out: np.ndarray, error: type[Exception], says: str
) -> None:
    src = CarelessSource()
    with pytest.raises(error, match=says) as caught:
        src.read_frames(1, 3, out=out)
    assert not out.any() and src.seen == []  # nothing written, the reader not called
    assert type(pickle.loads(pickle.dumps(caught.value))) is error


def test_bounds_are_checked_before_the_buffer() -> None:
    with pytest.raises(ShapeError, match=r"frames \[5, 8\) lie outside the 6 frames"):
        CarelessSource().read_frames(5, 8, out=np.zeros((3, 2, 3), np.uint16))
