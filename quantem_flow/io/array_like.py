"""Array objects other than NumPy arrays as inputs, opened lazily.

:func:`open_array_like` turns what a user holds in a session into a
:class:`~quantem_flow.io.base.Source` without reading the data:

* a Dask array is read chunk by chunk (each read computes only the Dask
  chunks it covers, with Dask's synchronous scheduler inside the task), and
  its row chunking is kept (:attr:`LazyArraySource.row_chunk_multiple`);
* an xarray ``DataArray`` is opened through its ``.data`` (NumPy or Dask),
  with the calibration its coordinates and ``units`` attributes record
  (:func:`calibration_from_xarray`);
* an ``h5py.Dataset`` or a ``zarr.Array`` stored in a local directory is
  reopened by path through the HDF5 or Zarr reader (so every worker process
  opens it itself); any other ``zarr.Array`` is sliced like a Dask array;
* a list or tuple of numbers is converted with ``numpy.asarray`` (a copy,
  recorded), and any other object with ``shape``, ``dtype`` and slicing is
  read by slicing.

Anything else gets :class:`~quantem_flow.errors.FormatError` naming what
``open`` takes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..calibration import DETECTOR_UNITS, SCAN_UNITS, Calibration
from ..errors import DtypeError, FormatError, ParameterError, ShapeError
from .base import FrameSource, Source, SourceIdentity, header_digest

__all__ = [
    "LazyArraySource",
    "calibration_from_xarray",
    "kind_of",
    "open_array_like",
]

#: Units an xarray coordinate may carry, converted to the project's own.
_SCAN_UNIT_SCALE: dict[str, tuple[str, float]] = {
    "m": ("nm", 1e9),
    "µm": ("nm", 1e3),
    "um": ("nm", 1e3),
    "μm": ("nm", 1e3),
}
_DETECTOR_UNIT_SCALE: dict[str, tuple[str, float]] = {
    "rad": ("mrad", 1e3),
    "1/nm": ("1/Å", 0.1),
    "nm^-1": ("1/Å", 0.1),
    "1/m": ("1/Å", 1e-10),
}


def kind_of(obj: Any) -> str:
    """Name the kind of in-memory input ``obj`` is, by its type.

    Returns
    -------
    str
        ``"numpy"``, ``"xarray"``, ``"xarray-dataset"``, ``"dask"``,
        ``"h5py"``, ``"h5py-group"``, ``"zarr"``, ``"zarr-group"``,
        ``"sequence"``, ``"gpu"``, ``"array-like"`` or ``"unknown"``.
    """
    if isinstance(obj, np.ndarray):
        return "numpy"
    module = type(obj).__module__.split(".")[0]
    name = type(obj).__name__
    if module == "xarray":
        return "xarray" if name == "DataArray" else "xarray-dataset"
    if module == "dask" and name == "Array":
        return "dask"
    if module == "h5py":
        return "h5py" if name == "Dataset" else "h5py-group"
    if module == "zarr":
        return "zarr" if name == "Array" else "zarr-group"
    if isinstance(obj, (list, tuple)):
        return "sequence"
    if hasattr(obj, "__cuda_array_interface__") or (module in ("cupy", "torch") and _on_gpu(obj)):
        return "gpu"
    if all(hasattr(obj, a) for a in ("shape", "dtype", "__getitem__")):
        try:
            np.dtype(obj.dtype)
        except TypeError:
            return "unknown" if not hasattr(obj, "__array__") else "array-protocol"
        return "array-like"
    if hasattr(obj, "__array__"):
        return "array-protocol"
    return "unknown"


def _on_gpu(obj: Any) -> bool:
    device = getattr(obj, "device", None)
    return device is not None and "cpu" not in str(device).lower()


class LazyArraySource(FrameSource):
    """An array object read by slicing: a Dask array, an in-memory Zarr array, any array-like.

    Parameters
    ----------
    array
        ``(R_r, R_c, k_r, k_c)``, or ``(frames, k_r, k_c)`` with ``scan_shape``.
        Slicing it must return something ``numpy.asarray`` accepts; a Dask
        array's slice is computed with the synchronous scheduler.
    scan_shape
        ``(rows, cols)`` or ``"square"`` for 3-D input.
    frame_offset
        Leading frames to skip (3-D input only).
    kind
        What the array is (:func:`kind_of`), for provenance and messages.
    calibration
        Calibration the wrapper recorded (an xarray's coordinates), if any.
    notes
        Choices made while wrapping, recorded in provenance.

    Notes
    -----
    The array object travels with the graph once per worker (as part of the
    pass description), so it must pickle: a Dask array whose graph reads
    files is small; one built with ``dask.array.from_array`` on a NumPy array
    carries that array.
    """

    format: ClassVar[str] = "array"

    def __init__(
        self,
        array: Any,
        *,
        scan_shape: Sequence[int] | str | None = None,
        frame_offset: int = 0,
        kind: str = "array-like",
        calibration: Calibration | None = None,
        notes: Sequence[str] = (),
    ):
        shape = tuple(int(s) for s in array.shape)
        dtype = np.dtype(array.dtype)
        if dtype.kind not in "uif":
            raise DtypeError(
                f"4D-STEM data must be integer or real floating point, got a {kind} of dtype "
                f"{dtype}; convert it first (for example .astype('float32'))"
            )
        self._array = array
        self._kind = kind
        self._ndim = len(shape)
        self._stored_shape = shape
        self._calibration = calibration
        self._extra_notes = list(notes)
        if len(shape) == 4:
            if scan_shape is not None and tuple(int(v) for v in scan_shape) != shape[:2]:
                raise ShapeError(
                    f"scan_shape={scan_shape!r} was given but the {kind} is already 4-D {shape}"
                )
            self._set_frames(
                n_frames=shape[0] * shape[1],
                frame_shape=(shape[2], shape[3]),
                dtype=dtype,
                scan_shape=shape[:2],
                path=None,
                scan_shape_from=f"the {kind}'s shape (4-D)",
            )
        elif len(shape) == 3:
            self._set_frames(
                n_frames=shape[0],
                frame_shape=(shape[1], shape[2]),
                dtype=dtype,
                scan_shape=scan_shape,
                path=None,
                frame_offset=frame_offset,
            )
        else:
            raise ShapeError(
                f"a {kind} input must be 4-D (R_r, R_c, k_r, k_c) or 3-D (frames, k_r, k_c) with "
                f"scan_shape, got shape {shape}"
            )

    @property
    def kind(self) -> str:
        """What the wrapped array is (``"dask"``, ``"zarr"``, ``"array-like"``...)."""
        return self._kind

    @property
    def array(self) -> Any:
        """The wrapped array object."""
        return self._array

    @property
    def calibration(self) -> Calibration | None:
        """The calibration recorded by the wrapper (an xarray's coordinates), if any."""
        return self._calibration

    @property
    def notes(self) -> list[str]:
        """Choices made while wrapping."""
        return [*super().notes, *self._extra_notes]

    @property
    def metadata(self) -> dict[str, Any]:
        """The array's kind, stored shape and (for Dask) its chunks."""
        meta: dict[str, Any] = {
            "array_kind": self._kind,
            "stored_shape": list(self._stored_shape),
            **self.scan_metadata(),
        }
        chunks = getattr(self._array, "chunks", None)
        if chunks is not None and self._kind == "dask":
            meta["dask_chunks"] = [list(c) for c in chunks]
        if self._calibration is not None:
            meta["calibration_from"] = f"the {self._kind}'s coordinates and units attributes"
        return meta

    @property
    def identity(self) -> SourceIdentity:
        """A Dask array's name (a token of its graph), else the type, shape and dtype."""
        name = getattr(self._array, "name", None) if self._kind == "dask" else None
        return SourceIdentity(
            format=self.format,
            paths=(),
            file_sizes=(),
            header_sha256=header_digest(
                self._kind, type(self._array).__qualname__, self._stored_shape, self.dtype.str, name
            ),
        )

    @property
    def row_chunk_multiple(self) -> int | None:
        """Scan rows per stored chunk when chunks split only scan rows, regularly.

        A chunk of the dataset then covers whole chunks of the array, so no
        array chunk is computed twice.  ``None`` when the array is not chunked
        that way.
        """
        chunks = getattr(self._array, "chunks", None)
        if chunks is None:
            return None
        if isinstance(chunks[0], tuple):  # Dask: a tuple of block sizes per axis
            sizes = [tuple(int(b) for b in axis) for axis in chunks]
            first = sizes[0]
            if any(b != first[0] for b in first[:-1]) or first[-1] > first[0]:
                return None
            if any(len(axis) != 1 for axis in sizes[1:]):
                return None
            step = first[0]
        else:  # Zarr: one chunk size per axis
            step = int(chunks[0])
            if any(int(c) != s for c, s in zip(chunks[1:], self._stored_shape[1:], strict=True)):
                return None
        if self._ndim == 4:
            return step
        cols = self.shape[1]
        if self.scan_choice.frame_offset or step % cols:
            return None
        return step // cols

    def _materialise(self, piece: Any) -> np.ndarray:
        if self._kind == "dask":
            piece = piece.compute(scheduler="synchronous")
        return np.asarray(piece)

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read stored frames ``[start, stop)`` of a 3-D array (or flat frames of a 4-D one)."""
        if self._ndim == 3:
            frames = self._materialise(self._array[start:stop])
        else:
            C = self.shape[1]
            rows = self.read((start // C, (stop - 1) // C + 1), (0, C))
            flat = rows.reshape(-1, *self.shape[2:])
            first = start - (start // C) * C
            frames = flat[first : first + (stop - start)]
        frames = np.asarray(frames, dtype=self.dtype)
        if out is not None:
            out[...] = frames
            return out
        return frames

    def read(
        self, rows: tuple[int, int], cols: tuple[int, int], *, buffer: np.ndarray | None = None
    ) -> np.ndarray:
        """Read the scan block by slicing the array (4-D) or its frames (3-D)."""
        if self._ndim == 3:
            return super().read(rows, cols, buffer=buffer)
        self.check_block(rows, cols)
        block = self._materialise(self._array[rows[0] : rows[1], cols[0] : cols[1]])
        expected = (rows[1] - rows[0], cols[1] - cols[0], *self.shape[2:])
        if block.shape != expected:
            raise ShapeError(
                f"slicing the {self._kind} at rows {rows}, cols {cols} gave shape {block.shape}, "
                f"expected {expected}; the array object does not slice like a NumPy array"
            )
        return np.asarray(block, dtype=self.dtype)


def _uniform_step(values: np.ndarray) -> float | None:
    """The step of an evenly spaced 1-D coordinate, or ``None`` when it is not."""
    if values.ndim != 1 or values.size < 2 or values.dtype.kind not in "uif":
        return None
    steps = np.diff(values.astype(np.float64))
    step = float(steps.mean())
    if step == 0 or not np.allclose(steps, step, rtol=1e-6, atol=0.0):
        return None
    return step


def _axis_of(da: Any, dim: str, *, kind: str) -> tuple[float, str, float] | str:
    """``(step, canonical unit, origin px)`` of one dimension, or why not."""
    if dim not in da.coords:
        return f"{dim!r} has no coordinate"
    coord = da.coords[dim]
    values = np.asarray(coord.values)
    step = _uniform_step(values)
    if step is None:
        return f"{dim!r}'s coordinate is not evenly spaced numbers"
    units = coord.attrs.get("units")
    if units is None:
        return f"{dim!r}'s coordinate has no 'units' attribute"
    text = str(units).strip()
    table = _SCAN_UNIT_SCALE if kind == "scan" else _DETECTOR_UNIT_SCALE
    known = SCAN_UNITS if kind == "scan" else DETECTOR_UNITS
    scale = 1.0
    if text in table:
        text, scale = table[text]
    from ..calibration import normalize_units
    from ..errors import UnitsError

    try:
        canonical = normalize_units(text, kind=kind)
    except (UnitsError, ParameterError):
        return f"{dim!r}'s units {units!r} are not one of {list(known)} (or a length/angle of them)"
    if canonical == "px" and not math.isclose(abs(step), 1.0, rel_tol=1e-6):
        return f"{dim!r} is in px with a step of {step}, not one pixel"
    origin = -float(values[0]) / step
    return (step * scale, canonical, origin)


def calibration_from_xarray(da: Any) -> tuple[Calibration | None, list[str]]:
    """The calibration an xarray ``DataArray``'s coordinates record, and notes on what was used.

    The first two dimensions are the scan (row, column), the last two the
    detector (row, column).  A dimension's coordinate counts when it is
    evenly spaced and has a ``units`` attribute: a scan length (``Å``,
    ``nm``, ``pm``, ``m``, ``µm``) or a detector angle or spatial frequency
    (``mrad``, ``rad``, ``1/Å``, ``1/nm``).  The detector origin is the pixel
    where the detector coordinates are zero.  The scan's origin is not kept
    (a scan axis starts at its first position).  ``accelerating_voltage_kV``
    is read from the array's attributes when present.

    Returns
    -------
    tuple of (Calibration or None, list of str)
        ``None`` when no axis is calibrated; the notes say, per axis, what
        was taken and why anything was not.
    """
    dims = tuple(str(d) for d in da.dims)
    scan_dims, det_dims = (dims[:2], dims[-2:]) if len(dims) == 4 else ((), dims[-2:])
    notes = [f"axes: the dimensions {dims} taken in order as (R_r, R_c, k_r, k_c)"]
    if len(dims) == 3:
        notes[0] = f"axes: the dimensions {dims} taken in order as (frames, k_r, k_c)"
    fields: dict[str, Any] = {}
    for kind, pair in (("scan", scan_dims), ("detector", det_dims)):
        found = [_axis_of(da, d, kind=kind) for d in pair]
        if not pair:
            continue
        why = [f for f in found if isinstance(f, str)]
        if why:
            notes.append(f"calibration: {kind} axes left uncalibrated: {'; '.join(why)}")
            continue
        axes = [f for f in found if not isinstance(f, str)]
        if axes[0][1] != axes[1][1]:
            notes.append(
                f"calibration: {kind} axes left uncalibrated: their units differ "
                f"({axes[0][1]!r}, {axes[1][1]!r})"
            )
            continue
        if any(a[0] < 0 for a in axes):
            notes.append(
                f"calibration: {kind} coordinates decrease along "
                f"{[d for d, a in zip(pair, axes, strict=True) if a[0] < 0]}; the magnitude of "
                "the step is used and the direction recorded here"
            )
        units = axes[0][1]
        if units == "px" and kind == "scan":
            continue
        sampling = (abs(axes[0][0]), abs(axes[1][0]))
        if kind == "scan":
            fields.update(scan_sampling=sampling, scan_units=units)
        else:
            if units != "px":
                fields.update(detector_sampling=sampling, detector_units=units)
            fields["detector_origin"] = (axes[0][2], axes[1][2])
        notes.append(
            f"calibration: {kind} sampling {sampling} {units} from the coordinates of {pair}"
            + (f", origin at pixel {fields['detector_origin']}" if kind == "detector" else "")
        )
    for key in ("accelerating_voltage_kV", "voltage_kV", "beam_energy_kV"):
        value = da.attrs.get(key)
        if value is not None:
            fields["accelerating_voltage_kV"] = float(value)
            notes.append(f"calibration: accelerating voltage {float(value)} kV from attrs[{key!r}]")
            break
    if not fields:
        return None, notes
    return Calibration(**fields), notes


_WHAT_OPEN_TAKES = (
    "qf.open takes a path (a file or directory), a NumPy array, a Dask array, an xarray "
    "DataArray, a zarr.Array, an h5py.Dataset, a list of numbers, or any array object with "
    "shape, dtype and NumPy-style slicing"
)


def open_array_like(obj: Any, *, format: str | None = None, **options: Any) -> tuple[Source, str]:
    """Open an in-memory array object lazily; say how.

    Parameters
    ----------
    obj
        See the module docstring.
    format
        ``None`` or ``"memory"``/``"array"``; an HDF5 dataset or a Zarr array
        in a directory is reopened by its own reader whatever is given.
    **options
        ``scan_shape=``, ``frame_offset=`` (3-D input).

    Returns
    -------
    tuple of (Source, str)
        The source and how its reader was chosen (recorded in provenance).

    Raises
    ------
    FormatError
        For an object that is not an array, a group instead of an array, or
        a GPU array.
    """
    kind = kind_of(obj)
    if format not in (None, "memory", "array", "hdf5", "zarr"):
        raise ParameterError(
            f"an in-memory {kind} input is opened by its own kind, not format={format!r}; leave "
            "format= out"
        )
    if kind == "numpy":
        from .memory import ArraySource

        return ArraySource(obj, **options), "in-memory array"
    if kind == "xarray":
        calibration, notes = calibration_from_xarray(obj)
        data = obj.data
        inner = kind_of(data)
        if inner == "numpy":
            from .memory import ArraySource

            src = ArraySource(
                data,
                calibration=calibration,
                calibration_from="the xarray DataArray's coordinates and units attributes",
                notes=notes,
                **options,
            )
            return src, "xarray DataArray (NumPy data)"
        lazy = LazyArraySource(
            data,
            kind=f"xarray DataArray ({inner})",
            calibration=calibration,
            notes=notes,
            **options,
        )
        return lazy, f"xarray DataArray ({inner} data)"
    if kind == "dask":
        return LazyArraySource(obj, kind="dask", **options), "Dask array"
    if kind == "h5py":
        return _reopen_h5py(obj, **options)
    if kind == "zarr":
        root = getattr(getattr(obj, "store", None), "root", None)
        if root is not None and Path(os.fspath(root)).is_dir():
            from .zarr_store import ZarrSource

            source = ZarrSource(root, array_path=str(obj.path) or None, **options)
            return source, f"zarr.Array in {os.fspath(root)!r} (reopened by path)"
        return LazyArraySource(obj, kind="zarr", **options), "zarr.Array (in memory, sliced)"
    if kind == "sequence":
        try:
            array = np.asarray(obj)
        except ValueError as exc:
            raise FormatError(
                f"the list given to qf.open is not a rectangular array of numbers ({exc}); "
                "give a list of equally shaped frames, or a NumPy array"
            ) from exc
        if array.dtype.kind not in "uif":
            raise DtypeError(
                f"the list given to qf.open converts to dtype {array.dtype}; expected numbers "
                "(integer or real)"
            )
        from .memory import ArraySource

        note = (
            f"input: a Python {type(obj).__name__} copied into a NumPy array of shape "
            f"{array.shape} and dtype {array.dtype}"
        )
        return ArraySource(
            array, notes=[note], **options
        ), f"Python {type(obj).__name__} (copied with numpy.asarray)"
    if kind == "array-like":
        return (
            LazyArraySource(obj, kind=f"array-like {type(obj).__name__}", **options),
            f"array-like {type(obj).__module__}.{type(obj).__qualname__} (sliced)",
        )
    if kind == "array-protocol":
        array = np.asarray(obj)
        from .memory import ArraySource

        note = f"input: a {type(obj).__qualname__} converted with numpy.asarray"
        return ArraySource(
            array, notes=[note], **options
        ), f"{type(obj).__qualname__} (numpy.asarray)"
    if kind == "gpu":
        raise FormatError(
            f"a GPU array ({type(obj).__module__}.{type(obj).__qualname__}) was given; "
            "quantem-flow reads inputs on the host and places chunks on devices itself. Copy "
            "it to the host first (cupy: .get(); torch: .cpu().numpy())"
        )
    if kind == "xarray-dataset":
        names = list(getattr(obj, "data_vars", ()))[:10]
        raise FormatError(
            f"an xarray Dataset was given; open one of its variables (a DataArray), for "
            f"example ds[{names[0]!r}]"
            if names
            else "an xarray Dataset with no variables was given"
        )
    if kind == "h5py-group":
        raise FormatError(
            f"an h5py {type(obj).__name__} was given; give one of its datasets "
            f"(f['path/to/data']), or the file's path with dataset_path="
        )
    if kind == "zarr-group":
        raise FormatError(
            "a zarr Group was given; give one of its arrays (group['path/to/array']), or the "
            "store's path with array_path="
        )
    raise FormatError(f"{_WHAT_OPEN_TAKES}; got a {type(obj).__module__}.{type(obj).__qualname__}")


def _reopen_h5py(dset: Any, **options: Any) -> tuple[Source, str]:
    """An ``h5py.Dataset`` reopened read-only by its file's path."""
    f = dset.file
    filename = os.fspath(f.filename)
    if f.driver == "core" or not Path(filename).is_file():
        raise FormatError(
            f"the h5py dataset {dset.name!r} lives in a file held in memory (driver "
            f"{f.driver!r}), which worker processes cannot open; read it with dset[()] and "
            "give the NumPy array, or write the file to disk"
        )
    if f.mode != "r":
        raise FormatError(
            f"the h5py dataset {dset.name!r} is in {filename!r}, which this session holds open "
            f"for writing (mode {f.mode!r}); HDF5 locks such a file, so worker processes cannot "
            "read it. Close it, or reopen it with h5py.File(path, 'r'), and open the dataset again"
        )
    from .hdf5 import Hdf5Source

    source = Hdf5Source(filename, dataset_path=dset.name, **options)
    return source, f"h5py.Dataset {dset.name!r} in {filename!r} (reopened by path)"
