"""An independent writer of LiberTEM's ``raw_csr`` layout (from its documented descriptor).

It writes what the layout's description says, with NumPy alone, never through
the reader: a TOML descriptor (``[params]`` filetype, nav_shape, sig_shape;
``[raw_csr]`` the three files and their dtypes) and three headerless files.
``messy=True`` stores each frame's entries in a random order, splits some
values over repeated pixels and adds stored zeros: all legal CSR a reader
must read back as the same frames.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_raw_csr(
    folder: Path,
    frames: np.ndarray,
    *,
    nav_shape: tuple[int, int],
    name: str = "scan",
    indptr_dtype: str = "<i8",
    indices_dtype: str = "<u4",
    data_dtype: str | None = None,
    messy: bool = False,
    rng: np.random.Generator | None = None,
    filetype: str = "raw_csr",
) -> Path:
    """Write ``frames`` (``(n, k_r, k_c)``) and return the descriptor's path."""
    rng = rng or np.random.default_rng(0)
    n, kr, kc = frames.shape
    flat = frames.reshape(n, kr * kc)
    ptr = [0]
    idx: list[np.ndarray] = []
    val: list[np.ndarray] = []
    for f in range(n):
        where = np.flatnonzero(flat[f])
        values = flat[f][where]
        if messy and where.size:
            # split the first value into two entries of the same pixel, add a stored zero,
            # then shuffle the frame's entries
            if values.dtype.kind in "ui" and values[0] > 1:
                half = values[0] // 2
                where = np.concatenate([where, where[:1]])
                values = np.concatenate([values, [values[0] - half]])
                values[0] = half
            where = np.concatenate([where, [int(rng.integers(0, kr * kc))]])
            values = np.concatenate([values, np.zeros(1, dtype=values.dtype)])
            order = rng.permutation(where.size)
            where, values = where[order], values[order]
        idx.append(where)
        val.append(values)
        ptr.append(ptr[-1] + where.size)
    dtype = np.dtype(data_dtype or frames.dtype.newbyteorder("<").str)
    np.asarray(ptr, dtype=indptr_dtype).tofile(folder / f"{name}_indptr.raw")
    np.concatenate(idx).astype(indices_dtype).tofile(folder / f"{name}_indices.raw")
    np.concatenate(val).astype(dtype).tofile(folder / f"{name}_values.raw")
    toml = folder / f"{name}.toml"
    toml.write_text(
        "[params]\n"
        f'filetype = "{filetype}"\n'
        f"nav_shape = [{nav_shape[0]}, {nav_shape[1]}]\n"
        f"sig_shape = [{kr}, {kc}]\n\n"
        f"[{filetype}]\n"
        f'indptr_file = "{name}_indptr.raw"\n'
        f'indptr_dtype = "{np.dtype(indptr_dtype).str}"\n'
        f'indices_file = "{name}_indices.raw"\n'
        f'indices_dtype = "{np.dtype(indices_dtype).str}"\n'
        f'data_file = "{name}_values.raw"\n'
        f'data_dtype = "{dtype.str}"\n'
    )
    return toml
