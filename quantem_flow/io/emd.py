"""EMD 1.0 files (``.emd``/``.h5``) as written by py4DSTEM and ``emdfile``.

An EMD file is HDF5 whose groups say what they hold in the attribute
``emd_group_type``: ``"file"`` on the file itself (with ``version_major`` /
``version_minor``), ``"root"`` on a tree's root, ``0`` on metadata groups,
``1`` (or ``"array"``) on an array, ``2``/``3`` on point lists.  An array
group holds the dataset ``data`` (Prismatic names it ``datacube``: a group's
only dataset that is not a dimension vector is taken, noted) and one
dimension vector per axis,
``dim0``, ``dim1``... (``emdfile``; the older EMD 0.2 specification numbers
them ``dim1``, ``dim2``...), each with ``name`` and ``units`` attributes.  A
linear dimension vector may be stored as its first two values only.  A
py4DSTEM ``DataCube`` is such an array of shape ``(R_x, R_y, Q_x, Q_y)``,
which is ``(R_r, R_c, k_r, k_c)`` here (its first axis is the row).

The reader takes the one array group whose ``data`` is 4-D (or the group
or dataset named by ``dataset_path``) and reads it as the generic HDF5
reader does (chunks, compression, Fletcher32).  Calibration comes from the
dimension vectors: the step (second value minus first) in their units,
the scan in ``Å``/``nm``/``pm``, the detector in ``1/Å`` (``A^-1``),
``1/nm`` (converted) or ``mrad``; ``pixels`` means uncalibrated.  A
detector vector not starting at 0 places the optical axis at
``-first / step`` pixels.  The accelerating voltage is not part of the
array's layout and is not read.  A JSON sidecar's calibration overrides the
file's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..calibration import Calibration, normalize_units
from ..errors import DatasetPathError, FormatError, UnitsError
from .base import (
    calibration_choice,
    check_exists,
    described_calibration,
    drop_unusable_samplings,
)
from .hdf5 import (
    Hdf5Source,
    link_name,
    open_h5,
    read_attribute,
    read_attributes,
)

__all__ = ["EmdSource", "find_emd_arrays", "sniff"]

#: ``emd_group_type`` values of an array group.
ARRAY_TYPES = (1, "array")
_SNIFF_GROUPS = 256
_RECIPROCAL_NM = {"1/nm", "nm^-1", "nm-1"}


def _is_array_group(obj: Any) -> bool:
    value = read_attribute(obj, "emd_group_type")
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, np.generic):
        value = value.item()
    return value in ARRAY_TYPES


def array_dataset_name(group: Any) -> str | None:
    """The dataset of an EMD array group that holds the array.

    ``data`` (EMD 1.0, py4DSTEM, emdfile); else the group's only other
    dataset that is not a dimension vector (Prismatic names it
    ``datacube``); ``None`` when there is none, or several.
    """
    import re

    import h5py

    if group.get("data", getclass=True) is h5py.Dataset:
        return "data"
    others = [
        name
        for name in group
        if group.get(name, getclass=True) is h5py.Dataset and not re.fullmatch(r"dim\d+", name)
    ]
    return others[0] if len(others) == 1 else None


def find_emd_arrays(h5file: Any, *, limit: int | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """Return ``(group path, data shape)`` of every EMD array group of an open HDF5 file.

    Parameters
    ----------
    h5file
        An open ``h5py.File``.
    limit
        Stop after visiting this many groups (for sniffing); ``None`` for all.

    Returns
    -------
    list of (str, tuple of int)
        The array groups holding a ``data`` dataset, in visiting order.
    """
    import h5py

    found: list[tuple[str, tuple[int, ...]]] = []
    seen = [0]

    def visit(name: str | bytes, obj: Any) -> bool | None:
        if isinstance(obj, h5py.Group):
            seen[0] += 1
            if limit is not None and seen[0] > limit:
                return True  # stop visiting
            dataset = array_dataset_name(obj) if _is_array_group(obj) else None
            if dataset is not None:
                found.append(("/" + link_name(name), tuple(int(s) for s in obj[dataset].shape)))
        return None

    h5file.visititems(visit)
    return found


def sniff(path: Path, head: bytes) -> bool:
    """An HDF5 file with an EMD array group (``emd_group_type`` 1) holding a 4-D ``data``."""
    from .sniffers import hdf5_structure

    return hdf5_structure(path, head, _emd_4d)


def _emd_4d(f: Any) -> bool:
    marked = "emd_group_type" in f.attrs or "version_major" in f.attrs
    if not marked and not any("emd_group_type" in f[k].attrs for k in list(f)[:64]):
        return False
    return any(len(s) == 4 for _, s in find_emd_arrays(f, limit=_SNIFF_GROUPS))


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, np.ndarray) and value.size == 1:
        return _text(value.reshape(-1)[0])
    if isinstance(value, np.generic):
        return _text(value.item())
    return "" if value is None else str(value)


class EmdSource(Hdf5Source):
    """The 4-D array (py4DSTEM ``DataCube``) of an EMD 1.0 file.

    Parameters
    ----------
    path
        The EMD file.
    dataset_path
        The array group (``"/experiment/datacube"``) or its ``data``
        dataset; ``None`` for the file's only EMD array with 4-D data.
    """

    format: ClassVar[str] = "emd"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dataset_path: str | None = None,
        scan_shape: Sequence[int] | str | None = None,
    ):
        import h5py

        p = check_exists(path, what="EMD file")
        with open_h5(p) as f:
            arrays = find_emd_arrays(f)
            listing = ", ".join(f"{g!r} {s}" for g, s in arrays) or "none"
            if dataset_path is None:
                four = [g for g, s in arrays if len(s) == 4]
                if len(four) != 1:
                    raise DatasetPathError(
                        f"{str(p)!r} holds {len(four)} EMD arrays with 4-D data (EMD arrays: "
                        f"{listing}); expected exactly one. Pass dataset_path= the array group "
                        "to read"
                    )
                group_path = four[0]
                self._group_from = "the file's only EMD array with 4-D data"
            else:
                group_path = dataset_path.rstrip("/")
                if isinstance(f.get(group_path), h5py.Dataset):  # the array's dataset itself
                    group_path = group_path.rsplit("/", 1)[0] or "/"
                self._group_from = "given (dataset_path=)"
            group = f.get(group_path)
            if not isinstance(group, h5py.Group) or not _is_array_group(group):
                raise DatasetPathError(
                    f"{group_path!r} in {str(p)!r} is not an EMD array group (a group with "
                    f"emd_group_type 1 holding 'data'); EMD arrays in the file: {listing}"
                )
            name = array_dataset_name(group)
            data = group.get(name) if name is not None else None
            if not isinstance(data, h5py.Dataset) or data.ndim != 4:
                shape = getattr(data, "shape", None)
                raise FormatError(
                    f"the EMD array {group_path!r} of {str(p)!r} holds data of shape {shape}; "
                    "expected a 4-D (R_r, R_c, k_r, k_c) datacube"
                )
            assert name is not None
            self._array_name = name
            self._dims = self._read_dims(group, group_path, p, tuple(data.shape))
            self._group_attrs = read_attributes(group)
            self._file_attrs = read_attributes(f)
        self._group_path = group_path
        super().__init__(
            p, dataset_path=f"{group_path.rstrip('/')}/{self._array_name}", scan_shape=scan_shape
        )

    @staticmethod
    def _read_dims(
        group: Any, where: str, path: Path, shape: tuple[int, ...]
    ) -> list[dict[str, Any]] | None:
        """The dimension vectors (first two values, name, units), or ``None`` when absent."""
        import h5py

        base = 0 if "dim0" in group else 1
        dims: list[dict[str, Any]] = []
        for axis in range(4):
            name = f"dim{axis + base}"
            vec = group.get(name)
            if vec is None:
                return None
            if not isinstance(vec, h5py.Dataset) or vec.dtype.kind not in "uif":
                what = getattr(vec, "dtype", type(vec).__name__)
                raise FormatError(
                    f"the EMD array {where!r} of {str(path)!r}: dimension vector {name!r} is "
                    f"{what}; expected a numeric dataset (the file is damaged, or not EMD 1.0)"
                )
            values = np.asarray(vec[: min(2, len(vec))] if vec.ndim else vec[()], dtype=float)
            values = values.reshape(-1)
            if vec.ndim and len(vec) not in (1, 2, shape[axis]):
                raise FormatError(
                    f"the EMD array {where!r} of {str(path)!r}: dimension vector {name!r} holds "
                    f"{len(vec)} values for an axis of length {shape[axis]}; expected 2 (a "
                    "linear axis) or the axis length"
                )
            dims.append(
                {
                    "dataset": name,
                    "name": _text(read_attribute(vec, "name")),
                    "units": _text(read_attribute(vec, "units")).strip(),
                    "first": float(values[0]) if values.size else None,
                    "step": float(values[1] - values[0]) if values.size >= 2 else None,
                }
            )
        return dims

    def _file_calibration(self) -> tuple[Calibration | None, list[str], list[str]]:
        used: list[str] = []
        notes: list[str] = []
        if self._dims is None:
            return None, used, notes
        kwargs: dict[str, Any] = {}
        for kind, axes in (("scan", self._dims[:2]), ("detector", self._dims[2:])):
            units = {d["units"] for d in axes}
            steps = [d["step"] for d in axes]
            if len(units) != 1 or any(s is None or not np.isfinite(s) or s <= 0 for s in steps):
                notes.append(
                    f"the EMD {kind} dimension vectors {[d['dataset'] for d in axes]} give units "
                    f"{sorted(units)} and steps {steps}; one unit and positive steps are needed, "
                    f"so the {kind} was left uncalibrated"
                )
                continue
            unit = units.pop().strip()
            if unit.startswith("[") and unit.endswith("]"):  # "[Å]", "[mrad]"
                unit = unit[1:-1].strip()
            factor = 1.0
            if kind == "detector" and unit.lower() in _RECIPROCAL_NM:
                unit, factor = "1/Å", 0.1
            try:
                canonical = normalize_units(unit, kind=kind)
            except UnitsError:
                notes.append(
                    f"the EMD {kind} dimension vectors have units {unit!r}, which is not a "
                    f"{kind} unit this project knows; the {kind} was left uncalibrated"
                )
                continue
            if canonical == "px":
                continue
            kwargs[f"{kind}_sampling"] = (steps[0] * factor, steps[1] * factor)
            kwargs[f"{kind}_units"] = canonical
            used.append(f"{kind} step {steps[0]:g} x {steps[1]:g} {unit}")
            firsts = [d["first"] for d in axes]
            finite = all(v is not None and np.isfinite(v) for v in firsts)
            if kind == "detector" and finite and any(v != 0 for v in firsts):
                origin = (-firsts[0] / steps[0], -firsts[1] / steps[1])
                kwargs["detector_origin"] = origin
                used.append(f"optical axis at pixel ({origin[0]:g}, {origin[1]:g})")
        drop_unusable_samplings(kwargs, used, notes, "the EMD dimension vectors")
        if not kwargs:
            return None, used, notes
        return Calibration(**kwargs), used, notes

    def _calibration_choice(self) -> tuple[Calibration | None, str | None]:
        return calibration_choice(
            self._path,
            lambda: described_calibration(
                self._file_calibration(), f"EMD dimension vectors of {self._group_path!r}"
            ),
        )

    @property
    def calibration(self) -> Calibration | None:
        """A JSON sidecar's calibration, else the one the dimension vectors record."""
        return self._calibration_choice()[0]

    @property
    def notes(self) -> list[str]:
        """Explicit choices made while opening."""
        named = (
            []
            if self._array_name == "data"
            else [
                f"the EMD array {self._group_path!r} holds its values in {self._array_name!r} "
                "(as Prismatic writes), not 'data'; read with its dimension vectors"
            ]
        )
        return [*super().notes, *named, *self._file_calibration()[2]]

    @property
    def metadata(self) -> dict[str, Any]:
        """The HDF5 layout, the EMD array group, its dimension vectors and attributes."""
        return {
            **super().metadata,
            "emd_group": self._group_path,
            "emd_group_from": self._group_from,
            "emd_group_attributes": self._group_attrs,
            "emd_file_attributes": self._file_attrs,
            "dims": self._dims,
            "calibration_from": self._calibration_choice()[1],
        }
