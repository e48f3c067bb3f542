"""EMD 1.0 files as py4DSTEM / ``emdfile`` write them, from the documented layout.

Independent of :mod:`quantem_flow.io.emd`: h5py only.  The file carries
``emd_group_type = "file"`` and ``version_major``/``version_minor``; a root
group (``emd_group_type = "root"``) holds the datacube, an array group
(``emd_group_type = 1``, ``python_class = "DataCube"``) with ``data`` and the
dimension vectors ``dim0``..``dim3`` (a linear vector stored as its first two
values), each with ``name`` and ``units``; and a metadata group
(``emd_group_type = 0``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["write_emd"]


def write_emd(
    path: Path,
    data: np.ndarray,
    *,
    group: str = "experiment/datacube",
    r_step: float = 0.8,
    r_units: str = "A",
    q_step: float = 0.05,
    q_units: str = "A^-1",
    q_first: tuple[float, float] = (0.0, 0.0),
    full_dims: bool = False,
    one_based: bool = False,
    group_type: Any = 1,
    extra_arrays: dict[str, np.ndarray] | None = None,
    chunks: tuple[int, ...] | None = None,
    array_name: str = "data",
) -> Path:
    """Write a 4-D ``(R_r, R_c, k_r, k_c)`` array as an EMD 1.0 datacube.

    ``full_dims`` writes whole dimension vectors instead of two values,
    ``one_based`` names them ``dim1``..``dim4`` (EMD 0.2), ``group_type``
    is the array's ``emd_group_type`` and ``extra_arrays`` adds more array
    groups (name -> data) under the root.  ``array_name`` names the dataset
    holding the datacube (Prismatic writes ``datacube``).
    """
    import h5py

    data = np.asarray(data)
    with h5py.File(path, "w") as f:
        f.attrs["emd_group_type"] = "file"
        f.attrs["version_major"] = 1
        f.attrs["version_minor"] = 0
        f.attrs["authoring_program"] = "tests.io.writers_emd"
        root_name = group.split("/")[0]
        root = f.create_group(root_name)
        root.attrs["emd_group_type"] = "root"
        root.attrs["python_class"] = "Root"
        md = root.create_group("_metadata")
        cal = md.create_group("calibration")
        cal.attrs["emd_group_type"] = 0
        cal.attrs["python_class"] = "Calibration"
        cal.create_dataset("R_pixel_size", data=r_step)
        cal.create_dataset("Q_pixel_size", data=q_step)

        def array(name: str, values: np.ndarray, dims: list[tuple[str, float, float, str]]) -> None:
            g = f.create_group(name)
            g.attrs["emd_group_type"] = group_type
            g.attrs["python_class"] = "DataCube"
            d = g.create_dataset(array_name, data=values, chunks=chunks)
            d.attrs["units"] = "pixel intensity"
            for axis, (dname, first, step, units) in enumerate(dims):
                n = values.shape[axis]
                vec = first + step * np.arange(n if full_dims else 2)
                v = g.create_dataset(f"dim{axis + (1 if one_based else 0)}", data=vec)
                v.attrs["name"] = dname
                v.attrs["units"] = units

        dims = [
            ("Rx", 0.0, r_step, r_units),
            ("Ry", 0.0, r_step * 1.5, r_units),
            ("Qx", q_first[0], q_step, q_units),
            ("Qy", q_first[1], q_step * 2, q_units),
        ]
        array(group, data, dims)
        for name, values in (extra_arrays or {}).items():
            pix = [(f"dim{i}", 0.0, 1.0, "pixels") for i in range(values.ndim)]
            array(f"{root_name}/{name}", values, pix)
    return path
