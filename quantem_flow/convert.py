"""Lossless conversion of a 4D-STEM dataset to a compressed Zarr v3 store or a counted file.

``convert(ds, "scan.zarr", codec="bitshuffle-lz4")`` (a Zarr store, chosen by
the ``.zarr`` name) or ``convert(ds, "scan.h5", to="counted")`` writes the dataset (with
any regions and binning it carries) chunk by chunk, never holding more
than one block of scan rows in memory:

- **zarr**: one 4-D array ``(R_r, R_c, k_r, k_c)`` at the store's root, in
  the dataset's dtype, chunked by whole frames along the scan so that a
  block of scan rows maps onto whole stored chunks (``N`` frames per chunk:
  ``(1, N, k_r, k_c)`` when ``N <= R_c``, else ``(N // R_c, R_c, k_r, k_c)``).
  Codecs are the Zarr v3 core codecs, readable by any Zarr v3
  implementation: ``bytes`` (little endian), then ``zstd`` for ``zstd``, or
  ``blosc`` for ``lz4`` (no shuffle), ``bitshuffle-lz4`` and
  ``bitshuffle-zstd``, then ``crc32c``, a checksum of every stored chunk so
  that a damaged chunk is detected on reading (LZ4 alone cannot tell).
  Every chunk is written, empty or not (so that ``-0.0`` stays ``-0.0``).
  The store is the input of native ``encoded`` reads
  (:meth:`~quantem_flow.io.zarr_store.ZarrSource.read_payload`).
- **counted**: an electron-counted file
  (:func:`quantem_flow.io.counted.write_counted`).

Exactness (zarr): after each block is written, its stored chunk files are
read back as they lie in the store and decoded by the same decoder the
``encoded`` kernels use, and compared byte for byte with the block that was
written; any difference raises :class:`~quantem_flow.errors.ConversionError`
and nothing is left at the output path.  The store is written to
``<output>.partial`` and renamed when complete and verified.

The array's attribute ``quantem_flow`` holds the calibration (read back by
:class:`~quantem_flow.io.zarr_store.ZarrSource`), the axes, and the
provenance of the conversion (source identity and transforms, codecs,
chunking, the exactness check, sizes and compression ratio, versions).
"""

from __future__ import annotations

import datetime
import os
import shutil
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .dataset import Dataset4D
from .errors import ConversionError, ParameterError

__all__ = ["CONVERT_CODECS", "CONVERT_TARGETS", "convert", "output_kind", "zarr_codecs"]

#: ``to=`` targets.
CONVERT_TARGETS = ("zarr", "counted")
#: ``codec=`` choices for Zarr stores.
CONVERT_CODECS = ("bitshuffle-lz4", "bitshuffle-zstd", "zstd", "lz4")

#: Decoded bytes per stored chunk ``convert`` aims for when
#: ``frames_per_chunk`` is not given (whole frames, at least one).
DEFAULT_CHUNK_BYTES = 2**20
#: Decoded bytes of one block of scan rows written at a time.
WRITE_BLOCK_BYTES = 64 * 2**20


def zarr_codecs(codec: str, dtype: np.dtype[Any], level: int | None = None) -> list[Any]:
    """Return the Zarr v3 bytes-to-bytes codecs of a ``convert`` codec name.

    Parameters
    ----------
    codec
        One of :data:`CONVERT_CODECS`.
    dtype
        The array's dtype (the blosc type size).
    level
        ``zstd``: Zstandard level (default 3, -131072..22); blosc codecs
        (``lz4``, ``bitshuffle-lz4``, ``bitshuffle-zstd``): blosc ``clevel``
        0-9 (default 5 for LZ4, 3 for Zstandard).

    Returns
    -------
    list
        The compressor then a CRC-32C checksum.
    """
    from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

    if codec not in CONVERT_CODECS:
        raise ParameterError(f"unknown codec {codec!r}; expected one of {list(CONVERT_CODECS)}")
    if codec == "zstd":
        lvl = 3 if level is None else int(level)
        if not -131072 <= lvl <= 22:
            raise ParameterError(f"zstd level must be in [-131072, 22], got {lvl}")
        return [ZstdCodec(level=lvl, checksum=False), Crc32cCodec()]
    cname: Literal["zstd", "lz4"] = "zstd" if codec == "bitshuffle-zstd" else "lz4"
    clevel = (3 if cname == "zstd" else 5) if level is None else int(level)
    if not 0 <= clevel <= 9:
        raise ParameterError(
            f"--level for the blosc codec {codec!r} is blosc's clevel, 0-9; got {clevel}"
        )
    shuffle: Literal["noshuffle", "bitshuffle"] = "noshuffle" if codec == "lz4" else "bitshuffle"
    blosc = BloscCodec(
        cname=cname, clevel=clevel, shuffle=shuffle, typesize=np.dtype(dtype).itemsize
    )
    return [blosc, Crc32cCodec()]


_HDF5_SUFFIXES = (".h5", ".hdf5")


def output_kind(output_path: str | os.PathLike[str], *, to: str | None = None) -> str:
    """Return what ``convert`` writes at a path: ``"zarr"`` or ``"counted"``.

    Without ``to`` the kind follows the name: ``.zarr`` (or an existing
    directory) is a Zarr v3 store; anything else is refused rather than
    guessed, because the two kinds differ a lot in size (a counted file
    stores one event per count, which is large for dense frames).  With
    ``to``, a name that says the other kind is refused too (a Zarr store is
    a directory; a counted file is HDF5).

    Parameters
    ----------
    output_path
        The output to write.
    to
        ``"zarr"``, ``"counted"`` or ``None`` (from the name).

    Returns
    -------
    str
        ``"zarr"`` or ``"counted"``.

    Raises
    ------
    ParameterError
        For an unknown ``to``, a name that does not say the kind without
        ``to``, or one that contradicts ``to``.
    """
    path = Path(output_path).expanduser()
    name = path.name.rstrip("/").lower()
    if to is not None and to not in CONVERT_TARGETS:
        raise ParameterError(f"to must be one of {list(CONVERT_TARGETS)}, got {to!r}")
    if to is None:
        if name.endswith(".zarr") or path.is_dir():
            return "zarr"
        if name.endswith(_HDF5_SUFFIXES):
            raise ParameterError(
                f"{str(path)!r} names an HDF5 file, but convert writes HDF5 only as an "
                "electron-counted file (one event per count: compact for sparse counted "
                "frames, several times larger than the input for dense ones); pass "
                "to='counted' for that, or name the output .zarr for a "
                "compressed Zarr v3 store (any data, lossless)"
            )
        raise ParameterError(
            f"cannot tell what to write from the name {str(path)!r}; name it .zarr for a "
            "compressed Zarr v3 store, or pass to='zarr' or to='counted'"
        )
    if to == "zarr" and name.endswith(_HDF5_SUFFIXES):
        raise ParameterError(
            f"to='zarr' writes a Zarr v3 store, a directory, but the output {str(path)!r} is "
            "named like an HDF5 file; name it .zarr, or pass to='counted' for an "
            "electron-counted HDF5 file"
        )
    if to == "counted" and name.endswith(".zarr"):
        raise ParameterError(
            f"to='counted' writes an electron-counted HDF5 file, but the output "
            f"{str(path)!r} is named like a Zarr store; name it .h5, or pass to='zarr'"
        )
    return to


def _chunk_shape(
    scan_shape: tuple[int, int], frame_shape: tuple[int, int], itemsize: int, per: int | None
) -> tuple[int, int, int, int]:
    R, C = scan_shape
    kr, kc = frame_shape
    if per is None:
        per = max(1, DEFAULT_CHUNK_BYTES // max(kr * kc * itemsize, 1))
    if per < 1:
        raise ParameterError(f"frames_per_chunk must be >= 1, got {per}")
    if per <= C:
        return (1, per, kr, kc)
    return (min(R, per // C), C, kr, kc)


def _open_input(input_dataset: Any, options: dict[str, Any]) -> Dataset4D:
    if isinstance(input_dataset, Dataset4D):
        if options:
            raise ParameterError(
                f"reader options {sorted(options)} apply only when the input is a path; the "
                "dataset given is already open"
            )
        return input_dataset
    from .dataset import open as open_dataset

    opts = {k: v for k, v in options.items() if v is not None}
    return open_dataset(input_dataset, **opts)


def _prepare_output(out: Path, overwrite: bool) -> None:
    if not out.exists():
        return
    if not overwrite:
        raise FileExistsError(
            f"{str(out)!r} exists; pass overwrite=True (--overwrite) to replace it, or choose "
            "another output path"
        )
    if out.is_dir() and not (out / "zarr.json").is_file() and any(out.iterdir()):
        raise ParameterError(
            f"{str(out)!r} is a non-empty directory that is not a Zarr store; refusing to "
            "replace it even with overwrite=True; remove it yourself or choose another path"
        )


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def convert(
    input_dataset: Dataset4D | str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    *,
    to: str | None = None,
    codec: str = "bitshuffle-lz4",
    level: int | None = None,
    frames_per_chunk: int | None = None,
    overwrite: bool = False,
    **open_options: Any,
) -> Path:
    """Write a dataset losslessly to a compressed Zarr v3 store or a counted file.

    Parameters
    ----------
    input_dataset
        An open :class:`~quantem_flow.dataset.Dataset4D` (its regions and
        binning are applied and recorded), or a path opened with
        ``open_options``.
    output_path
        The Zarr store (a directory) or counted ``.h5`` file to write.
    to
        ``"zarr"`` or ``"counted"``; ``None`` chooses by the name (``.zarr``:
        a Zarr store) and refuses any other name (see :func:`output_kind`).
    codec, level
        Zarr codec (:data:`CONVERT_CODECS`) and level (see
        :func:`zarr_codecs`); not used for ``counted``.
    frames_per_chunk
        Frames per stored Zarr chunk (default: whole frames filling ~1 MiB).
    overwrite
        Replace an existing output.
    **open_options
        ``format=``, ``dataset_path=``, ``scan_shape=``... when
        ``input_dataset`` is a path.

    Returns
    -------
    Path
        The output written.

    Raises
    ------
    ParameterError
        The output's name does not say what to write and ``to`` is not
        given, or it contradicts ``to`` (see :func:`output_kind`).
    FileExistsError
        The output exists and ``overwrite`` is false.
    ConversionError
        A stored chunk read back differs from what was written.
    """
    to = output_kind(output_path, to=to)
    ds = _open_input(input_dataset, open_options)
    out = Path(output_path).expanduser().absolute()
    if to == "counted":
        if codec != "bitshuffle-lz4" or level is not None or frames_per_chunk is not None:
            raise ParameterError(
                "codec, level and frames_per_chunk apply to Zarr stores only; a counted file "
                "stores electron events"
            )
        from .io.counted import write_counted

        return write_counted(ds, out, overwrite=overwrite)
    return _convert_zarr(
        ds, out, codec=codec, level=level, per=frames_per_chunk, overwrite=overwrite
    )


def _convert_zarr(
    ds: Dataset4D, out: Path, *, codec: str, level: int | None, per: int | None, overwrite: bool
) -> Path:
    import zarr

    from . import __version__
    from .io.base import path_size
    from .io.zarr_store import ZarrSource
    from .provenance import package_versions
    from .representations.encoded import Encoded

    _prepare_output(out, overwrite)
    R, C, kr, kc = ds.shape
    dtype = np.dtype(ds.dtype)
    compressors = zarr_codecs(codec, dtype, level)
    chunks = _chunk_shape((R, C), (kr, kc), dtype.itemsize, per)
    partial = out.with_name(out.name + ".partial")
    _remove(partial)
    started = datetime.datetime.now(datetime.UTC)
    try:
        arr = zarr.create_array(
            str(partial),
            shape=(R, C, kr, kc),
            chunks=chunks,
            dtype=dtype,
            compressors=compressors,
            fill_value=0,
            zarr_format=3,
            config={"write_empty_chunks": True},
        )
        reader = ZarrSource(partial)
        rep = Encoded()
        row_bytes = C * kr * kc * dtype.itemsize
        step = chunks[0] * max(1, WRITE_BLOCK_BYTES // max(chunks[0] * row_bytes, 1))
        n_chunks = 0
        for r0 in range(0, R, step):
            r1 = min(R, r0 + step)
            block = np.ascontiguousarray(ds.load_block((r0, r1)), dtype=dtype)
            arr[r0:r1] = block
            payload = reader.read_payload("encoded", (r0, r1), (0, C))
            back = rep.to_dense(payload)
            if back.shape != block.shape or back.tobytes() != block.tobytes():
                bad = int(np.count_nonzero(back != block)) if back.shape == block.shape else -1
                raise ConversionError(
                    f"scan rows [{r0}, {r1}) read back from the stored chunks of "
                    f"{str(partial)!r} differ from what was written ({bad} values differ); "
                    "the store was removed"
                )
            n_chunks += payload.n_pieces
        stored = path_size(partial)
        provenance = {
            "converted_by": "quantem_flow.convert",
            "quantem_flow_version": __version__,
            "versions": package_versions(),
            "created_utc": started.isoformat(),
            "source": ds.source.identity.to_dict(),
            "source_format": ds.source.format,
            "source_shape": list(ds.source.shape),
            "source_dtype": str(ds.source.dtype),
            "transforms": ds.transforms,
            "flags": ds.flags,
            "notes": ds.notes,
            "codec": codec,
            "level": level,
            "frames_per_chunk": chunks[0] * chunks[1],
            "chunks": list(chunks),
            "zarr_codecs": [c.to_dict() for c in compressors],
            "exactness": {
                "check": "every stored chunk read back from the store after writing, decoded "
                "and compared byte for byte with the data written",
                "chunks_verified": n_chunks,
                "frames_verified": R * C,
            },
            "dense_bytes": ds.nbytes,
            "stored_bytes": stored,
            "compression_ratio": ds.nbytes / stored if stored else None,
        }
        record: Any = {
            "axes": ["R_r", "R_c", "k_r", "k_c"],
            "calibration": ds.calibration.to_dict(),
            "provenance": provenance,
        }
        arr.attrs["quantem_flow"] = record
        if out.exists():
            _remove(out)
        partial.rename(out)
    except BaseException:
        _remove(partial)
        raise
    return out
