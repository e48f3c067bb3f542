"""NeXus ``NXdata`` and HDF5 dimension scales on results, so other tools read them alone.

A results group (:mod:`quantem_flow.io.results_store`) becomes an ``NXdata``
group in the conventions h5web, silx and NeXpy read:

* the group: ``NX_class = "NXdata"``, ``signal = "data"``, ``axes`` (one name
  per dimension, ``"."`` for a dimension without a numeric axis, such as a
  vector field's component) and ``AXISNAME_indices``;
* one 1-D dataset per calibrated axis beside ``data``, holding the
  coordinate of every sample, with ``units`` and ``long_name``;
* ``data``: ``units``, ``long_name`` and, for a 2-D image,
  ``interpretation = "image"``; in HDF5 its dimensions are labelled and the
  axis datasets are attached as dimension scales;
* the file's root: ``default`` names the first result, so a viewer opens
  it first.

Zarr stores get the same attributes, and each array names its dimensions
(``dimension_names``, which xarray reads), so ``xarray.open_zarr(store,
group=name)`` finds the coordinates.  Units are written as the results hold them
(``px`` for uncalibrated pixels, ``Å``, ``mrad``, ``1/Å``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..calibration import Axis

__all__ = [
    "axis_names",
    "measured_from",
    "nxdata_attrs",
    "write_hdf5_axes",
    "write_zarr_data",
]

#: Names a result group already uses: an axis cannot take them.
_RESERVED = frozenset({"data"})


def _numeric(axis: Axis) -> bool:
    """Whether the axis has numeric coordinates (not a list of components)."""
    return axis.name != "component" and "," not in axis.units


def axis_names(axes: Sequence[Axis]) -> list[str]:
    """One dataset name per dimension, ``"."`` where the dimension has no numeric axis."""
    names: list[str] = []
    for i, axis in enumerate(axes):
        if not _numeric(axis):
            names.append(".")
            continue
        name = axis.name if axis.name and axis.name not in _RESERVED else f"axis{i}"
        if name in names:
            name = f"{name}_{i}"
        names.append(name)
    return names


def _long_name(axis: Axis, measured_from: str) -> str:
    label = axis.name.replace("_", " ")
    if axis.name.startswith("k_") and measured_from:
        return f"{label} ({axis.units} from {measured_from})"
    return f"{label} ({axis.units})"


def measured_from(parameters: dict[str, Any]) -> str:
    """What a pattern's detector axes are measured from, by its ``axes_origin`` record."""
    record = parameters.get("axes_origin")
    if not isinstance(record, dict) or record.get("px") is None:
        return ""
    source = str(record.get("from", ""))
    return "the detector corner" if source.startswith("the detector corner") else "the beam centre"


def nxdata_attrs(axes: Sequence[Axis], names: Sequence[str]) -> dict[str, Any]:
    """The ``NXdata`` group attributes for a result with these axes."""
    attrs: dict[str, Any] = {"NX_class": "NXdata", "signal": "data", "axes": list(names)}
    for i, name in enumerate(names):
        if name != ".":
            attrs[f"{name}_indices"] = i
    return attrs


def _data_attrs(name: str, units: str, ndim: int) -> dict[str, Any]:
    attrs: dict[str, Any] = {"units": units, "long_name": f"{name} ({units})"}
    if ndim == 2:
        attrs["interpretation"] = "image"
    return attrs


def write_hdf5_axes(
    group: Any,
    data: Any,
    *,
    name: str,
    units: str,
    axes: Sequence[Axis],
    origin_from: str = "",
) -> None:
    """Make an HDF5 results group an ``NXdata`` group with dimension scales.

    Parameters
    ----------
    group
        The ``h5py.Group`` holding ``data``.
    data
        Its ``h5py.Dataset``.
    name, units
        The result's name and value units.
    axes
        The result's axes, one per dimension of ``data``.
    origin_from
        What detector axes are measured from (:func:`measured_from`), or ``""``.
    """
    names = axis_names(axes)
    for key, value in nxdata_attrs(axes, names).items():
        group.attrs[key] = value
    for key, value in _data_attrs(name, units, data.ndim).items():
        data.attrs[key] = value
    for i, (axis, axis_name) in enumerate(zip(axes, names, strict=True)):
        data.dims[i].label = axis.name
        if axis_name == ".":
            continue
        coords = group.create_dataset(axis_name, data=np.asarray(axis.coordinates(), np.float64))
        coords.attrs["units"] = axis.units
        coords.attrs["long_name"] = _long_name(axis, origin_from)
        coords.make_scale(axis.name)
        data.dims[i].attach_scale(coords)


def write_zarr_data(
    group: Any,
    data: np.ndarray,
    *,
    name: str,
    units: str,
    axes: Sequence[Axis],
    origin_from: str = "",
) -> Any:
    """Write ``data`` into a Zarr results group with the same attributes, and its axes.

    Each array names its dimensions (Zarr v3 ``dimension_names``, which
    xarray reads), so ``xarray.open_zarr(store, group=name)`` gives the
    result with its coordinates.

    Returns
    -------
    zarr.Array
        The ``data`` array.
    """
    names = axis_names(axes)
    dims = [
        n if n != "." else (axis.name or f"dim{i}")
        for i, (n, axis) in enumerate(zip(names, axes, strict=True))
    ]
    array = group.create_array("data", data=data, dimension_names=dims)
    group.attrs.update(nxdata_attrs(axes, names))
    array.attrs.update(_data_attrs(name, units, len(axes)))
    for axis, axis_name in zip(axes, names, strict=True):
        if axis_name == ".":
            continue
        coords = group.create_array(
            axis_name,
            data=np.asarray(axis.coordinates(), np.float64),
            dimension_names=[axis_name],
        )
        coords.attrs.update({"units": axis.units, "long_name": _long_name(axis, origin_from)})
    return array
