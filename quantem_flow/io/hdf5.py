"""Generic HDF5 datasets (any filter ``hdf5plugin`` registers)."""

from __future__ import annotations

import functools
import math
import os
import threading
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
    QuantemFlowError,
    ScanShapeError,
    ShapeError,
    UnsupportedOperationError,
)
from ..representations.stored import STORED_CODEC, StoredFrames
from .base import FrameSource, SourceIdentity, check_exists, header_digest, path_size

__all__ = [
    "Hdf5Source",
    "attribute_value",
    "candidate_datasets",
    "describe_datasets",
    "hdf5_type_problem",
    "link_name",
    "list_candidate_datasets",
    "open_dataset",
    "open_h5",
    "read_attribute",
    "read_attributes",
]


def open_h5(path: Path) -> Any:
    """Open an HDF5 file read-only with every compression plugin registered."""
    import h5py
    import hdf5plugin  # noqa: F401 - registers bitshuffle, LZ4, zstd... filters

    try:
        return h5py.File(path, "r")
    except FileNotFoundError as exc:
        from ..errors import SourceNotFoundError

        raise SourceNotFoundError(
            f"HDF5 file {str(path)!r} does not exist (any more): {exc}; restore it or open the "
            "dataset again"
        ) from exc
    except (OSError, RuntimeError, ValueError) as exc:
        raise FormatError(f"{str(path)!r} is not a readable HDF5 file: {exc}") from exc


def link_name(name: str | bytes) -> str:
    """An HDF5 path as text: h5py gives a name that is not UTF-8 as bytes (escaped here).

    A name so escaped does not open the object (``h5py`` encodes text as
    UTF-8); it only names it in messages.
    """
    return name.decode("utf-8", errors="backslashreplace") if isinstance(name, bytes) else name


def candidate_datasets(
    h5file: Any, *, ndims: tuple[int, ...] = (3, 4)
) -> list[tuple[str, tuple[int, ...], str]]:
    """Return ``(path, shape, dtype)`` of every dataset of an open HDF5 file with those ranks.

    External links are not followed (their files may be missing).
    """
    import h5py

    found: list[tuple[str, tuple[int, ...], str]] = []

    def visit(name: str | bytes, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and obj.ndim in ndims:
            found.append(("/" + link_name(name), tuple(int(v) for v in obj.shape), str(obj.dtype)))

    h5file.visititems(visit)
    return found


def list_candidate_datasets(h5file: Any) -> list[str]:
    """Return the paths of every 3-D or 4-D dataset in an open HDF5 file."""
    return [path for path, _, _ in candidate_datasets(h5file)]


def describe_datasets(found: list[tuple[str, tuple[int, ...], str]], *, limit: int = 20) -> str:
    """``'/a' (256, 256, 128, 128) uint16, '/b' ...`` for messages (at most ``limit``)."""
    if not found:
        return "none"
    text = ", ".join(f"{path!r} {shape} {dtype}" for path, shape, dtype in found[:limit])
    return text + (f" and {len(found) - limit} more" if len(found) > limit else "")


def _choose_dataset(f: Any, path: Path) -> tuple[str, str]:
    """The dataset to open when none was named, and a note; or raise listing the candidates.

    The rule: the file's only 3-D or 4-D dataset is taken; with none or
    several the error lists them (path, shape, dtype), 4-D first.
    """
    cands = candidate_datasets(f)
    if len(cands) == 1:
        only = cands[0]
        return only[0], (
            f"dataset_path {only[0]!r} chosen as the file's only 3-D/4-D dataset "
            f"(shape {only[1]}, {only[2]})"
        )
    if not cands:
        others = candidate_datasets(f, ndims=tuple(range(0, 33)))
        raise DatasetPathError(
            f"{str(path)!r} holds no 3-D or 4-D dataset, so no 4D-STEM data; its datasets: "
            f"{describe_datasets(others)}. A 4D-STEM dataset is (R_r, R_c, k_r, k_c) or (frames, "
            "k_r, k_c); check the file, or open it with the reader of its format (format=)"
        )
    cands.sort(key=lambda c: -len(c[1]))
    raise DatasetPathError(
        f"{str(path)!r} holds {len(cands)} 3-D/4-D datasets, so which one is the 4D-STEM data "
        f"is not guessed: {describe_datasets(cands)}. Pass dataset_path= one of them"
    )


def dataset_filters(dset: Any) -> dict[str, Any]:
    """Return the filter pipeline of an HDF5 dataset as a JSON-ready dict."""
    plist = dset.id.get_create_plist()
    filters = []
    for i in range(plist.get_nfilters()):
        code, _flags, values, name = plist.get_filter(i)
        filters.append(
            {"id": int(code), "name": name.decode(errors="replace"), "values": list(values)}
        )
    return {"chunks": list(dset.chunks) if dset.chunks else None, "filters": filters}


def layout_integrity(layout: dict[str, Any], where: str) -> tuple[bool, str]:
    """Whether an HDF5 dataset's chunks carry Fletcher32 checksums (filter 3)."""
    ids = [int(f["id"]) for f in layout.get("filters", [])]
    if 3 in ids:
        return True, f"{where}: Fletcher32 checksum per chunk, verified by HDF5 on read"
    names = [f.get("name") or f["id"] for f in layout.get("filters", [])] or ["none"]
    return (
        False,
        f"{where} has no Fletcher32 checksum (filters: {names}); a corrupted byte may decode "
        "to different values unnoticed. Rewrite it with fletcher32=True to make it checkable",
    )


def open_dataset(h5file: Any, dataset_path: str, path: Path) -> Any:
    """Open a dataset found when the file was opened, again at read time (or raise).

    Parameters
    ----------
    h5file
        The open ``h5py.File``; it is closed when the dataset cannot be opened.
    dataset_path
        The dataset's path in the file.
    path
        The file (for messages).

    Returns
    -------
    h5py.Dataset
        The dataset.

    Raises
    ------
    FormatError
        The path no longer leads to a dataset (h5py raises a bare ``KeyError``
        for a missing link or a damaged object header): the file was changed
        or damaged after it was opened.
    """
    import h5py

    try:
        obj = h5file[dataset_path]
        problem = None if isinstance(obj, h5py.Dataset) else f"is a {type(obj).__name__}"
    except (KeyError, OSError, RuntimeError, ValueError, TypeError) as exc:
        problem = f"could not be opened ({type(exc).__name__}: {exc})"
    if problem is None:
        return obj
    h5file.close()
    raise FormatError(
        f"dataset {dataset_path!r} of {str(path)!r} was a dataset when the file was opened but "
        f"now {problem}: the file was changed or damaged since. Check or restore the file, then "
        "open it again"
    )


class Hdf5Source(FrameSource):
    """One 3-D or 4-D dataset of an HDF5 file.

    Parameters
    ----------
    path
        The HDF5 file.
    dataset_path
        Path of the dataset inside the file, e.g. ``"/data"``.  ``None``
        takes the file's only 3-D/4-D dataset (recorded as a note) and raises
        :class:`DatasetPathError` listing them when there are several.
    scan_shape
        For 3-D ``(frames, k_r, k_c)`` datasets: ``(rows, cols)``,
        ``"square"`` or ``None`` (JSON sidecar).
    frame_offset
        Leading frames to skip (3-D datasets only).

    Notes
    -----
    When the dataset is chunked by whole frames (``(n, k_r, k_c)`` or
    ``(a, b, k_r, k_c)``) and compressed with bitshuffle + LZ4 or Zstandard
    (filter 32008), Zstandard (32015) or deflate (1) alone, the ``encoded``
    representation is read natively: :meth:`read_payload` takes the stored
    chunks with ``read_direct_chunk``, without the filter pipeline, and
    :attr:`payload_representations` lists ``"encoded"``.  Otherwise it lists
    nothing and ``to_representation("encoded")`` encodes from dense.
    """

    format: ClassVar[str] = "hdf5"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dataset_path: str | None = None,
        scan_shape: Sequence[int] | str | None = None,
        frame_offset: int = 0,
    ):
        import h5py

        self._path = check_exists(path)
        self._handle_file: Any = None
        self._handle_dset: Any = None
        self._handle_pfile: Any = None
        self._open_notes: list[str] = []
        with open_h5(self._path) as f:
            self._dataset_from = "given (dataset_path=)"
            if dataset_path is None:
                dataset_path, note = _choose_dataset(f, self._path)
                self._open_notes.append(note)
                self._dataset_from = "the file's only 3-D/4-D dataset"
            self._dataset_path = dataset_path
            obj = f.get(dataset_path)
            if not isinstance(obj, h5py.Dataset):
                what = "does not exist" if obj is None else f"is a {type(obj).__name__}"
                if obj is None and self._dataset_from != "given (dataset_path=)":
                    what = (
                        "cannot be opened by its name (a name that is not UTF-8, shown with \\x "
                        "escapes: the file is damaged, or was written with such a name; rename "
                        "the dataset with h5py)"
                    )
                raise DatasetPathError(
                    f"dataset_path {dataset_path!r} {what} in {str(self._path)!r}; "
                    f"3-D/4-D datasets in the file: {describe_datasets(candidate_datasets(f))}"
                )
            shape = tuple(int(s) for s in obj.shape)
            dtype = obj.dtype
            self._layout = dataset_filters(obj)
            attrs = read_attributes(obj)
            self._contiguous_at = contiguous_offset(obj)
        if dtype.kind not in "uif":
            raise DtypeError(
                f"{dataset_path!r} in {str(self._path)!r} has dtype {dtype}; expected integer or "
                "real values"
            )
        self._stored_shape = shape
        self._stored_dtype = np.dtype(dtype)
        self._attrs = attrs
        if len(shape) == 4:
            if scan_shape is not None and (
                isinstance(scan_shape, str) or tuple(scan_shape) != shape[:2]
            ):
                raise ScanShapeError(
                    f"{dataset_path!r} is 4-D {shape} but scan_shape={scan_shape!r} was given"
                )
            self._set_frames(
                n_frames=shape[0] * shape[1],
                frame_shape=shape[2:],
                dtype=dtype,
                scan_shape=shape[:2],
                path=None,
                scan_shape_from="the file (a 4-D dataset)",
            )
        elif len(shape) == 3:
            self._set_frames(
                n_frames=shape[0],
                frame_shape=shape[1:],
                dtype=dtype,
                scan_shape=scan_shape,
                path=self._path,
                frame_offset=frame_offset,
            )
        else:
            raise ShapeError(
                f"{dataset_path!r} in {str(self._path)!r} has shape {shape}; expected "
                "(R_r, R_c, k_r, k_c) or (frames, k_r, k_c)"
            )

    @property
    def streams_blocks(self) -> bool:
        """Uncompressed datasets, and bitshuffle datasets of one whole frame per chunk.

        Uncompressed: contiguous, or in chunks of one frame or part of one;
        bitshuffle: the Dectris layout, or ``(1, 1, k_r, k_c)`` chunks.  Any
        block of those reads and decodes only its own chunks; a chunk
        spanning several frames would be decoded once per piece that touches
        it, so other compressed layouts say no.  Bitshuffle frames decode a
        piece's run of chunks in one compiled call without the GIL
        (io/bslz4_read.py): as fast as whole chunks on the embedded default
        (within this VM's noise), holding one 2 MiB piece per task instead
        of the whole chunk (docs/streamed-pass.md).
        """
        chunks = self._layout.get("chunks")
        if self._layout.get("filters"):
            from .bslz4_read import decodes_whole_frames

            return decodes_whole_frames(self._layout, self._stored_shape)
        return not chunks or all(int(c) == 1 for c in chunks[: len(self._stored_shape) - 2])

    @property
    def integrity(self) -> tuple[bool, str]:
        """Fletcher32 checksums (HDF5 filter 3), verified by HDF5 on every read, if present."""
        return layout_integrity(self._layout, f"dataset {self._dataset_path!r}")

    def _encoded_codec(self) -> tuple[str, dict[str, Any]]:
        """The codec of the stored chunks, or raise why they cannot be kept compressed."""
        from .encoded_chunks import hdf5_codec

        where = f"dataset {self._dataset_path!r} of {str(self._path)!r}"
        return hdf5_codec(self._layout, self._frame_shape, len(self._stored_shape), where)

    @property
    def payload_representations(self) -> frozenset[str]:  # type: ignore[override]
        """``{"encoded"}`` when the stored chunks can be kept compressed, else empty."""
        try:
            self._encoded_codec()
        except UnsupportedOperationError:
            return frozenset()
        return frozenset({"encoded"})

    def read_payload(
        self, representation: str, rows: tuple[int, int], cols: tuple[int, int], **options: Any
    ) -> Any:
        """Read a scan block as its stored compressed chunks (``"encoded"``), not decoding.

        Chunks are read with ``read_direct_chunk`` (no HDF5 filter pipeline)
        and kept as they are.  Column sub-ranges read the stored chunks that
        hold them whole and skip the other frames; chunks never written read
        as the dataset's fill value.

        Raises
        ------
        UnsupportedOperationError
            If the layout or filter cannot be kept compressed (the message
            names the filter and says to convert).
        CorruptChunkError
            If a chunk cannot be read.
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
            read_hdf5_chunk,
        )

        self.check_block(rows, cols)
        codec, config = self._encoded_codec()
        check_native_options(options, codec, config)
        dset = self._dset()
        chunks = [int(c) for c in self._layout["chunks"]]
        where = f"dataset {self._dataset_path!r} of {str(self._path)!r}"
        table = PieceTable()
        if len(self._stored_shape) == 3:
            n = chunks[0]
            C = self._scan.shape[1]
            for a, b in flat_frame_ranges(rows, cols, C, self._scan.frame_offset):
                for k, first, count in flat_runs(a, b, n):

                    def fetch(k: int = k) -> tuple[bytes, int, tuple[int, ...]]:
                        what = f"stored chunk {k} (frames [{k * n}, {(k + 1) * n})) of {where}"
                        return read_hdf5_chunk(dset, (k * n, 0, 0), what), n, (0, k)

                    table.add(k, first, count, fetch)
        else:
            ca, cb = chunks[0], chunks[1]
            for (i, j), first, count in grid_runs(rows, cols, ca, cb):

                def fetch_grid(i: int = i, j: int = j) -> tuple[bytes, int, tuple[int, ...]]:
                    what = f"stored chunk ({i}, {j}, 0, 0) of {where}"
                    return read_hdf5_chunk(dset, (i * ca, j * cb, 0, 0), what), ca * cb, (0, i, j)

                table.add((i, j), first, count, fetch_grid)
        from .bslz4_read import fill_value

        fill = np.asarray(fill_value(dset, str(self._path))).item()
        return build_payload(
            scan_shape=(rows[1] - rows[0], cols[1] - cols[0]),
            frame_shape=self._frame_shape,
            value_dtype=np.dtype(dset.dtype),
            codec=codec,
            codec_config={**config, "made": "native HDF5 read (read_direct_chunk)"},
            pieces=table.pieces,
            piece_frames=table.frames,
            runs=table.runs,
            origins=(where,),
            piece_origin=table.origin,
            fill_value=fill,
        )

    def _dset(self) -> Any:
        if self._handle_dset is None:
            h5file = open_h5(self._path)
            self._handle_dset = open_dataset(h5file, self._dataset_path, self._path)
            self._handle_file = h5file
        return self._handle_dset

    @property
    def path(self) -> Path:
        """The file."""
        return self._path

    @property
    def identity(self) -> SourceIdentity:
        """Path, size and a digest of shape, dtype, chunks, filters and attributes."""
        return SourceIdentity(
            format=self.format,
            paths=(str(self._path),),
            file_sizes=(path_size(self._path),),
            header_sha256=header_digest(
                self._dataset_path,
                self._stored_shape,
                str(self._dtype),
                self._layout,
                sorted(self._attrs.items()),
            ),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """Dataset path, stored shape, chunking, filters and attributes."""
        return {
            "dataset_path": self._dataset_path,
            "stored_shape": list(self._stored_shape),
            **self._layout,
            "dataset_path_from": self._dataset_from,
            "attributes": self._attrs,
            **self.scan_metadata(),
            "calibration_from": (
                None
                if self._stored_calibration() is None
                else "the dataset attribute 'quantem_flow' (written by quantem-flow)"
            ),
        }

    def _stored_calibration(self) -> Calibration | None:
        """The calibration quantem-flow wrote on the dataset (``quantem_flow`` attribute)."""
        import json

        raw = self._attrs.get("quantem_flow") if isinstance(self._attrs, dict) else None
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                return None
        if isinstance(raw, dict) and isinstance(raw.get("calibration"), dict):
            try:
                return Calibration.from_dict(raw["calibration"])
            except (QuantemFlowError, TypeError, ValueError) as exc:
                raise FormatError(
                    f"dataset {self._dataset_path!r} of {str(self._path)!r} holds a "
                    f"'quantem_flow' attribute whose calibration is not valid ({exc}); fix it, "
                    "or pass calibration= to open"
                ) from exc
        return None

    @property
    def calibration(self) -> Calibration | None:
        """A JSON sidecar's calibration, else the one quantem-flow wrote on the dataset."""
        from .base import sidecar_calibration

        found = sidecar_calibration(self._path)
        return found if found is not None else self._stored_calibration()

    def _guard(self, selection: Any) -> None:
        """Check the bitshuffle chunks a selection touches before the HDF5 filter decodes them."""
        from .encoded_chunks import check_bitshuffle_chunks, needs_bitshuffle_guard

        if not needs_bitshuffle_guard(self._layout):
            return
        bounds = self._bounds(selection, len(self._stored_shape))
        where = f"dataset {self._dataset_path!r} of {str(self._path)!r}"
        check_bitshuffle_chunks(self._dset(), bounds, where)

    def _bounds(self, selection: Any, axes: int) -> list[tuple[int, int]]:
        """Half-open ``(start, stop)`` of a slice selection on the first ``axes`` stored axes."""
        sel = selection if isinstance(selection, tuple) else (selection,)
        bounds = []
        for axis, n in enumerate(self._stored_shape[:axes]):
            start, stop, _ = (sel[axis] if axis < len(sel) else slice(None)).indices(n)
            bounds.append((start, stop))
        return bounds

    def _pread(self, out: np.ndarray | None, selection: Any, what: str) -> np.ndarray:
        """Read a selection of a contiguous, unfiltered dataset with ``pread`` at its offset.

        No HDF5 call (h5py serialises every call of a process behind one
        lock, so two task threads reading one file took turns): the bytes
        are where ``H5Dget_offset`` says, in the stored byte order.
        """
        assert self._contiguous_at is not None
        lead = self._stored_shape[:-2]
        bounds = self._bounds(selection, len(lead))
        frame_bytes = math.prod(self._stored_shape[-2:]) * self._stored_dtype.itemsize
        shape = (*(b - a for a, b in bounds), *self._stored_shape[-2:])
        target = out if out is not None else np.empty(shape, dtype=self._dtype)
        if target.shape != shape:
            target = target.reshape(shape)
        file = self._pfile()
        if len(bounds) == 1 or bounds[1] == (0, lead[1]):
            first = bounds[0][0] * (lead[1] if len(bounds) == 2 else 1)
            file.readinto(self._contiguous_at + first * frame_bytes, target, what=what)
        else:
            (r0, r1), (c0, _c1) = bounds
            for i in range(r1 - r0):
                at = self._contiguous_at + ((r0 + i) * lead[1] + c0) * frame_bytes
                file.readinto(at, target[i], what=what)
        if not self._stored_dtype.isnative and self._stored_dtype.itemsize > 1:
            target.byteswap(inplace=True)
        return target

    def _pfile(self) -> Any:
        from .fileio import PositionalFile

        with _PFILE_LOCK:
            if self._handle_pfile is None:
                # the dataset is opened through HDF5 once per process (as every other read
                # does): it must still be there, same type and shape, at the same offset
                dset = self._dset()
                if (
                    contiguous_offset(dset) != self._contiguous_at
                    or dset.dtype != self._stored_dtype
                    or tuple(dset.shape) != self._stored_shape
                ):
                    raise FormatError(
                        f"dataset {self._dataset_path!r} in {str(self._path)!r} changed or "
                        f"damaged since it was opened (now {dset.dtype} {tuple(dset.shape)}, "
                        f"was {self._stored_dtype} {self._stored_shape} at byte "
                        f"{self._contiguous_at}); open the file again"
                    )
                self._handle_pfile = PositionalFile(self._path)
            return self._handle_pfile

    def _read(self, selection: tuple[slice, ...], what: str) -> np.ndarray:
        if self._contiguous_at is not None:
            return self._pread(None, selection, what)
        # bitshuffle: each chunk read once, checked, decoded in threads (io/bslz4_read.py)
        from .bslz4_read import read_selection

        where = f"dataset {self._dataset_path!r} of {str(self._path)!r}"
        values = read_selection(self._dset(), self._layout, selection, where=where)
        if values is not None:
            return values if values.dtype == self._dtype else values.astype(self._dtype)
        self._guard(selection)
        try:
            return np.asarray(self._dset()[selection], dtype=self._dtype)
        except (OSError, RuntimeError, ValueError) as exc:
            raise CorruptChunkError(
                f"could not read or decode {what} of {self._dataset_path!r} in "
                f"{str(self._path)!r}: {exc}. The file may be truncated or a compressed chunk "
                "corrupt; results computed so far are kept"
            ) from exc

    @functools.cached_property
    def stored_frames_codec(self) -> str | None:
        """``"bitshuffle-lz4"`` for integer frames stored one bitshuffle + LZ4 chunk each.

        Those read directly (``sec2`` driver; io/bslz4_read.py ``stored_readable``).
        Decided once per source, so every pass over the dataset hashes the same bytes.
        """
        if not self._layout.get("filters"):
            return None
        from .bslz4_read import decodes_whole_frames, stored_readable

        readable = decodes_whole_frames(self._layout, self._stored_shape) and stored_readable(
            self._dset()
        )
        return STORED_CODEC if readable else None

    def stored_frames(
        self, start: int, stop: int, *, buffer: np.ndarray | None = None
    ) -> StoredFrames:
        """Frames ``[start, stop)`` as stored (see :attr:`stored_frames_codec`), undecoded."""
        if self.stored_frames_codec is None:
            return super().stored_frames(start, stop, buffer=buffer)
        from .bslz4_read import read_stored

        where = f"dataset {self._dataset_path!r} of {str(self._path)!r}"
        return read_stored(self._dset(), start, stop, where=where, buffer=buffer)

    def frame_bytes(self, start: int, stop: int) -> tuple[Path, int] | None:
        """A contiguous, unfiltered dataset in native byte order is one run of bytes.

        The dataset is checked once per process to be unchanged, as for ``pread``.
        """
        if self._contiguous_at is None:
            return None
        if not self._stored_dtype.isnative and self._stored_dtype.itemsize > 1:
            return None
        self._pfile()  # raises FormatError if the dataset moved or changed since it was opened
        frame = math.prod(self._stored_shape[-2:]) * self._stored_dtype.itemsize
        return self._path, self._contiguous_at + start * frame

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read frames ``[start, stop)`` (decoding into ``out`` when given)."""
        if len(self._stored_shape) == 3:
            if out is not None:
                return self._read_into(out, np.s_[start:stop], f"frames [{start}, {stop})")
            return self._read((slice(start, stop),), f"frames [{start}, {stop})")
        C = self._stored_shape[1]
        kr, kc = self._frame_shape
        r0, r1 = start // C, -(-stop // C)
        block = self._read((slice(r0, r1),), f"scan rows [{r0}, {r1})").reshape(-1, kr, kc)
        frames = block[start - r0 * C : stop - r0 * C]
        if out is not None:
            out[...] = frames
            return out
        return frames

    def _read_into(self, out: np.ndarray, selection: Any, what: str) -> np.ndarray:
        if out.dtype != self._dtype or not out.flags.c_contiguous:
            out[...] = self._read(selection, what)
            return out
        if self._contiguous_at is not None:
            return self._pread(out, selection, what)
        from .bslz4_read import read_selection

        where = f"dataset {self._dataset_path!r} of {str(self._path)!r}"
        if read_selection(self._dset(), self._layout, selection, where=where, out=out) is not None:
            return out
        self._guard(selection)
        try:
            self._dset().read_direct(out, source_sel=selection)
        except (OSError, RuntimeError, ValueError) as exc:
            raise CorruptChunkError(
                f"could not read or decode {what} of {self._dataset_path!r} in "
                f"{str(self._path)!r}: {exc}. The file may be truncated or a compressed chunk "
                "corrupt; results computed so far are kept"
            ) from exc
        return out

    def read(
        self, rows: tuple[int, int], cols: tuple[int, int], *, buffer: np.ndarray | None = None
    ) -> np.ndarray:
        """Read a scan block; 4-D datasets are sliced directly."""
        if len(self._stored_shape) == 3:
            return super().read(rows, cols, buffer=buffer)
        self.check_block(rows, cols)
        what = f"scan rows [{rows[0]}, {rows[1]}) cols {cols}"
        sel = np.s_[rows[0] : rows[1], cols[0] : cols[1]]
        shape = (rows[1] - rows[0], cols[1] - cols[0], *self._frame_shape)
        if buffer is not None and buffer.shape == shape:
            return self._read_into(buffer, sel, what)
        return self._read((slice(*rows), slice(*cols)), what)

    def close(self) -> None:
        """Close the file."""
        if self._handle_file is not None:
            self._handle_file.close()
        if self._handle_pfile is not None:
            self._handle_pfile.close()
        self._handle_file = None
        self._handle_dset = None
        self._handle_pfile = None


#: Guards the first positional handle of a source in a process (two threads reading at once).
_PFILE_LOCK = threading.Lock()


def contiguous_offset(dset: Any) -> int | None:
    """Byte offset of a contiguous, unfiltered, fully written dataset's values, else ``None``.

    Such a dataset is one run of bytes in the file (``H5Dget_offset``) in
    its stored byte order; :class:`Hdf5Source` reads it with ``pread``.
    External storage, virtual datasets, chunked or filtered layouts and
    space not yet written (no offset, or fewer bytes than the shape) say
    ``None`` and read through HDF5.
    """
    import h5py

    try:
        if dset.chunks is not None or dset.is_virtual or dset.external:
            return None
        plist = dset.id.get_create_plist()
        if plist.get_layout() != h5py.h5d.CONTIGUOUS or plist.get_nfilters():
            return None
        # the stored type must be the standard one of the NumPy dtype h5py reads it as (a
        # reduced precision or bit offset, or a custom float, is converted by HDF5)
        if not dset.id.get_type().equal(h5py.h5t.py_create(dset.dtype)):
            return None
        offset = dset.id.get_offset()
        expected = int(np.prod(dset.shape)) * int(dset.dtype.itemsize)
        if offset is None or int(dset.id.get_storage_size()) != expected:
            return None
    except (AttributeError, RuntimeError, ValueError, OSError):
        return None
    return int(offset)


def hdf5_type_problem(type_id: Any) -> str | None:
    """Why values of an HDF5 datatype are not read (``None``: they may be).

    A variable-length sequence (not a string) is refused, also inside an
    array or compound type: HDF5 trusts the sequence kind stored in the
    file, and a damaged one makes the conversion call a null function (the
    process crashes; found by tests/fuzz_readers.py).  Variable-length
    strings are converted by another path and are read.  References are not
    metadata values and are refused too.

    Parameters
    ----------
    type_id
        An ``h5py.h5t.TypeID`` (``attr_id.get_type()``, ``dset.id.get_type()``).

    Returns
    -------
    str or None
        What the type is when it is refused.
    """
    import h5py

    cls = type_id.get_class()
    if cls == h5py.h5t.VLEN:
        return "a variable-length sequence"
    if cls == h5py.h5t.REFERENCE:
        return "a reference"
    if cls == h5py.h5t.ARRAY:
        return hdf5_type_problem(type_id.get_super())
    if cls == h5py.h5t.COMPOUND:
        for i in range(type_id.get_nmembers()):
            problem = hdf5_type_problem(type_id.get_member_type(i))
            if problem is not None:
                return problem
    return None


def read_attribute(obj: Any, name: str, default: Any = None) -> Any:
    """Return one attribute of an HDF5 object as h5py reads it, never reading an unsafe type.

    Parameters
    ----------
    obj
        An open ``h5py`` group, dataset or file.
    name
        The attribute.
    default
        Returned when the attribute is absent or its type is refused by
        :func:`hdf5_type_problem`.

    Returns
    -------
    Any
        The value (as ``obj.attrs[name]``) or ``default``.
    """
    import h5py

    if name not in obj.attrs:
        return default
    if hdf5_type_problem(h5py.h5a.open(obj.id, name.encode()).get_type()) is not None:
        return default
    return obj.attrs[name]


def read_attributes(obj: Any) -> dict[str, Any]:
    """Every attribute of an HDF5 object as a small JSON-ready value (:func:`attribute_value`).

    An attribute of a type :func:`hdf5_type_problem` refuses is not read;
    its value is ``"<not read: ...>"`` saying why.
    """
    import h5py

    out: dict[str, Any] = {}
    for name in list(obj.attrs):
        key = link_name(name)
        raw = name if isinstance(name, bytes) else name.encode()
        problem = hdf5_type_problem(h5py.h5a.open(obj.id, raw).get_type())
        if problem is not None:
            out[key] = f"<not read: {problem}>"
        else:
            out[key] = attribute_value(obj.attrs[name])
    return out


def attribute_value(value: Any) -> Any:
    """Return an HDF5 attribute value as a small JSON-ready value (large arrays summarised)."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, np.ndarray):
        return value.tolist() if value.size <= 64 else f"<array {value.shape} {value.dtype}>"
    if isinstance(value, np.generic):
        return value.item()
    return value if isinstance(value, (str, int, float, bool)) else repr(value)
