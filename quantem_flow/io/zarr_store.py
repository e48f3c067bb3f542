"""Zarr stores (a directory): one 3-D or 4-D array, at the root or in a group."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..calibration import Calibration
from ..errors import (
    CorruptChunkError,
    DatasetPathError,
    DtypeError,
    FormatError,
    ShapeError,
    UnsupportedOperationError,
)
from ..provenance import jsonable
from .base import (
    FrameSource,
    SourceIdentity,
    check_exists,
    header_digest,
    path_size,
    sidecar_calibration,
)

__all__ = ["ZarrSource", "list_candidate_arrays"]

_METADATA_FILES = ("zarr.json", ".zarray", ".zattrs", ".zgroup")


#: A shape declaring more than this many times the chunks stored is a damaged shape.
GROSS_FILL_FACTOR = 16


def list_candidate_arrays(path: Path) -> list[str]:
    """Return the paths of every 3-D or 4-D array in a Zarr store (``""``: the root)."""
    import zarr

    try:
        root = zarr.open(store=str(path), mode="r")
    except Exception:  # not a readable store: nothing to suggest
        return []
    if isinstance(root, zarr.Array):
        return [""] if root.ndim in (3, 4) else []
    found: list[str] = []
    try:
        for name, obj in root.members(max_depth=None):
            if isinstance(obj, zarr.Array) and obj.ndim in (3, 4):
                found.append(name)
    except Exception:  # a broken member: list what was found so far
        pass
    return sorted(found)


class ZarrSource(FrameSource):
    """One 3-D or 4-D array of a Zarr (v3, or v2) store.

    Parameters
    ----------
    path
        The store directory.
    array_path
        Path of the array inside the store's root group (``"scan/frames"``);
        ``None`` when the root itself is the array.
    scan_shape
        For 3-D ``(frames, k_r, k_c)`` arrays: ``(rows, cols)``,
        ``"square"`` or ``None`` (JSON sidecar ``<store>.json``).
    frame_offset
        Leading frames to skip (3-D arrays only).

    allow_fill
        Open an array whose shape declares more than 16 times the chunks its
        store holds (``GROSS_FILL_FACTOR``); refused otherwise, as a damaged
        shape.  Recorded in the metadata (provenance).

    Notes
    -----
    Chunks missing from the store read as the array's fill value, as Zarr
    defines; a store that was not completely written is not detected, unless
    nearly all of it is missing (``allow_fill``).

    A Zarr v3 array chunked by whole frames (``(n, k_r, k_c)`` or
    ``(a, b, k_r, k_c)``, no sharding) whose codecs are ``bytes`` then
    blosc, zstd, gzip, crc32c or ``numcodecs.*`` is read natively in the
    ``encoded`` representation: :meth:`read_payload` takes the chunk files
    (named by the array's chunk key encoding) as they are, not decoding.
    Calibration is read from a JSON sidecar, else from the array attribute
    ``quantem_flow.calibration`` that ``quantem-flow convert`` writes.

    """

    format: ClassVar[str] = "zarr"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        array_path: str | None = None,
        scan_shape: Sequence[int] | str | None = None,
        frame_offset: int = 0,
        allow_fill: bool = False,
    ):
        self._path = check_exists(path, what="Zarr store")
        if not self._path.is_dir():
            raise FormatError(
                f"{str(self._path)!r} is a file; a Zarr store is a directory holding zarr.json "
                "(zip or remote stores are not supported)"
            )
        cleaned = (array_path or "").strip("/")
        self._array_path: str | None = cleaned or None
        self._handle_array: Any = None
        arr = self._open()
        shape = tuple(int(s) for s in arr.shape)
        dtype = np.dtype(arr.dtype)
        self._stored_shape = shape
        self._stored_dtype = dtype.str
        self._zarr_format = int(arr.metadata.zarr_format)
        self._chunks = [int(c) for c in arr.chunks]
        shards = getattr(arr, "shards", None)
        self._shards = [int(c) for c in shards] if shards else None
        meta = jsonable(arr.metadata.to_dict())
        self._attrs = jsonable(dict(arr.attrs))
        if self._zarr_format >= 3:
            self._codecs = meta.get("codecs", [])
        else:
            self._codecs = [
                {"filters": meta.get("filters")},
                {"compressor": meta.get("compressor")},
            ]
        self._fill_value = meta.get("fill_value")
        self._native_fill = np.asarray(arr.metadata.fill_value).item()
        self._stored_meta = {
            k: meta.get(k) for k in ("chunk_grid", "storage_transformers", "data_type")
        }
        self._handle_array = arr
        where = f"{self._array_path!r} in " if self._array_path else ""
        self._allow_fill = bool(allow_fill)
        self._stored_files, self._declared_chunks = self._chunk_counts(shape)
        if (
            not self._allow_fill
            and self._declared_chunks > GROSS_FILL_FACTOR * max(self._stored_files, 1)
            and self._declared_chunks - self._stored_files > 64
        ):
            raise FormatError(
                f"array {where}{str(self._path)!r} declares shape {shape} ({self._declared_chunks} "
                f"chunks) but its store holds {self._stored_files} chunk files: more than "
                f"{GROSS_FILL_FACTOR}x the data stored, so nearly every frame would read as the "
                f"fill value {self._fill_value!r}. The shape in its metadata is probably wrong; "
                "pass allow_fill=True to read the missing chunks as the fill value anyway "
                "(recorded in provenance)"
            )
        if dtype.kind not in "uif":
            raise DtypeError(
                f"array {where}{str(self._path)!r} has dtype {dtype}; expected integer or real"
            )
        if len(shape) == 4:
            if scan_shape is not None and tuple(scan_shape) != shape[:2]:
                raise ShapeError(
                    f"array {where}{str(self._path)!r} is 4-D {shape} but "
                    f"scan_shape={scan_shape!r} was given"
                )
            self._set_frames(
                n_frames=shape[0] * shape[1],
                frame_shape=(shape[2], shape[3]),
                dtype=dtype,
                scan_shape=shape[:2],
                path=None,
                scan_shape_from="the file (a 4-D array)",
            )
        elif len(shape) == 3:
            self._set_frames(
                n_frames=shape[0],
                frame_shape=(shape[1], shape[2]),
                dtype=dtype,
                scan_shape=scan_shape,
                path=self._path,
                frame_offset=frame_offset,
            )
        else:
            raise ShapeError(
                f"array {where}{str(self._path)!r} has shape {shape}; expected "
                "(R_r, R_c, k_r, k_c) or (frames, k_r, k_c)"
            )

    def _chunk_counts(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """``(chunk or shard files stored, chunks or shards the shape declares)``."""
        grid = self._shards or self._chunks
        declared = 1
        for n, c in zip(shape, grid, strict=False):
            declared *= -(-n // max(c, 1))
        root = self._path / self._array_path if self._array_path else self._path
        meta = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"}
        stored = 0
        for _, dirs, files in os.walk(root):
            stored += sum(1 for f in files if f not in meta)
            # nested arrays of a group are not this array's chunks
            dirs[:] = [d for d in dirs if not (root / d / "zarr.json").exists()]
        return stored, declared

    def _open(self) -> Any:
        """Open the array read-only, or raise a clear error listing candidates."""
        import zarr

        try:
            if self._array_path is None:
                return zarr.open_array(store=str(self._path), mode="r")
            return zarr.open_array(store=str(self._path), path=self._array_path, mode="r")
        except Exception as exc:  # zarr raises several types for a missing/wrong node
            cands = list_candidate_arrays(self._path)
            shown = [c if c else "<root>" for c in cands]
            if self._array_path is None:
                if cands and "" not in cands:
                    raise DatasetPathError(
                        f"the root of Zarr store {str(self._path)!r} is a group, not an array; "
                        f"pass array_path= one of the 3-D/4-D arrays {shown}"
                    ) from exc
                raise FormatError(
                    f"{str(self._path)!r} is not a readable Zarr store ({exc}); expected a "
                    "directory with zarr.json (v3) or .zarray (v2)"
                ) from exc
            raise DatasetPathError(
                f"array_path {self._array_path!r} is not an array in Zarr store "
                f"{str(self._path)!r} ({type(exc).__name__}: {exc}); 3-D/4-D arrays in the "
                f"store: {shown or 'none'}"
                + ("; the root is the array, so pass array_path=None" if "" in cands else "")
            ) from exc

    def _array(self) -> Any:
        if self._handle_array is None:
            self._handle_array = self._open()
        return self._handle_array

    # -- properties --------------------------------------------------------------
    @property
    def integrity(self) -> tuple[bool, str]:
        """A crc32c codec (verified by Zarr on every chunk decode), if present."""
        names = [str(c.get("name")) for c in self._codecs if isinstance(c, dict)]
        if "crc32c" in names or "numcodecs.crc32c" in names:
            return True, "crc32c checksum per chunk, verified by Zarr on decode"
        return (
            False,
            f"the Zarr array's codecs {names} hold no crc32c checksum; a corrupted byte may "
            "decode to different values unnoticed. Convert with a crc32c codec to make it "
            "checkable",
        )

    @property
    def path(self) -> Path:
        """The store directory."""
        return self._path

    @property
    def array_path(self) -> str | None:
        """Path of the array inside the store (``None``: the root)."""
        return self._array_path

    def _metadata_bytes(self) -> list[tuple[str, bytes]]:
        """Return the raw metadata documents of the root and of the array node."""
        out: list[tuple[str, bytes]] = []
        nodes = [self._path]
        if self._array_path:
            node = self._path
            for part in self._array_path.split("/"):
                node = node / part
                nodes.append(node)
        for node in nodes:
            for name in _METADATA_FILES:
                p = node / name
                if p.is_file():
                    out.append((str(p.relative_to(self._path)), p.read_bytes()))
        return out

    @property
    def identity(self) -> SourceIdentity:
        """Store path, total size and a digest of its metadata documents (zarr.json)."""
        return SourceIdentity(
            format=self.format,
            paths=(str(self._path),),
            file_sizes=(path_size(self._path),),
            header_sha256=header_digest(self._array_path, *self._metadata_bytes()),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """Array path, stored shape and dtype, chunks, codecs and attributes."""
        return {
            "array_path": self._array_path,
            "zarr_format": self._zarr_format,
            "stored_shape": list(self._stored_shape),
            "stored_dtype": self._stored_dtype,
            "chunks": self._chunks,
            "shards": self._shards,
            "codecs": self._codecs,
            "fill_value": self._fill_value,
            "chunks_stored": self._stored_files,
            "chunks_declared": self._declared_chunks,
            "allow_fill": self._allow_fill,
            "attributes": self._attrs,
            **self.scan_metadata(),
        }

    @property
    def calibration(self) -> Calibration | None:
        """Calibration from a JSON sidecar, else from the ``quantem_flow`` attribute, if any."""
        cal = sidecar_calibration(self._path)
        if cal is not None:
            return cal
        stored = self._attrs.get("quantem_flow") if isinstance(self._attrs, dict) else None
        if isinstance(stored, dict) and isinstance(stored.get("calibration"), dict):
            return Calibration.from_dict(stored["calibration"])
        return None

    # -- native encoded reads ---------------------------------------------------
    def _where(self) -> str:
        where = f"array {self._array_path!r} of " if self._array_path else ""
        return f"{where}Zarr store {str(self._path)!r}"

    def _encoded_codec(self) -> tuple[np.dtype[Any], dict[str, Any]]:
        """Stored dtype and codec of the chunk files, or raise why they cannot be kept."""
        from .encoded_chunks import zarr_codec

        where = self._where()
        hint = "convert it with `quantem-flow convert INPUT OUTPUT.zarr`"
        if self._zarr_format < 3:
            raise UnsupportedOperationError(
                f"{where} is Zarr v{self._zarr_format}; native encoded reads take Zarr v3; {hint}"
            )
        if self._shards is not None or self._stored_meta.get("storage_transformers"):
            raise UnsupportedOperationError(
                f"{where} is sharded or uses storage transformers; native encoded reads take "
                f"one chunk per file; {hint}"
            )
        if tuple(self._chunks[-2:]) != self._frame_shape:
            raise UnsupportedOperationError(
                f"{where} is chunked {tuple(self._chunks)}, which splits frames of "
                f"{self._frame_shape}; native encoded reads need chunks of whole frames; {hint}"
            )
        return zarr_codec(self._codecs, np.dtype(self._stored_dtype), where)

    @property
    def payload_representations(self) -> frozenset[str]:  # type: ignore[override]
        """``{"encoded"}`` when the chunk files can be kept compressed, else empty."""
        try:
            self._encoded_codec()
        except UnsupportedOperationError:
            return frozenset()
        return frozenset({"encoded"})

    def _chunk_file(self, coords: tuple[int, ...]) -> Path:
        key = str(self._array().metadata.encode_chunk_key(coords))
        node = self._path / self._array_path if self._array_path else self._path
        return node / key

    def read_payload(
        self, representation: str, rows: tuple[int, int], cols: tuple[int, int], **options: Any
    ) -> Any:
        """Read a scan block as the stored chunk files (``"encoded"``), not decoding.

        The chunk files holding the block's frames are read whole, as they
        lie in the store (named by the array's chunk key encoding); runs
        skip frames outside the block.  A chunk file absent from the store
        reads as the array's fill value.

        Raises
        ------
        UnsupportedOperationError
            If the array's layout or codecs cannot be kept compressed.
        CorruptChunkError
            If a chunk file cannot be read.
        """
        if representation != "encoded":
            return super().read_payload(representation, rows, cols, **options)
        from ..representations.encoded import build_payload
        from .encoded_chunks import (
            PieceTable,
            check_native_options,
            flat_frame_ranges,
            flat_runs,
            grid_runs,
        )

        self.check_block(rows, cols)
        stored, config = self._encoded_codec()
        check_native_options(options, "numcodecs", config)
        where = self._where()

        def read_chunk(coords: tuple[int, ...]) -> bytes:
            path = self._chunk_file(coords)
            try:
                return path.read_bytes()
            except FileNotFoundError:
                return b""  # never written: the fill value, as Zarr defines
            except OSError as exc:
                raise CorruptChunkError(
                    f"could not read chunk {coords} (file {str(path)!r}) of {where}: {exc}"
                ) from exc

        table = PieceTable()
        if len(self._stored_shape) == 3:
            n = self._chunks[0]
            C = self._scan.shape[1]
            for a, b in flat_frame_ranges(rows, cols, C, self._scan.frame_offset):
                for k, first, count in flat_runs(a, b, n):

                    def fetch(k: int = k) -> tuple[bytes, int, tuple[int, ...]]:
                        return read_chunk((k, 0, 0)), n, (0, k, 0, 0)

                    table.add(k, first, count, fetch)
        else:
            ca, cb = self._chunks[0], self._chunks[1]
            for (i, j), first, count in grid_runs(rows, cols, ca, cb):

                def fetch_grid(i: int = i, j: int = j) -> tuple[bytes, int, tuple[int, ...]]:
                    return read_chunk((i, j, 0, 0)), ca * cb, (0, i, j, 0, 0)

                table.add((i, j), first, count, fetch_grid)
        return build_payload(
            scan_shape=(rows[1] - rows[0], cols[1] - cols[0]),
            frame_shape=self._frame_shape,
            value_dtype=stored,
            codec="numcodecs",
            codec_config={**config, "made": "native Zarr v3 read (chunk files)"},
            pieces=table.pieces,
            piece_frames=table.frames,
            runs=table.runs,
            origins=(where,),
            piece_origin=table.origin,
            fill_value=self._native_fill,
        )

    # -- reading -------------------------------------------------------------------
    def _read(self, selection: tuple[slice, ...], what: str) -> np.ndarray:
        arr = self._array()
        try:
            block = arr[selection]
        except Exception as exc:  # codecs raise RuntimeError, ValueError, OSError...
            where = f"array {self._array_path!r} of " if self._array_path else ""
            raise CorruptChunkError(
                f"could not read or decode {what} of {where}Zarr store {str(self._path)!r}: "
                f"{type(exc).__name__}: {exc}. A chunk file may be truncated or corrupt"
            ) from exc
        return np.asarray(block, dtype=self._dtype)

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read frames ``[start, stop)`` (copied into ``out`` when given)."""
        if out is not None:
            out[...] = self.read_frames(start, stop)
            return out
        if len(self._stored_shape) == 3:
            return self._read((slice(start, stop),), f"frames [{start}, {stop})")
        C = self._stored_shape[1]
        kr, kc = self._frame_shape
        r0, r1 = start // C, -(-stop // C)
        block = self._read((slice(r0, r1),), f"scan rows [{r0}, {r1})").reshape(-1, kr, kc)
        return block[start - r0 * C : stop - r0 * C]

    def read(
        self, rows: tuple[int, int], cols: tuple[int, int], *, buffer: np.ndarray | None = None
    ) -> np.ndarray:
        """Read a scan block; 4-D arrays are sliced directly."""
        if len(self._stored_shape) == 3:
            return super().read(rows, cols, buffer=buffer)
        self.check_block(rows, cols)
        return self._read(
            (slice(*rows), slice(*cols)), f"scan rows [{rows[0]}, {rows[1]}) cols {cols}"
        )

    def close(self) -> None:
        """Drop the array handle."""
        self._handle_array = None
