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
from .base import FrameSource, Source, SourceIdentity
from .registry import ReaderEntry

__all__ = [
    "BUILTIN_READERS",
    "GENERIC_READERS",
    "READERS",
    "SNIFFERS",
    "SUFFIXES",
    "FrameSource",
    "ReaderEntry",
    "Source",
    "SourceIdentity",
    "detect_format",
    "open_source",
    "open_source_explained",
    "reader_class",
    "reader_names",
]

# A built-in reader is one row of BUILTIN_READERS (docs/readers.md): its class, its
# content sniffer and its suffixes, as strings, so nothing is imported until it is used
# (opening an .npy file never imports h5py or zarr). Third-party readers join through the
# entry-point group "quantem_flow.readers", declaring the same as class attributes
# (quantem_flow.io.registry; both kinds live in one quantem_flow.plugins.Registry).

#: The built-in readers, one row each: format name, ``"module:Class"`` of its
#: :class:`Source`, ``"module:sniff"`` (``sniff(path, head) -> bool`` says from the first
#: 4096 bytes, ``b""`` for a directory, whether a file is in the format; ``None``: never
#: detected by content, as raw binary), lower-case name endings (which choose between
#: readers recognising the same content, and name the reader when none does), and
#: ``generic`` for a reader of any file of a container format (generic HDF5: chosen only
#: when no specific reader recognises the file).
BUILTIN_READERS: tuple[ReaderEntry, ...] = (
    ReaderEntry("memory", "quantem_flow.io.memory:ArraySource"),
    ReaderEntry("npy", "quantem_flow.io.npy:NpySource", "quantem_flow.io.sniffers:npy", (".npy",)),
    ReaderEntry("raw", "quantem_flow.io.raw:RawSource"),
    ReaderEntry(
        "hdf5",
        "quantem_flow.io.hdf5:Hdf5Source",
        "quantem_flow.io.sniffers:hdf5",
        (".h5", ".hdf5", ".hdf", ".nxs", ".emd", ".he5"),
        generic=True,
    ),
    ReaderEntry(
        "dectris",
        "quantem_flow.io.dectris:DectrisSource",
        "quantem_flow.io.sniffers:dectris_master",
        ("_master.h5", "_master.hdf5"),
    ),
    ReaderEntry(
        "zarr", "quantem_flow.io.zarr_store:ZarrSource", "quantem_flow.io.sniffers:zarr", (".zarr",)
    ),
    ReaderEntry(
        "empad", "quantem_flow.io.empad:EmpadSource", "quantem_flow.io.empad:sniff", (".xml",)
    ),
    ReaderEntry(
        "mib",
        "quantem_flow.io.merlin:MerlinSource",
        "quantem_flow.io.sniffers:mib",
        (".mib", ".hdr"),
    ),
    ReaderEntry(
        "counted", "quantem_flow.io.counted:CountedSource", "quantem_flow.io.sniffers:counted"
    ),
    ReaderEntry("dm4", "quantem_flow.io.dm4:Dm4Source", "quantem_flow.io.dm4:sniff", (".dm4",)),
    ReaderEntry(
        "emd", "quantem_flow.io.emd:EmdSource", "quantem_flow.io.emd:sniff", (".emd", ".py4dstem")
    ),
    ReaderEntry(
        "velox", "quantem_flow.io.velox:VeloxSource", "quantem_flow.io.velox:sniff", (".emd",)
    ),
    ReaderEntry(
        "blockfile",
        "quantem_flow.io.blockfile:BlockfileSource",
        "quantem_flow.io.blockfile:sniff",
        (".blo",),
    ),
    ReaderEntry(
        "ser", "quantem_flow.io.ser:SerSource", "quantem_flow.io.ser:sniff", (".ser", ".emi")
    ),
    ReaderEntry(
        "mrc", "quantem_flow.io.mrc:MrcSource", "quantem_flow.io.mrc:sniff", (".mrc", ".mrcs")
    ),
    ReaderEntry(
        "tvips", "quantem_flow.io.tvips:TvipsSource", "quantem_flow.io.tvips:sniff", (".tvips",)
    ),
    ReaderEntry(
        "raw_csr",
        "quantem_flow.io.raw_csr:RawCsrSource",
        "quantem_flow.io.sniffers:raw_csr",
        (".toml",),
    ),
    ReaderEntry("seq", "quantem_flow.io.seq:SeqSource", "quantem_flow.io.seq:sniff", (".seq",)),
    ReaderEntry(
        "frms6",
        "quantem_flow.io.frms6:Frms6Source",
        "quantem_flow.io.frms6:sniff",
        (".frms6", ".hdr"),
    ),
    ReaderEntry(
        "k2is", "quantem_flow.io.k2is:K2isSource", "quantem_flow.io.sniffers:k2is", (".gtg", ".bin")
    ),
)

# Views of the rows, by column (kept for code written against the earlier three tables).
#: Format name -> ``"module:Class"`` of its :class:`Source`.
READERS: dict[str, str] = {r.name: r.target for r in BUILTIN_READERS}
#: Format name -> ``"module:sniff"`` of the readers detected by content.
SNIFFERS: dict[str, str] = {r.name: str(r.sniffer) for r in BUILTIN_READERS if r.sniffer}
#: Format name -> lower-case name endings of its files.
SUFFIXES: dict[str, tuple[str, ...]] = {r.name: r.suffixes for r in BUILTIN_READERS if r.suffixes}
#: Readers that open any file of a container format.
GENERIC_READERS: frozenset[str] = frozenset(r.name for r in BUILTIN_READERS if r.generic)


def reader_class(fmt: str) -> Callable[..., Source]:
    """Return the reader class registered for ``fmt`` (built-in or installed).

    Raises
    ------
    ParameterError
        No reader of that name (the message lists the known ones).
    """
    from .registry import reader_class as _reader_class

    return _reader_class(fmt)


def reader_names() -> list[str]:
    """Return the sorted names of every registered reader (built-in and installed)."""
    from .registry import reader_names as _reader_names

    return _reader_names()


def detect_format(path: str | os.PathLike[str]) -> str:
    """Choose the reader of a path by its content first, then by its name.

    Every registered reader's sniffer looks at the first bytes of the file
    (magic bytes, an HDF5 file's structure, a directory's ``zarr.json``);
    the name's suffix only chooses between readers that recognise the same
    content, or, when none does, hands the file to the reader its suffix
    names (whose error then says what is wrong).  See docs/readers.md.

    Parameters
    ----------
    path
        File or directory.

    Returns
    -------
    str
        A registered reader name.

    Raises
    ------
    FormatError
        When no reader, or several, could open it; the message lists every
        reader and why.
    """
    from .registry import detect

    return detect(Path(path)).format


def open_source(
    path_or_array: str | os.PathLike[str] | np.ndarray | Any,
    *,
    format: str | None = None,
    **options: Any,
) -> Source:
    """Open an input with the right reader.

    Parameters
    ----------
    path_or_array
        A file, directory or in-memory array: NumPy, Dask, xarray
        ``DataArray``, ``zarr.Array``, ``h5py.Dataset``, a list, or any array
        object with ``shape``, ``dtype`` and slicing
        (:mod:`quantem_flow.io.array_like`).
    format
        Reader name; detected from the content and name when ``None``
        (:func:`detect_format`).
    **options
        Passed to the reader (``dataset_path``, ``scan_shape``, ``dtype``...).

    Returns
    -------
    Source
        The opened (metadata-only) source.
    """
    return open_source_explained(path_or_array, format=format, **options)[0]


def open_source_explained(
    path_or_array: str | os.PathLike[str] | np.ndarray | Any,
    *,
    format: str | None = None,
    **options: Any,
) -> tuple[Source, str]:
    """Open an input like :func:`open_source` and say how its reader was chosen.

    Returns
    -------
    tuple of (Source, str)
        The source, and ``"given (format=...)"``, ``"in-memory array"`` or
        the detection's reason (``"content: ..."``, ``"suffix ..."``), which
        :func:`quantem_flow.open` records in provenance as ``format_from``.
    """
    from .base import Source

    if isinstance(path_or_array, Source):  # a source made by the caller (a live series...)
        if format is not None or options:
            raise ParameterError(
                f"a {type(path_or_array).__name__} is opened as it is; format= and reader "
                f"options do not apply (got format={format!r}, {sorted(options)})"
            )
        return path_or_array, f"given source ({path_or_array.format})"
    if isinstance(path_or_array, np.ndarray):
        if format not in (None, "memory"):
            raise ParameterError(f"an in-memory array needs format='memory', got {format!r}")
        return reader_class("memory")(path_or_array, **options), "in-memory array"
    if not isinstance(path_or_array, (str, os.PathLike)):
        from .array_like import open_array_like

        return open_array_like(path_or_array, format=format, **options)
    fmt: str | None = format
    how = f"given (format={format!r})"
    from .base import check_regular

    check_regular(path_or_array, what="input")  # a FIFO would block the detection's read
    try:
        if fmt is None:
            from .registry import detect
            from .results_store import is_results_store

            if is_results_store(path_or_array):
                raise FormatError(
                    f"{str(path_or_array)!r} is a quantem-flow results file, not a 4D-STEM "
                    f"input; load it with qf.load_results({str(path_or_array)!r}) (or "
                    "describe it with quantem-flow info)"
                )

            detection = detect(Path(path_or_array))
            fmt, how = detection.format, f"detected by {detection.how}"
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
    return source, how


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
    "dm4": "ImageData/Dimensions in the DM4 tags",
    "emd": "the shape of the EMD array's data",
    "velox": "the Velox stack's shape and Scan/ScanSize",
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
