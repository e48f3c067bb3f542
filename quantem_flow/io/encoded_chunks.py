"""Native ``encoded`` reads: stored compressed chunks taken as they are, without decoding.

The HDF5 readers (:mod:`~quantem_flow.io.hdf5`, :mod:`~quantem_flow.io.dectris`)
read chunks with ``dset.id.read_direct_chunk`` (no HDF5 filter pipeline); the
Zarr reader reads the chunk files of a v3 directory store named by the
array's chunk key encoding.  This module holds what they share: which
stored layouts can be read natively (and why not), and the mapping of a
scan block onto stored chunks as *runs* ``(piece, first frame, frames)``.

Column sub-ranges are supported: a stored chunk holding frames outside the
block is still read whole (it is the unit of storage) and the frames not
needed are skipped by the runs.  A chunk shared by two scan blocks is held
by both payloads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from ..errors import UnsupportedOperationError

__all__ = [
    "BITSHUFFLE_FILTER_ID",
    "HDF5_FILTER_NAMES",
    "PieceTable",
    "check_bitshuffle_chunks",
    "flat_frame_ranges",
    "flat_runs",
    "grid_runs",
    "hdf5_codec",
    "needs_bitshuffle_guard",
    "zarr_codec",
]

#: Names of the HDF5 filters most often met, for messages.
HDF5_FILTER_NAMES: dict[int, str] = {
    1: "deflate (gzip)",
    2: "shuffle",
    3: "fletcher32",
    4: "szip",
    5: "nbit",
    6: "scaleoffset",
    307: "bzip2",
    32000: "LZF",
    32001: "Blosc",
    32004: "LZ4",
    32008: "bitshuffle",
    32013: "zfp",
    32015: "Zstandard",
    32017: "SZ",
    32026: "Blosc2",
}

_CONVERT_HINT = (
    "convert it with `quantem-flow convert INPUT OUTPUT.zarr --codec bitshuffle-lz4` (or "
    "ds.to_representation('encoded') re-encodes each chunk from dense, exact and checked)"
)


def _filter_text(f: dict[str, Any]) -> str:
    fid = int(f["id"])
    name = HDF5_FILTER_NAMES.get(fid) or str(f.get("name", "")).split(";")[0] or "unknown"
    return f"{name} (id {fid}, parameters {list(f.get('values', []))})"


def hdf5_codec(
    layout: dict[str, Any], frame_shape: tuple[int, int], ndim: int, where: str
) -> tuple[str, dict[str, Any]]:
    """Return the payload codec of an HDF5 dataset's stored chunks, or raise why none.

    Parameters
    ----------
    layout
        :func:`~quantem_flow.io.hdf5.dataset_filters` of the dataset.
    frame_shape
        ``(k_r, k_c)``.
    ndim
        3 (frames) or 4 (scan rows, scan columns).
    where
        The dataset and file, for messages.

    Returns
    -------
    tuple
        Codec name and configuration of the
        :class:`~quantem_flow.representations.encoded.EncodedPayload`.

    Raises
    ------
    UnsupportedOperationError
        If the dataset is not chunked by whole frames, or its filter
        pipeline is not bitshuffle + LZ4/Zstandard (filter 32008),
        Zstandard (32015) or deflate (1) alone.
    """
    chunks = layout.get("chunks")
    if not chunks:
        raise UnsupportedOperationError(
            f"{where} is stored contiguously (not chunked), so it has no compressed chunks to "
            f"keep; {_CONVERT_HINT}"
        )
    if tuple(int(c) for c in chunks[-2:]) != tuple(frame_shape):
        raise UnsupportedOperationError(
            f"{where} is chunked {tuple(chunks)}, which splits frames of {frame_shape}; native "
            f"encoded reads need chunks holding whole frames; {_CONVERT_HINT}"
        )
    filters = list(layout.get("filters", []))
    if len(filters) != 1:
        what = (
            "no compression filter"
            if not filters
            else "the filter pipeline " + " + ".join(_filter_text(f) for f in filters)
        )
        raise UnsupportedOperationError(
            f"{where} has {what}; native encoded reads take bitshuffle + LZ4 or Zstandard "
            f"(filter 32008), Zstandard (32015) or deflate (1) alone; {_CONVERT_HINT}"
        )
    f = filters[0]
    fid = int(f["id"])
    values = [int(v) for v in f.get("values", [])]
    base = {"hdf5_filter": fid, "hdf5_filter_values": values, "chunks": [int(c) for c in chunks]}
    if fid == 32008:
        comp = values[4] if len(values) > 4 else 0
        if comp not in (2, 3):
            raise UnsupportedOperationError(
                f"{where} uses {_filter_text(f)} with compression code {comp} (2: LZ4, 3: "
                f"Zstandard; 0: none); native encoded reads need LZ4 or Zstandard; {_CONVERT_HINT}"
            )
        config = {
            **base,
            "format": "HDF5 bitshuffle filter 32008 chunk (12-byte header)",
            "block_size": values[3] if len(values) > 3 and values[3] else "auto (chunk header)",
        }
        return ("bitshuffle-lz4" if comp == 2 else "bitshuffle-zstd"), config
    if fid == 32015:
        return "numcodecs", {**base, "pipeline": [{"id": "zstd", "level": 0}]}
    if fid == 1:
        return "numcodecs", {**base, "pipeline": [{"id": "zlib", "level": 1}]}
    raise UnsupportedOperationError(
        f"{where} uses {_filter_text(f)}; native encoded reads take bitshuffle + LZ4 or "
        f"Zstandard (32008), Zstandard (32015) or deflate (1); {_CONVERT_HINT}"
    )


_BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


def zarr_codec(
    codecs: Sequence[dict[str, Any]], dtype: np.dtype[Any], where: str
) -> tuple[np.dtype[Any], dict[str, Any]]:
    """Translate a Zarr v3 codec pipeline to a numcodecs pipeline, or raise why not.

    Parameters
    ----------
    codecs
        The array metadata's ``codecs`` (``[{"name": ..., "configuration": ...}]``).
    dtype
        The array's data type.
    where
        The array and store, for messages.

    Returns
    -------
    tuple
        The stored dtype (byte order of the ``bytes`` codec) and the payload
        codec configuration (``{"pipeline": [...]}`` in encoding order).

    Raises
    ------
    UnsupportedOperationError
        For sharding, ``transpose`` and codecs numcodecs cannot decode.
    """
    if not codecs or codecs[0].get("name") != "bytes":
        names = [c.get("name") for c in codecs]
        raise UnsupportedOperationError(
            f"{where} has the codec pipeline {names}; native encoded reads need 'bytes' first "
            f"(no sharding, no transpose); {_CONVERT_HINT}"
        )
    endian = (codecs[0].get("configuration") or {}).get("endian")
    stored = np.dtype(dtype)
    if stored.itemsize > 1:
        stored = stored.newbyteorder(">" if endian == "big" else "<")
    pipeline: list[dict[str, Any]] = []
    for c in codecs[1:]:
        name = str(c.get("name"))
        conf = dict(c.get("configuration") or {})
        if name == "blosc":
            pipeline.append(
                {
                    "id": "blosc",
                    "cname": conf.get("cname", "lz4"),
                    "clevel": int(conf.get("clevel", 5)),
                    "shuffle": _BLOSC_SHUFFLE.get(str(conf.get("shuffle", "noshuffle")), 0),
                    "blocksize": int(conf.get("blocksize", 0)),
                }
            )
        elif name == "zstd":
            pipeline.append(
                {
                    "id": "zstd",
                    "level": int(conf.get("level", 0)),
                    "checksum": bool(conf.get("checksum", False)),
                }
            )
        elif name == "gzip":
            pipeline.append({"id": "gzip", "level": int(conf.get("level", 5))})
        elif name == "crc32c":
            pipeline.append({"id": "crc32c"})
        elif name.startswith("numcodecs."):
            pipeline.append({**conf, "id": name.split(".", 1)[1]})
        else:
            raise UnsupportedOperationError(
                f"{where} uses the codec {name!r}, which native encoded reads cannot decode "
                f"(they take blosc, zstd, gzip, crc32c and numcodecs.* after 'bytes'); "
                f"{_CONVERT_HINT}"
            )
    if not pipeline:
        raise UnsupportedOperationError(
            f"{where} stores uncompressed chunks, so there are no compressed bytes to keep; "
            f"{_CONVERT_HINT}"
        )
    return stored, {"pipeline": pipeline, "zarr_codecs": list(codecs)}


# ------------------------------------------------------------------------------ runs


def flat_frame_ranges(
    rows: tuple[int, int], cols: tuple[int, int], scan_cols: int, offset: int
) -> list[tuple[int, int]]:
    """Absolute stored-frame ranges of a scan block (one range when all columns are taken)."""
    r0, r1 = rows
    c0, c1 = cols
    if (c0, c1) == (0, scan_cols):
        return [(offset + r0 * scan_cols, offset + r1 * scan_cols)]
    return [(offset + r * scan_cols + c0, offset + r * scan_cols + c1) for r in range(r0, r1)]


def flat_runs(start: int, stop: int, per_chunk: int) -> list[tuple[int, int, int]]:
    """``(chunk index, first frame in chunk, frames)`` of frames ``[start, stop)``."""
    out = []
    pos = start
    while pos < stop:
        k = pos // per_chunk
        end = min(stop, (k + 1) * per_chunk)
        out.append((k, pos - k * per_chunk, end - pos))
        pos = end
    return out


def grid_runs(
    rows: tuple[int, int], cols: tuple[int, int], chunk_rows: int, chunk_cols: int
) -> list[tuple[tuple[int, int], int, int]]:
    """``((chunk row, chunk col), first frame in chunk, frames)`` of a 4-D block, scan order."""
    out = []
    for r in range(*rows):
        i = r // chunk_rows
        c = cols[0]
        while c < cols[1]:
            j = c // chunk_cols
            end = min(cols[1], (j + 1) * chunk_cols)
            out.append(((i, j), (r % chunk_rows) * chunk_cols + (c - j * chunk_cols), end - c))
            c = end
    return out


@dataclasses.dataclass
class PieceTable:
    """Stored chunks read for one payload, each once, and the runs over them."""

    pieces: list[bytes] = dataclasses.field(default_factory=list)
    frames: list[int] = dataclasses.field(default_factory=list)
    origin: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    runs: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    index: dict[Hashable, int] = dataclasses.field(default_factory=dict)

    def add(
        self,
        key: Hashable,
        first: int,
        count: int,
        fetch: Callable[[], tuple[bytes, int, tuple[int, ...]]],
    ) -> None:
        """Add a run over the chunk ``key``, reading it with ``fetch`` the first time.

        ``fetch`` returns the stored bytes, the frames the chunk decodes to,
        and its origin row (origin index, chunk coordinates).
        """
        i = self.index.get(key)
        if i is None:
            data, n, origin = fetch()
            i = len(self.pieces)
            self.index[key] = i
            self.pieces.append(data)
            self.frames.append(n)
            self.origin.append(origin)
        if self.runs and self.runs[-1][0] == i and sum(self.runs[-1][1:]) == first:
            p, f, c = self.runs[-1]
            self.runs[-1] = (p, f, c + count)
        else:
            self.runs.append((i, first, count))


def read_hdf5_chunk(dset: Any, offset: tuple[int, ...], what: str) -> bytes:
    """Return the stored bytes of the chunk at ``offset`` (``b""`` if never written).

    Raises
    ------
    UnsupportedOperationError
        If the chunk was stored without its filter (an optional filter
        skipped when writing), so its bytes are not in the codec's format.
    CorruptChunkError
        If the chunk cannot be read (truncated file, damaged index).
    """
    from ..errors import CorruptChunkError

    try:
        mask, data = dset.id.read_direct_chunk(offset)
    except RuntimeError as exc:
        if "not allocated" in str(exc):
            return b""  # never written: reads as the fill value, as HDF5 defines
        raise CorruptChunkError(f"could not read {what}: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise CorruptChunkError(
            f"could not read {what}: {exc}. The file may be truncated or its chunk index damaged"
        ) from exc
    if mask:
        raise UnsupportedOperationError(
            f"{what} was stored with filter mask {mask:#x} (its filter was skipped when "
            f"writing), so its bytes are not in the dataset's codec format; {_CONVERT_HINT}"
        )
    return bytes(data)


def user_codec_name(codec: str, config: dict[str, Any]) -> str:
    """Name a payload codec as the ``codec=`` option does (``"bitshuffle-lz4"``, ``"zstd"``...)."""
    if codec != "numcodecs":
        return codec
    pipeline = [c for c in config.get("pipeline", []) if c.get("id") != "crc32c"]
    if len(pipeline) != 1:
        return "+".join(str(c.get("id")) for c in pipeline)
    c = pipeline[0]
    if c.get("id") == "blosc":
        prefix = "bitshuffle-" if c.get("shuffle") == 2 else ""
        return f"{prefix}{c.get('cname')}" if c.get("shuffle") in (0, 2) else "blosc"
    return str(c.get("id"))


def check_native_options(options: dict[str, Any], codec: str, config: dict[str, Any]) -> None:
    """Refuse representation options a native read cannot honour (it keeps stored chunks)."""
    from ..errors import ParameterError

    stored = user_codec_name(codec, config)
    opts = dict(options)
    asked = opts.pop("codec", None)
    if asked is not None and asked != stored:
        raise ParameterError(
            f"codec={asked!r} was asked but the source stores its chunks as {stored!r}, and "
            f"native encoded reads keep the stored bytes; omit codec= (or pass {stored!r}), or "
            f"convert the file with `quantem-flow convert ... --codec {asked}`"
        )
    if opts:
        raise ParameterError(
            f"options {sorted(opts)} do not apply to a native encoded read, which keeps the "
            "stored chunks as they are; omit them, or convert the file with "
            "`quantem-flow convert`"
        )


# ------------------------------------------------------------------------------ guard

#: HDF5 filter id of bitshuffle (its LZ4 and Zstandard variants).
BITSHUFFLE_FILTER_ID = 32008


def needs_bitshuffle_guard(layout: dict[str, Any]) -> bool:
    """Whether a dataset's chunks go through the bitshuffle filter, alone, when read.

    Such chunks are checked (:func:`check_bitshuffle_chunks`) before the HDF5
    filter decodes them: the filter trusts its chunk header and crashes the
    process on a corrupt one (docs/upstream-bitshuffle-crash.md).
    """
    filters = list(layout.get("filters", []))
    return (
        bool(layout.get("chunks"))
        and len(filters) == 1
        and int(filters[0]["id"]) == BITSHUFFLE_FILTER_ID
    )


def check_bitshuffle_chunks(dset: Any, bounds: Sequence[tuple[int, int]], where: str) -> None:
    """Check every stored chunk the selection ``bounds`` touches before HDF5 decodes it.

    Parameters
    ----------
    dset
        An open ``h5py.Dataset`` whose only filter is bitshuffle (32008).
    bounds
        Half-open ``(start, stop)`` per dataset axis of the selection.
    where
        The dataset and file, for messages.

    Raises
    ------
    CorruptChunkError
        Naming the file and dataset, the chunk index (chunk-grid coordinates
        and element offset), the chunk's byte offset in the file and what is
        wrong with it.
    """
    import itertools

    from ..errors import CorruptChunkError
    from ..representations.encoded import bitshuffle_chunk_problem

    chunks = [int(c) for c in dset.chunks]
    itemsize = int(dset.dtype.itemsize)
    n_elem = int(np.prod(chunks))
    ranges = [range(a // c, -(-b // c)) for (a, b), c in zip(bounds, chunks, strict=True)]
    for grid in itertools.product(*ranges):
        offset = tuple(g * c for g, c in zip(grid, chunks, strict=True))
        what = f"stored chunk {grid} (element offset {offset}) of {where}"
        try:
            mask, data = dset.id.read_direct_chunk(offset)
        except RuntimeError as exc:
            if "not allocated" in str(exc):
                continue  # never written: HDF5 returns the fill value, nothing is decoded
            raise CorruptChunkError(f"could not read {what}: {exc}") from exc
        except (OSError, ValueError) as exc:
            raise CorruptChunkError(
                f"could not read {what}: {exc}. The file may be truncated or its chunk index "
                "damaged; restore the file"
            ) from exc
        if mask & 1:
            continue  # the filter was skipped for this chunk: stored uncompressed
        problem = bitshuffle_chunk_problem(np.frombuffer(data, dtype=np.uint8), n_elem, itemsize)
        if problem is not None:
            try:
                byte = int(dset.id.get_chunk_info_by_coord(offset).byte_offset)
                at = f" at byte offset {byte} of the file"
            except (RuntimeError, OSError, ValueError, AttributeError):
                at = ""
            raise CorruptChunkError(
                f"{what}{at} is corrupt: {problem}. It was not decoded (the HDF5 bitshuffle "
                "filter would crash on it); restore or re-acquire the file, or crop the scan "
                "to leave this chunk out"
            )
