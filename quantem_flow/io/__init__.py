"""Readers and writers, one module per format, behind one registry.

:func:`open_source` picks a reader by ``format=`` or by the file's name and
content, and passes the remaining keyword options to it.
"""

from __future__ import annotations

import importlib
import os
import struct
import tokenize
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError, ParameterError, QuantemFlowError, SourceNotFoundError
from .base import FrameSource, Source, SourceIdentity, check_exists

__all__ = [
    "READERS",
    "FrameSource",
    "Source",
    "SourceIdentity",
    "detect_format",
    "open_source",
]

# format name -> "module:Class"; modules import lazily so that opening an
# .npy file never imports h5py or zarr.
READERS: dict[str, str] = {
    "memory": "quantem_flow.io.memory:ArraySource",
    "npy": "quantem_flow.io.npy:NpySource",
    "raw": "quantem_flow.io.raw:RawSource",
    "hdf5": "quantem_flow.io.hdf5:Hdf5Source",
    "dectris": "quantem_flow.io.dectris:DectrisSource",
    "zarr": "quantem_flow.io.zarr_store:ZarrSource",
    "empad": "quantem_flow.io.empad:EmpadSource",
    "mib": "quantem_flow.io.merlin:MerlinSource",
    "counted": "quantem_flow.io.counted:CountedSource",
}


def reader_class(fmt: str) -> Callable[..., Source]:
    """Return the reader class registered for ``fmt``."""
    target = READERS.get(fmt)
    if target is None:
        raise ParameterError(f"unknown format {fmt!r}; known formats: {sorted(READERS)}")
    module, _, name = target.partition(":")
    cls: Callable[..., Source] = getattr(importlib.import_module(module), name)
    return cls


def _is_dectris_master(path: Path) -> bool:
    if path.name.lower().endswith(("_master.h5", "_master.hdf5")):
        return True
    from .hdf5 import open_h5

    with open_h5(path) as f:
        det = f.get("/entry/instrument/detector/description")
        if det is not None:
            text = det[()]
            text = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
            return "dectris" in text.lower() or "arina" in text.lower() or "eiger" in text.lower()
    return False


def _is_counted(path: Path) -> bool:
    from .hdf5 import open_h5

    with open_h5(path) as f:
        return "electron_events/frames" in f


def detect_format(path: str | os.PathLike[str]) -> str:
    """Guess the reader for a path from its name and, for HDF5, its content.

    Parameters
    ----------
    path
        File or directory.

    Returns
    -------
    str
        A key of :data:`READERS`.
    """
    p = check_exists(path)
    name = p.name.lower()
    if p.is_dir():
        if (p / "zarr.json").exists() or (p / ".zarray").exists() or (p / ".zgroup").exists():
            return "zarr"
        raise FormatError(f"directory {str(p)!r} is not a Zarr store (no zarr.json)")
    if name.endswith(".npy"):
        return "npy"
    if name.endswith(".mib"):
        return "mib"
    if name.endswith(".xml"):
        return "empad"
    if name.endswith((".h5", ".hdf5", ".nxs", ".hdf", ".emd")):
        if _is_dectris_master(p):
            return "dectris"
        return "counted" if _is_counted(p) else "hdf5"
    if name.endswith(".zarr"):
        return "zarr"
    raise FormatError(
        f"cannot tell the format of {str(p)!r} from its name; pass format= one of "
        f"{sorted(READERS)} (raw binary needs format='raw', dtype= and frame_shape=)"
    )


def open_source(
    path_or_array: str | os.PathLike[str] | np.ndarray, *, format: str | None = None, **options: Any
) -> Source:
    """Open an input with the right reader.

    Parameters
    ----------
    path_or_array
        A file, directory or in-memory array.
    format
        Reader name; guessed from the path when ``None``.
    **options
        Passed to the reader (``dataset_path``, ``scan_shape``, ``dtype``...).

    Returns
    -------
    Source
        The opened (metadata-only) source.
    """
    if isinstance(path_or_array, np.ndarray):
        if format not in (None, "memory"):
            raise ParameterError(f"an in-memory array needs format='memory', got {format!r}")
        return reader_class("memory")(path_or_array, **options)
    fmt: str | None = format
    try:
        fmt = format or detect_format(path_or_array)
        cls = reader_class(fmt)
        source = cls(path_or_array, **options)
    except QuantemFlowError:
        raise
    except TypeError as exc:
        if "unexpected keyword" in str(exc) or "required keyword" in str(exc):
            raise ParameterError(f"reader {fmt!r}: {exc}") from exc
        raise
    except FileNotFoundError as exc:
        raise SourceNotFoundError(
            f"a file of the input {str(path_or_array)!r} does not exist ({exc}); restore it or "
            "check the path"
        ) from exc
    except FOREIGN_READ_ERRORS as exc:
        raise FormatError(
            f"{str(path_or_array)!r} could not be opened as {fmt or 'a known format'}: "
            f"{type(exc).__name__}: {str(exc)[:300]}. The file is damaged, truncated or not in "
            "that format; check it with the format's own tools (h5ls/h5dump for HDF5), or "
            "pass format= if the guess was wrong"
        ) from exc
    check_declared_sizes(source, path_or_array)
    source.opened_as = os.fspath(path_or_array)  # as given, recorded in provenance
    return source


#: Exceptions that third-party parsers (h5py, zarr, NumPy's header parser, XML
#: decoders) raise on damaged input; readers turn them into the project's errors.
FOREIGN_READ_ERRORS: tuple[type[BaseException], ...] = (
    RuntimeError,
    OSError,
    ValueError,
    LookupError,
    ArithmeticError,
    SyntaxError,
    EOFError,
    MemoryError,
    tokenize.TokenError,
    struct.error,
)


#: Most pixels one detector frame may declare (16384 x 16384): every kernel holds
#: detector-sized weights, so a header declaring more fails at compute time.
MAX_FRAME_PIXELS = 1 << 28

#: Where each reader's shape comes from, for messages.
_DECLARED_BY = {
    "hdf5": "the shape of the HDF5 dataset",
    "dectris": "the shape of the data files' datasets (and the master's metadata)",
    "counted": "the attributes Nx/Ny (or frame_dimensions/scan_dimensions) of the file",
    "zarr": "'shape' in the array's zarr.json",
    "npy": "the shape in the .npy header",
    "raw": "the frame_shape / shape given",
    "mib": "the frame size in the .mib frame header",
    "empad": "the frame size in the EMPAD .xml",
}


def check_declared_sizes(source: Source, where: Any) -> None:
    """Refuse, at open, shapes declared in a header that no chunk could ever hold.

    Chunks hold whole scan rows and kernels hold detector-sized weights, so
    a frame of more than :data:`MAX_FRAME_PIXELS` pixels, or a single scan
    row larger than this machine's memory, would only fail later with a
    ``MemoryError`` in a worker.  Formats whose file must hold every byte
    (``.npy``, raw, Merlin, EMPAD) already check the file size at open.

    Raises
    ------
    ShapeError
        Naming the declared shape, where it was declared and the size.
    """
    from ..errors import ShapeError

    R, C, kr, kc = (int(v) for v in source.shape)
    field = _DECLARED_BY.get(source.format, f"the {source.format} header")
    name = f"{source.format} input {str(where)!r}"
    if min(R, C, kr, kc) < 1:
        raise ShapeError(
            f"{name}: {field} declares the shape {(R, C, kr, kc)}, with an empty axis; a 4D-STEM "
            "input needs at least one scan position and one detector pixel -- the header is "
            "damaged or the wrong dataset was opened"
        )
    if kr * kc > MAX_FRAME_PIXELS:
        raise ShapeError(
            f"{name}: {field} declares detector frames of {kr} x {kc} = {kr * kc} pixels, more "
            f"than the {MAX_FRAME_PIXELS} (16384 x 16384) any kernel can hold weights for; the "
            "header is probably damaged -- check the detector size it declares"
        )
    row = C * kr * kc * int(source.dtype.itemsize)
    try:
        psutil: Any = importlib.import_module("psutil")
        ram = int(psutil.virtual_memory().total)
    except (ImportError, OSError):  # pragma: no cover - psutil is a dependency of distributed
        return
    if row > ram:
        raise ShapeError(
            f"{name}: {field} declares the shape {(R, C, kr, kc)}; one scan row of it is "
            f"{row / 2**30:.1f} GiB decoded, more than this machine's {ram / 2**30:.1f} GiB of "
            "memory, and chunks hold whole scan rows -- the header is probably damaged; check "
            "the scan width and detector size it declares"
        )
