"""LiberTEM's sparse ``raw_csr`` layout: a TOML descriptor and three flat binary files.

The descriptor (``scan.toml``, any name)::

    [params]
    filetype = "raw_csr"
    nav_shape = [R_r, R_c]          # the scan, rows then columns ([n]: one row of n;
                                    # more axes: pass scan_shape=)
    sig_shape = [k_r, k_c]          # the detector

    [raw_csr]
    indptr_file = "indptr.raw"      # beside the descriptor (relative paths)
    indptr_dtype = "<i8"
    indices_file = "indices.raw"
    indices_dtype = "<u4"
    data_file = "values.raw"
    data_dtype = "<u2"

The three files are one compressed-sparse-row matrix with a row per frame
(scan positions row-major, ``frame = r * R_c + c``) and a column per flat
detector pixel (``r * k_c + c``): frame ``i`` holds ``data[j]`` at pixel
``indices[j]`` for ``indptr[i] <= j < indptr[i + 1]``.  Nothing else is in
the files (no header), so they are read with ``pread`` and never kept mapped.

The layout is the ``paired`` representation on disk: :func:`quantem_flow.open`
gives a paired dataset for unsigned-integer values, each chunk's pairs built
from its own slice of the files (indices sorted within a frame, repeated
pixels summed, zeros dropped: the paired representation's form; a sum that
does not fit the values' dtype raises rather than wraps); signed or real
values open dense (repeated pixels summed too: signed sums in 64 bits, refused
outside the values' dtype).  Everything the format does not say is checked where it is
read, and a damaged input raises the project's errors naming the file and
the frame: a descriptor that is not TOML or misses a key, a file that is
missing or not a whole number of its dtype, ``indptr`` decreasing, starting
below 0 or ending past the values, ``indices`` and ``data`` of different
lengths, a pixel index outside the detector.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numba
import numpy as np

from ..errors import (
    CorruptChunkError,
    DtypeError,
    FormatError,
    ParameterError,
    ScanShapeError,
    SourceNotFoundError,
)
from ..representations.paired import (
    PairedPayload,
    _scatter,
    check_threshold,
    counts_dtype_for,
    index_dtype_for,
)
from .base import FrameSource, SourceIdentity, check_exists, header_digest, path_size
from .fileio import PositionalFile, PositionalFiles
from .sniffers import raw_csr as sniff

__all__ = ["FILETYPE", "RawCsrSource", "sniff"]

#: The ``[params] filetype`` of the layout (matched without regard to case).
FILETYPE = "raw_csr"
_FILES = ("indptr", "indices", "data")


def _descriptor(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            conf = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise FormatError(
            f"{str(path)!r} is not a TOML file ({exc}); a raw_csr descriptor is TOML with "
            "[params] (filetype, nav_shape, sig_shape) and [raw_csr] (the three files)"
        ) from exc
    params = conf.get("params")
    if not isinstance(params, dict) or str(params.get("filetype", "")).lower() != FILETYPE:
        raise FormatError(
            f'{str(path)!r} has no [params] with filetype = "raw_csr" (found '
            f"{params.get('filetype') if isinstance(params, dict) else None!r}); it is not a "
            "raw_csr descriptor"
        )
    section = conf.get(str(params["filetype"])) or conf.get(FILETYPE)
    if not isinstance(section, dict):
        raise FormatError(f"{str(path)!r} has no [raw_csr] section naming the three files")
    return {"params": params, "files": section}


def _positive_ints(value: Any, key: str, path: Path) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    ):
        raise FormatError(
            f"{str(path)!r}: [params] {key} must be a list of positive integers, got {value!r}"
        )
    return tuple(int(v) for v in value)


def _pair(value: Any, key: str, path: Path) -> tuple[int, int]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    ):
        raise FormatError(
            f"{str(path)!r}: [params] {key} must be [rows, cols] of positive integers, got "
            f"{value!r}"
        )
    return int(value[0]), int(value[1])


class RawCsrSource(FrameSource):
    """A ``raw_csr`` descriptor and its three binary files (see the module docstring).

    Parameters
    ----------
    path
        The TOML descriptor; the files it names are found beside it.
    scan_shape
        ``(rows, cols)`` to use instead of the descriptor's ``nav_shape``
        (recorded); it must cover the file's frames after ``frame_offset``.
    frame_offset
        Leading frames to skip (flyback frames).
    """

    format: ClassVar[str] = "raw_csr"
    native_representation: ClassVar[str] = "paired"
    payload_representations: ClassVar[frozenset[str]] = frozenset({"paired"})

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scan_shape: Sequence[int] | str | None = None,
        frame_offset: int = 0,
    ) -> None:
        self._path = check_exists(path, what="raw_csr descriptor")
        conf = _descriptor(self._path)
        params, files = conf["params"], conf["files"]
        nav = _positive_ints(params.get("nav_shape"), "nav_shape", self._path)
        self._sig = _pair(params.get("sig_shape"), "sig_shape", self._path)
        self._files: dict[str, Path] = {}
        self._dtypes: dict[str, np.dtype[Any]] = {}
        self._counts: dict[str, int] = {}
        self._handle_files: PositionalFiles | None = None
        for name in _FILES:
            fkey, dkey = f"{name}_file", f"{name}_dtype"
            if not isinstance(files.get(fkey), str) or not isinstance(files.get(dkey), str):
                raise FormatError(
                    f"{str(self._path)!r}: [raw_csr] needs {fkey} and {dkey} (text), got "
                    f"{files.get(fkey)!r} and {files.get(dkey)!r}"
                )
            target = Path(files[fkey])
            target = target if target.is_absolute() else self._path.parent / target
            if not target.is_file():
                raise SourceNotFoundError(
                    f"the {name} file {str(target)!r} named by {fkey} in {str(self._path)!r} "
                    "does not exist; put it beside the descriptor or fix the name"
                )
            try:
                dt = np.dtype(files[dkey])
            except TypeError as exc:
                raise DtypeError(
                    f"{str(self._path)!r}: {dkey} = {files[dkey]!r} is not a dtype ({exc})"
                ) from exc
            wanted = "iu" if name != "data" else "iuf"
            if dt.kind not in wanted:
                raise DtypeError(
                    f"{str(self._path)!r}: {dkey} = {files[dkey]!r}; the {name} must be "
                    + ("integers" if name != "data" else "integer or real values")
                )
            size = path_size(target)
            if size % dt.itemsize:
                raise FormatError(
                    f"the {name} file {str(target)!r} has {size} bytes, not a whole number of "
                    f"{dt.itemsize}-byte {dt}: truncated or the wrong dtype"
                )
            self._files[name] = target
            self._dtypes[name] = dt
            self._counts[name] = size // dt.itemsize
        if self._counts["indices"] != self._counts["data"]:
            raise FormatError(
                f"{str(self._path)!r}: indices ({self._counts['indices']}) and data "
                f"({self._counts['data']}) must hold one entry each per stored value"
            )
        if self._counts["indptr"] < 1:
            raise FormatError(f"the indptr file of {str(self._path)!r} is empty")
        indptr = self._read("indptr", 0, self._counts["indptr"]).astype(np.int64)
        bad = np.flatnonzero(np.diff(indptr) < 0)
        if bad.size or indptr[0] < 0 or indptr[-1] > self._counts["data"]:
            where = (
                f"it decreases at frame {int(bad[0])}"
                if bad.size
                else f"it runs from {int(indptr[0])} to {int(indptr[-1])}"
            )
            raise FormatError(
                f"the indptr file of {str(self._path)!r} is not a CSR row index: {where} "
                f"(it must not decrease, start at >= 0 and end at most at the "
                f"{self._counts['data']} stored values)"
            )
        self._indptr = indptr
        value_dtype = self._dtypes["data"].newbyteorder("=")
        if value_dtype.kind != "u":  # pairs hold non-negative counts: other values open dense
            self.native_representation = "dense"  # type: ignore[misc]
            self.payload_representations = frozenset()  # type: ignore[misc]
        given = scan_shape is not None
        if not given and len(nav) > 2:
            raise ScanShapeError(
                f"{str(self._path)!r}: nav_shape {list(nav)} has {len(nav)} axes; a 4D-STEM "
                "scan is rows x cols: pass scan_shape=(rows, cols) covering its "
                f"{math.prod(nav)} frames"
            )
        scan = nav if len(nav) == 2 else (1, nav[0])
        how = f"the descriptor's nav_shape {list(nav)}" + (
            " (one line: read as one row)" if len(nav) == 1 else ""
        )
        self._set_frames(
            n_frames=len(indptr) - 1,
            frame_shape=self._sig,
            dtype=value_dtype,
            scan_shape=scan_shape if given else scan,
            path=None,
            frame_offset=frame_offset,
            scan_shape_from=None if given else how,
        )
        self._nav = nav

    # -- reading ------------------------------------------------------------------------
    def _file(self, name: str) -> PositionalFile:
        if self._handle_files is None:
            self._handle_files = PositionalFiles()
        return self._handle_files.get(self._files[name])

    def _read(self, name: str, start: int, stop: int) -> np.ndarray:
        """Entries ``[start, stop)`` of one of the three files, native byte order."""
        dt = self._dtypes[name]
        out = np.empty(stop - start, dtype=dt)
        if stop > start:
            self._file(name).readinto(
                start * dt.itemsize, out, what=f"entries [{start}, {stop}) of the {name} file"
            )
        return out.astype(dt.newbyteorder("="), copy=False)

    def _triples(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Frames ``[start, stop)``: their row pointers (from 0), pixel indices and values."""
        ptr = self._indptr[start : stop + 1]
        indices = self._read("indices", int(ptr[0]), int(ptr[-1]))
        values = self._read("data", int(ptr[0]), int(ptr[-1]))
        n_pixels = self._sig[0] * self._sig[1]
        outside = np.flatnonzero((indices < 0) | (indices >= n_pixels))
        if outside.size:
            frame = start + int(np.searchsorted(ptr, int(ptr[0]) + outside[0], "right")) - 1
            raise CorruptChunkError(
                f"frame {frame} of {str(self._path)!r} names detector pixel "
                f"{int(indices[outside[0]])}, outside the {self._sig[0]} x {self._sig[1]} "
                "detector (sig_shape); the indices file is damaged or the descriptor's "
                "sig_shape wrong"
            )
        return ptr - ptr[0], indices.astype(np.int64, copy=False), values

    def read_payload(
        self, representation: str, rows: tuple[int, int], cols: tuple[int, int], **options: Any
    ) -> PairedPayload:
        """A scan block as pairs, from its own slice of the files (no dense intermediate).

        ``threshold=`` is left pending in the payload (applied after any
        detector crop or binning, as for a conversion from dense).
        """
        import dataclasses

        if representation != "paired" or "paired" not in self.payload_representations:
            return super().read_payload(representation, rows, cols, **options)  # type: ignore[no-any-return]
        unknown = set(options) - {"threshold"}
        if unknown:
            raise ParameterError(
                f"unknown option(s) {sorted(unknown)} for paired reads of a raw_csr file; it "
                "takes threshold="
            )
        self.check_block(rows, cols)
        C = self._scan.shape[1]
        off = self._scan.frame_offset
        parts = []
        if (cols[0], cols[1]) == (0, C):
            parts.append(self._triples(off + rows[0] * C, off + rows[1] * C))
        else:
            for r in range(rows[0], rows[1]):
                parts.append(self._triples(off + r * C + cols[0], off + r * C + cols[1]))
        ptrs = [p[0] for p in parts]
        offsets = np.cumsum([0] + [int(p[-1]) for p in ptrs[:-1]])
        ptr = np.concatenate(
            [np.zeros(1, np.int64)] + [p[1:] + o for p, o in zip(ptrs, offsets, strict=True)]
        )
        indices = np.concatenate([p[1] for p in parts])
        values = np.concatenate([p[2] for p in parts])
        payload = self._pairs(ptr, indices, values, (rows[1] - rows[0], cols[1] - cols[0]))
        threshold = check_threshold(options.get("threshold"))
        if threshold is not None:
            payload = dataclasses.replace(payload, pending_threshold=threshold)
        return payload

    def _pairs(
        self, ptr: np.ndarray, indices: np.ndarray, values: np.ndarray, scan: tuple[int, int]
    ) -> PairedPayload:
        n_pixels = self._sig[0] * self._sig[1]
        out_ptr = np.empty_like(ptr)
        out_idx = np.empty(indices.shape[0], dtype=np.int64)
        out_val = np.empty(indices.shape[0], dtype=np.uint64)
        peak, wrapped = _merge_pairs(
            ptr, indices, values.astype(np.uint64), out_ptr, out_idx, out_val
        )
        peak = int(peak)
        limit = int(np.iinfo(self._dtype).max)
        if wrapped:
            raise CorruptChunkError(
                f"{str(self._path)!r}: a pixel's values sum beyond 2**64 - 1 within one frame "
                f"(the {self._dtype} the data file declares holds at most {limit}); the file "
                "is damaged"
            )
        if peak > limit:
            raise CorruptChunkError(
                f"{str(self._path)!r}: a pixel's values sum to {peak} within one frame, beyond "
                f"the {self._dtype} the data file declares (max {limit}); the file is damaged "
                "or data_dtype too narrow"
            )
        n = int(out_ptr[-1])
        return PairedPayload(
            scan_shape=scan,
            frame_shape=self._sig,
            indptr=out_ptr,
            indices=out_idx[:n].astype(index_dtype_for(n_pixels)),
            counts=out_val[:n].astype(counts_dtype_for(max(peak, 1))),
            value_dtype=self._dtype,
        )

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Frames ``[start, stop)`` made dense (absolute, offset included)."""
        target = self._frames_target(start, stop, out)
        kr, kc = self._sig
        ptr, indices, values = self._triples(start, stop)
        flat = target.reshape(stop - start, kr * kc)
        flat[...] = 0
        if self._dtype.kind == "u":
            payload = self._pairs(ptr, indices, values, (1, stop - start))
            if payload.n_events:
                _scatter(payload.indptr, payload.indices, payload.counts, flat)
        else:  # signed or real values: added where they are, repeated pixels summed
            frame = np.repeat(np.arange(stop - start), np.diff(ptr))
            if self._dtype.kind == "f":
                np.add.at(flat, (frame, indices), values.astype(self._dtype, copy=False))
            else:
                flat[...] = self._signed_sums(frame, indices, values, flat.shape)
        return self._delivered(target, out)

    def _signed_sums(
        self, frame: np.ndarray, indices: np.ndarray, values: np.ndarray, shape: tuple[int, int]
    ) -> np.ndarray:
        """Signed values summed per pixel in 64 bits, refused when a sum leaves the dtype."""
        wide = np.zeros(shape, dtype=np.int64)
        np.add.at(wide, (frame, indices), values.astype(np.int64, copy=False))
        info = np.iinfo(self._dtype)
        low, high = int(wide.min(initial=0)), int(wide.max(initial=0))
        off = 0.0
        if self._dtype.itemsize == 8:  # only int64 values can wrap the 64-bit sums
            check = np.zeros(shape, dtype=np.float64)  # a wrapped sum is 2**64 away
            np.add.at(check, (frame, indices), values.astype(np.float64, copy=False))
            off = float(np.max(np.abs(check - wide), initial=0.0))
        if low < info.min or high > info.max or off > 2.0**62:
            shown: float = low if low < info.min else high
            if off > 2.0**62:  # the 64-bit sum wrapped: show the real one, about
                shown = float(check.flat[np.argmax(np.abs(check - wide))])
            raise CorruptChunkError(
                f"{str(self._path)!r}: a pixel's values sum to {shown:.6g} within one frame, "
                f"beyond the {self._dtype} "
                f"the data file declares ({info.min}..{info.max}); the file is damaged or "
                "data_dtype too narrow"
            )
        return wide

    # -- description ----------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The descriptor."""
        return self._path

    @property
    def identity(self) -> SourceIdentity:
        """The descriptor and its three files, with sizes, and a digest of the descriptor."""
        files = [self._path, *(self._files[n] for n in _FILES)]
        return SourceIdentity(
            format=self.format,
            paths=tuple(str(p) for p in files),
            file_sizes=tuple(path_size(p) for p in files),
            header_sha256=header_digest(self._path.read_bytes()),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """The descriptor's shapes, the files, their dtypes and the stored values."""
        return {
            "nav_shape": list(self._nav),
            "sig_shape": list(self._sig),
            "files": {n: str(self._files[n]) for n in _FILES},
            "dtypes": {n: self._dtypes[n].str for n in _FILES},
            "stored_values": int(self._indptr[-1] - self._indptr[0]),
            **self.scan_metadata(),
        }

    def close(self) -> None:
        """Close the files."""
        if self._handle_files is not None:
            self._handle_files.close()


@numba.njit(cache=True, nogil=True)
def _merge_pairs(ptr, indices, values, out_ptr, out_idx, out_val):  # type: ignore[no-untyped-def]  # pragma: no cover - jitted
    """Per frame: sort by pixel, sum repeated pixels, drop zeros; the largest sum, and a wrap."""
    peak = np.uint64(0)
    wrapped = False
    w = 0
    out_ptr[0] = 0
    for f in range(ptr.shape[0] - 1):
        a, b = ptr[f], ptr[f + 1]
        order = np.argsort(indices[a:b], kind="mergesort")
        last = -1
        for t in range(order.shape[0]):
            j = a + order[t]
            pix = indices[j]
            v = values[j]
            if pix == last:
                total = out_val[w - 1] + v
                if total < v:  # the 64-bit sum wrapped
                    wrapped = True
                out_val[w - 1] = total
            else:
                out_idx[w] = pix
                out_val[w] = v
                w += 1
                last = pix
        # drop the pixels whose values summed to zero (a stored zero)
        k = out_ptr[f]
        for t in range(out_ptr[f], w):
            if out_val[t] != 0:
                out_idx[k] = out_idx[t]
                out_val[k] = out_val[t]
                if out_val[t] > peak:
                    peak = out_val[t]
                k += 1
        w = k
        out_ptr[f + 1] = w
    return peak, wrapped
