"""Electron-counted HDF5 files in the NCEM 4D Camera / stempy layout.

The layout (stempy's ``docs/StempyH5Format.md``)::

    /electron_events/frames          1-D, variable-length uint32: one array
                                     of flat pixel indices per frame entry;
                                     one element = one electron, a repeated
                                     index = a count > 1
        attrs Nx, Ny                 detector width (columns), height (rows)
          or  frame_dimensions       (width, height)
    /electron_events/scan_positions  flat scan index of each frame entry
        attrs Nx, Ny                 scan width (columns), height (rows)
          or  scan_dimensions        (width, height)
    (root attr version)              3 for stempy's SparseArray writer

A flat pixel index is ``r * k_c + c`` and a flat scan index ``R_r * R_c``
row-major, in (row, column) order.  The file stores the ``paired``
representation natively: :func:`quantem_flow.open` gives a paired dataset
whose chunks are built from the events with no dense intermediate;
``ds.to_representation("dense")`` densifies explicitly.

Scan positions may come in any order, be missing (those frames are empty:
all zero) or repeated (their events are summed); each case is recorded as a
note with the number of positions concerned.  stempy's multi-frame layout
(``version >= 3`` with ``len(frames) = k * len(scan_positions)``; entry ``e``
belongs to ``scan_positions[e // k]``) is read the same way, summing the
``k`` frames of a position (recorded).

The dense values are counts in ``dtype`` (``uint32`` by default, like
stempy's own expansions); a count that does not fit a smaller ``dtype=``
raises rather than wraps.

Notes
-----
stempy's ``SparseArray.write_to_hdf5`` stores ``frames.attrs["Nx"]`` as the
first frame axis, contrary to its format document (``Nx`` = width).  For the
square 576 x 576 4D Camera the two agree; for a non-square detector this
reader follows the document (``Nx`` = columns) and :func:`write_counted`
writes it that way.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..errors import (
    CorruptChunkError,
    DtypeError,
    FormatError,
    ParameterError,
    ScanShapeError,
    ShapeError,
)
from ..representations.paired import (
    Paired,
    PairedPayload,
    _scatter,
    check_threshold,
    pairs_from_events,
)
from .base import FrameSource, SourceIdentity, check_exists, header_digest, path_size
from .hdf5 import attribute_value, open_h5, read_attribute, read_attributes
from .sniffers import COUNTED_FRAMES
from .sniffers import counted as sniff

if TYPE_CHECKING:
    from ..dataset import Dataset4D

__all__ = ["COUNTED_FRAMES", "COUNTED_POSITIONS", "CountedSource", "sniff", "write_counted"]

#: Path of the flat scan index of each frame entry.
COUNTED_POSITIONS = "/electron_events/scan_positions"


@dataclasses.dataclass(frozen=True)
class _PositionIndex:
    """Which frame entries belong to each scan position (CSR over positions)."""

    ptr: np.ndarray  # int64 (R*C + 1,)
    entries: np.ndarray  # int64 entry ids grouped by position, in file order within one


#: Scan positions beyond this many times the frame entries are a damaged header, not a
#: sparse acquisition (opening one would allocate per declared position).
GROSS_FILL_FACTOR = 16


def _shape_from_attrs(
    attrs: dict[str, Any], pair_key: str, what: str, where: str
) -> tuple[int, int] | None:
    """``(rows, cols)`` from ``Nx`` (width) / ``Ny`` (height) or ``pair_key`` = (width, height)."""
    found: list[tuple[int, int]] = []
    if "Nx" in attrs and "Ny" in attrs:
        try:
            found.append((int(attrs["Ny"]), int(attrs["Nx"])))
        except (TypeError, ValueError) as exc:
            raise FormatError(
                f"{where}: attributes Nx={attrs['Nx']!r}, Ny={attrs['Ny']!r} are not integers"
            ) from exc
    if pair_key in attrs:
        v = attrs[pair_key]
        try:
            w, h = (int(x) for x in (v if isinstance(v, (list, tuple)) else list(v)))
        except (TypeError, ValueError) as exc:
            raise FormatError(
                f"{where}: attribute {pair_key}={v!r} must be (width, height)"
            ) from exc
        found.append((h, w))
    if not found:
        return None
    if len(found) == 2 and found[0] != found[1]:
        raise FormatError(
            f"{where}: Nx/Ny give a {what} of {found[0]} (rows, cols) but {pair_key} gives "
            f"{found[1]}; pass the right one explicitly"
        )
    shape = found[0]
    if min(shape) < 1:
        raise FormatError(f"{where}: {what} {shape} (rows, cols) is empty")
    return shape


class CountedSource(FrameSource):
    """An electron-counted HDF5 file (NCEM 4D Camera / stempy layout).

    Parameters
    ----------
    path
        The HDF5 file.
    scan_shape
        ``(rows, cols)``; needed only when ``scan_positions`` carries no
        ``Nx``/``Ny`` (or ``scan_dimensions``) attributes, else it must agree.
    frame_shape
        ``(k_r, k_c)``; needed only when ``frames`` carries no ``Nx``/``Ny``
        (or ``frame_dimensions``) attributes, else it must agree.
    dtype
        Unsigned integer dtype of the dense counts (default ``uint32``).
    """

    format: ClassVar[str] = "counted"
    native_representation: ClassVar[str] = "paired"
    payload_representations: ClassVar[frozenset[str]] = frozenset({"paired"})

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scan_shape: Sequence[int] | None = None,
        frame_shape: Sequence[int] | None = None,
        dtype: Any = "uint32",
    ):
        import h5py

        self._path = check_exists(path)
        self._handle_file: Any = None
        self._handle_frames: Any = None
        self._handle_index: _PositionIndex | None = None
        value_dtype = np.dtype(dtype)
        if value_dtype.kind != "u":
            raise DtypeError(
                f"counted data are non-negative counts; dtype must be an unsigned integer, got "
                f"{value_dtype}"
            )
        where = str(self._path)
        with open_h5(self._path) as f:
            frames = f.get(COUNTED_FRAMES)
            if not isinstance(frames, h5py.Dataset):
                raise FormatError(
                    f"{where!r} has no dataset {COUNTED_FRAMES!r}; it is not an electron-counted "
                    "(stempy) file. Open it with format='hdf5' if it holds dense frames"
                )
            base = h5py.check_vlen_dtype(frames.dtype)
            if frames.ndim != 1 or base is None or np.dtype(base).kind not in "ui":
                raise FormatError(
                    f"{COUNTED_FRAMES!r} in {where!r} must be a 1-D dataset of variable-length "
                    f"integer arrays, got shape {frames.shape} dtype {frames.dtype}"
                )
            self._event_dtype = str(np.dtype(base))
            self._n_entries = int(frames.shape[0])
            frame_attrs = read_attributes(frames)
            pos_obj = f.get(COUNTED_POSITIONS)
            pos_attrs: dict[str, Any] = {}
            positions: np.ndarray | None = None
            if pos_obj is not None:
                if not isinstance(pos_obj, h5py.Dataset) or pos_obj.ndim != 1:
                    raise FormatError(f"{COUNTED_POSITIONS!r} in {where!r} must be a 1-D dataset")
                pos_attrs = read_attributes(pos_obj)
                try:
                    positions = np.asarray(pos_obj[()], dtype=np.int64)
                except (OSError, ValueError, TypeError) as exc:
                    raise CorruptChunkError(
                        f"could not read {COUNTED_POSITIONS!r} of {where!r}: {exc}"
                    ) from exc
            version = read_attribute(f, "version")
            self._version = None if version is None else attribute_value(version)
            root_attrs = read_attributes(f)
        self._frame_attrs = frame_attrs
        self._pos_attrs = pos_attrs
        self._root_attrs = root_attrs
        self._open_notes: list[str] = []

        det = _shape_from_attrs(
            frame_attrs, "frame_dimensions", "detector shape", f"{where!r} {COUNTED_FRAMES}"
        )
        det = self._given_or_read(det, frame_shape, "frame_shape", "detector")
        scan = _shape_from_attrs(
            pos_attrs, "scan_dimensions", "scan shape", f"{where!r} {COUNTED_POSITIONS}"
        )
        scan = self._given_or_read(scan, scan_shape, "scan_shape", "scan")
        n_pos = scan[0] * scan[1]
        self._entry_positions_digest = header_digest(
            b"" if positions is None else positions.tobytes()
        )
        self._layout = self._map_entries(positions, n_pos)
        self._set_frames(
            n_frames=n_pos, frame_shape=det, dtype=value_dtype, scan_shape=scan, path=None
        )

    # -- opening --------------------------------------------------------------------
    def _given_or_read(
        self,
        read: tuple[int, int] | None,
        given: Sequence[int] | None,
        name: str,
        what: str,
    ) -> tuple[int, int]:
        err = ScanShapeError if what == "scan" else ShapeError
        if given is not None:
            try:
                g = tuple(int(v) for v in given)
            except (TypeError, ValueError) as exc:
                raise err(f"{name} must be (rows, cols), got {given!r}") from exc
            if len(g) != 2 or min(g) < 1:
                raise err(f"{name} must be two positive integers (rows, cols), got {given!r}")
            if read is not None and read != g:
                raise err(
                    f"{name}={g} was given but {str(self._path)!r} records a {what} shape of "
                    f"{read} (rows, cols); leave {name} out to use the file's"
                )
            if read is None:
                self._open_notes.append(f"{what} shape {g} given (the file records none)")
            return (g[0], g[1])
        if read is None:
            pair = "frame_dimensions" if what == "detector" else "scan_dimensions"
            attrs = f"Nx/Ny (or {pair})"
            raise err(
                f"{str(self._path)!r} records no {what} shape (no {attrs} attributes); pass "
                f"{name}=(rows, cols)"
            )
        return read

    def _map_entries(self, positions: np.ndarray | None, n_pos: int) -> dict[str, Any]:
        """Validate how frame entries map to scan positions; record what is unusual."""
        n_ent = self._n_entries
        where = str(self._path)
        per_entry = 1
        if n_pos > GROSS_FILL_FACTOR * max(n_ent, 1) and n_pos - n_ent > 65536:
            raise FormatError(
                f"{where!r} declares {n_pos} scan positions but holds {n_ent} frame entries: "
                f"more than {GROSS_FILL_FACTOR}x as many positions as frames, which no real "
                "acquisition has; the scan shape attributes (Nx/Ny or scan_dimensions of "
                f"{COUNTED_POSITIONS}) are damaged. Repair them, or copy the frames into a file "
                "with the right scan shape"
            )
        if positions is None:
            if n_ent != n_pos:
                raise FormatError(
                    f"{where!r} has no {COUNTED_POSITIONS!r} and {n_ent} frame entries for "
                    f"{n_pos} scan positions; cannot tell which frame is where"
                )
            self._open_notes.append(
                f"{COUNTED_POSITIONS} is absent: the {n_ent} frame entries are taken in scan order"
            )
            return {"identity": True, "per_entry": 1, "missing": 0, "repeated": 0}
        if positions.shape[0] != n_ent:
            k = n_ent // max(positions.shape[0], 1)
            if positions.shape[0] and k > 1 and k * positions.shape[0] == n_ent:
                per_entry = k
                self._open_notes.append(
                    f"{n_ent} frame entries for {positions.shape[0]} scan_positions (stempy's "
                    f"multi-frame layout): the {k} frames recorded at each position are summed"
                )
            else:
                raise FormatError(
                    f"{where!r}: {COUNTED_FRAMES} holds {n_ent} entries but {COUNTED_POSITIONS} "
                    f"holds {positions.shape[0]}; expected one position per entry (or a whole "
                    "number of entries per position)"
                )
        bad = (positions < 0) | (positions >= n_pos)
        if bad.any():
            first = np.flatnonzero(bad)[:5].tolist()
            raise FormatError(
                f"{where!r}: {int(bad.sum())} scan positions lie outside the {n_pos} positions of "
                f"the scan (entries {first}: {positions[first].tolist()}); the scan shape "
                "attributes or scan_shape= do not match the data"
            )
        hits = np.bincount(positions, minlength=n_pos) * per_entry
        missing = int(np.count_nonzero(hits == 0))
        repeated = int(np.count_nonzero(hits > per_entry))
        in_order = (
            per_entry == 1 and n_ent == n_pos and bool(np.array_equal(positions, np.arange(n_pos)))
        )
        if not in_order and per_entry == 1 and not missing and not repeated:
            self._open_notes.append(
                "frame entries are not in scan order; each is placed by its scan position"
            )
        if missing:
            self._open_notes.append(
                f"{missing} of {n_pos} scan positions have no frame entry; they read as empty "
                "frames (all zero)"
            )
        if repeated:
            extra = int(hits[hits > per_entry].sum() - per_entry * repeated)
            self._open_notes.append(
                f"{repeated} scan positions have several frame entries ({extra} extra); their "
                "events are summed"
            )
        return {
            "identity": in_order,
            "per_entry": per_entry,
            "missing": missing,
            "repeated": repeated,
        }

    # -- file access --------------------------------------------------------------------
    def _frames(self) -> Any:
        if self._handle_frames is None:
            self._handle_file = open_h5(self._path)
            self._handle_frames = self._handle_file[COUNTED_FRAMES]
        return self._handle_frames

    def _index(self) -> _PositionIndex:
        if self._handle_index is None:
            n_pos = self.shape[0] * self.shape[1]
            self._frames()
            try:
                pos = np.asarray(self._handle_file[COUNTED_POSITIONS][()], dtype=np.int64)
            except (OSError, ValueError, TypeError, KeyError) as exc:
                raise CorruptChunkError(
                    f"could not read {COUNTED_POSITIONS!r} of {str(self._path)!r}: {exc}"
                ) from exc
            k = int(self._layout["per_entry"])
            entry_pos = np.repeat(pos, k) if k > 1 else pos
            if entry_pos.shape[0] != self._n_entries or (
                entry_pos.size and (entry_pos.min() < 0 or entry_pos.max() >= n_pos)
            ):
                raise CorruptChunkError(
                    f"{COUNTED_POSITIONS!r} of {str(self._path)!r} changed since the file was "
                    "opened; reopen it"
                )
            order = np.argsort(entry_pos, kind="stable")
            ptr = np.zeros(n_pos + 1, dtype=np.int64)
            np.cumsum(np.bincount(entry_pos, minlength=n_pos), out=ptr[1:])
            self._handle_index = _PositionIndex(ptr=ptr, entries=order.astype(np.int64))
        return self._handle_index

    def _read_entries(self, ids: np.ndarray, what: str) -> list[np.ndarray]:
        """Read the event arrays of sorted unique frame entries ``ids``."""
        if ids.size == 0:
            return []
        dset = self._frames()
        out: list[np.ndarray] = []
        lo, hi = int(ids[0]), int(ids[-1]) + 1
        try:
            if hi - lo <= 2 * ids.size + 64:  # one read of the span, then pick
                block = dset[lo:hi]
                out = [block[i - lo] for i in ids.tolist()]
            else:  # runs of consecutive entries
                breaks = np.flatnonzero(np.diff(ids) != 1) + 1
                for run in np.split(ids, breaks):
                    out.extend(dset[int(run[0]) : int(run[-1]) + 1])
        except (OSError, ValueError, RuntimeError, TypeError) as exc:
            raise CorruptChunkError(
                f"could not read or decode frame entries [{lo}, {hi}) ({what}) of "
                f"{COUNTED_FRAMES!r} in {str(self._path)!r}: {exc}. The file may be truncated "
                "or corrupt; results computed so far are kept"
            ) from exc
        return out

    def _events(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Events of flat scan ``positions``: ``(ev_ptr (n+1,), events)``."""
        n = positions.shape[0]
        what = f"scan positions [{int(positions[0])}, {int(positions[-1]) + 1})" if n else "nothing"
        if self._layout["identity"]:
            entries = positions.astype(np.int64)
            entry_ptr = np.arange(n + 1, dtype=np.int64)
        else:
            idx = self._index()
            starts, stops = idx.ptr[positions], idx.ptr[positions + 1]
            lens = stops - starts
            entry_ptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lens, out=entry_ptr[1:])
            total = int(entry_ptr[-1])
            # entries of every position, in position order
            offs = np.arange(total, dtype=np.int64) - np.repeat(entry_ptr[:-1], lens)
            entries = idx.entries[np.repeat(starts, lens) + offs]
        uniq, inverse = np.unique(entries, return_inverse=True)
        arrays = self._read_entries(uniq, what)
        pieces = [arrays[i] for i in inverse.tolist()]
        lengths = np.fromiter((a.shape[0] for a in pieces), dtype=np.int64, count=len(pieces))
        ev_entry_ptr = np.zeros(len(pieces) + 1, dtype=np.int64)
        np.cumsum(lengths, out=ev_entry_ptr[1:])
        ev_ptr = ev_entry_ptr[entry_ptr]
        events = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint32)
        K = self._frame_shape[0] * self._frame_shape[1]
        if events.size and (int(events.min()) < 0 or int(events.max()) >= K):
            bad_ev = np.flatnonzero((events < 0) | (events >= K))
            frames = np.unique(np.searchsorted(ev_ptr, bad_ev, side="right") - 1)
            bad_pos = positions[frames[:10]].tolist()
            raise CorruptChunkError(
                f"{COUNTED_FRAMES!r} in {str(self._path)!r} holds {bad_ev.size} pixel indices "
                f"outside the {self._frame_shape[0]} x {self._frame_shape[1]} detector in "
                f"{frames.size} frames (flat scan positions {bad_pos}"
                f"{'...' if frames.size > 10 else ''}); the file is corrupt or its Nx/Ny "
                "attributes are wrong"
            )
        return ev_ptr, events

    def _payload(
        self, positions: np.ndarray, scan_shape: tuple[int, int], threshold: int | None
    ) -> PairedPayload:
        ev_ptr, events = self._events(positions)
        try:
            return pairs_from_events(
                ev_ptr, events, scan_shape, self._frame_shape, self._dtype, threshold=threshold
            )
        except ParameterError as exc:
            raise ParameterError(
                f"{str(self._path)!r}: {exc}; open it with dtype='uint32' (or larger)"
            ) from exc

    # -- Source API --------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The file."""
        return self._path

    @property
    def identity(self) -> SourceIdentity:
        """Path, size and a digest of the layout, attributes and scan positions."""
        return SourceIdentity(
            format=self.format,
            paths=(str(self._path),),
            file_sizes=(path_size(self._path),),
            header_sha256=header_digest(
                COUNTED_FRAMES,
                self._n_entries,
                self._event_dtype,
                sorted(self._frame_attrs.items()),
                sorted(self._pos_attrs.items()),
                sorted(self._root_attrs.items()),
                self._entry_positions_digest,
                str(self._dtype),
            ),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """Layout, attributes and how frame entries map to scan positions."""
        return {
            "layout": "stempy electron_events (one event = one count)",
            "frames_path": COUNTED_FRAMES,
            "scan_positions_path": COUNTED_POSITIONS,
            "version": self._version,
            "n_entries": self._n_entries,
            "event_dtype": self._event_dtype,
            "frames_attributes": self._frame_attrs,
            "scan_positions_attributes": self._pos_attrs,
            "entries_in_scan_order": bool(self._layout["identity"]),
            "frames_per_position_entry": int(self._layout["per_entry"]),
            "missing_positions": int(self._layout["missing"]),
            "repeated_positions": int(self._layout["repeated"]),
            "value_dtype": str(self._dtype),
            **self.scan_metadata(),
        }

    def read_payload(
        self, representation: str, rows: tuple[int, int], cols: tuple[int, int], **options: Any
    ) -> PairedPayload:
        """Read a scan block as pairs, with no dense intermediate.

        Parameters
        ----------
        representation
            ``"paired"``.
        rows, cols
            Half-open scan ranges.
        **options
            ``threshold=``: values below it are to be dropped (only when
            asked; recorded).  It is left pending in the payload and applied
            by :meth:`~quantem_flow.representations.paired.Paired.apply_detector_ops`
            after any detector crop or binning, so that it acts on the values
            as the dataset presents them, exactly as a conversion from dense
            does.
        """
        if representation != "paired":
            return super().read_payload(representation, rows, cols, **options)  # type: ignore[no-any-return]
        unknown = set(options) - {"threshold"}
        if unknown:
            raise ParameterError(
                f"unknown option(s) {sorted(unknown)} for paired reads of a counted file; it "
                "takes threshold="
            )
        self.check_block(rows, cols)
        C = self.shape[1]
        r = np.arange(rows[0], rows[1], dtype=np.int64)
        c = np.arange(cols[0], cols[1], dtype=np.int64)
        positions = (r[:, None] * C + c[None, :]).ravel()
        threshold = check_threshold(options.get("threshold"))
        payload = self._payload(positions, (rows[1] - rows[0], cols[1] - cols[0]), None)
        if threshold is not None:
            payload = dataclasses.replace(payload, pending_threshold=threshold)
        return payload

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Densify scan positions ``[start, stop)`` (only for explicit dense use)."""
        positions = np.arange(start, stop, dtype=np.int64)
        payload = self._payload(positions, (1, stop - start), None)
        kr, kc = self._frame_shape
        if out is None or out.dtype != self._dtype or not out.flags.c_contiguous:
            dense = Paired().to_dense(payload).reshape(stop - start, kr, kc)
            if out is not None:
                out[...] = dense
                return out
            return dense
        out[...] = 0
        if payload.n_events:
            _scatter(payload.indptr, payload.indices, payload.counts, out.reshape(stop - start, -1))
        return out

    def close(self) -> None:
        """Close the file."""
        if self._handle_file is not None:
            self._handle_file.close()
        self._handle_file = None
        self._handle_frames = None


#: Events written per HDF5 call at most (bounds the writer's memory on high-dose data).
WRITE_BATCH_EVENTS = 1 << 24


def _write_events(frames: Any, first: int, payload: PairedPayload) -> None:
    """Write a payload's frames as one event per count, in batches of whole frames."""
    cum = np.zeros(payload.n_events + 1, dtype=np.int64)
    np.cumsum(payload.counts, dtype=np.int64, out=cum[1:])
    ev_ptr = cum[payload.indptr]  # events before each frame
    n = payload.n_frames
    i = 0
    while i < n:
        # at least one frame, then as many as fit in the batch
        j = max(i + 1, int(np.searchsorted(ev_ptr, ev_ptr[i] + WRITE_BATCH_EVENTS, "right")) - 1)
        j = min(j, n)
        a, b = int(payload.indptr[i]), int(payload.indptr[j])
        events = np.repeat(payload.indices[a:b].astype(np.uint32), payload.counts[a:b])
        # an array of the dataset's vlen dtype written directly: h5py's
        # __setitem__ would read equal-length frames as one 2-D array
        obj = np.empty(j - i, dtype=frames.dtype)
        base = int(ev_ptr[i])
        for k in range(i, j):
            obj[k - i] = events[int(ev_ptr[k]) - base : int(ev_ptr[k + 1]) - base]
        frames.write_direct(obj, dest_sel=np.s_[first + i : first + j])
        i = j


def write_counted(
    data: Dataset4D, path: str | os.PathLike[str], *, overwrite: bool = False
) -> Path:
    """Write a dataset as an electron-counted file in the stempy layout, chunk by chunk.

    A paired dataset is written as it is held (a threshold it was made with
    is recorded in the file's attributes); any other representation is
    converted to pairs exactly, each chunk checked, so only non-negative
    integer data can be written.  One event is written per count (a pixel of
    count ``k`` repeats its index ``k`` times), frames in scan order with
    ``scan_positions = arange(R_r * R_c)``; ``Nx``/``Ny`` are widths and
    heights (columns, rows), ``version = 3``.

    Parameters
    ----------
    data
        The dataset (with any regions and binning already applied).
    path
        The ``.h5`` file to write; written to ``<path>.partial`` first and
        renamed when complete.
    overwrite
        Replace an existing file.

    Returns
    -------
    Path
        The file written.

    Raises
    ------
    ParameterError
        The file exists and ``overwrite`` is false, or the data are not
        non-negative integers.
    """
    import h5py

    from .results_store import _package_version

    out = Path(path).expanduser().resolve()
    if out.exists() and not overwrite:
        raise ParameterError(f"{str(out)!r} exists; pass overwrite=True to replace it")
    ds = data if data.representation == "paired" else data.to_representation("paired")
    R, C, kr, kc = ds.shape
    if kr * kc > 2**32:
        raise ShapeError(f"a counted frame holds at most 2**32 pixels, got {kr * kc}")
    options = ds.representation_options
    threshold = options.get("threshold")
    partial = out.with_name(out.name + ".partial")
    checks: list[str] = []
    try:
        with h5py.File(partial, "w") as f:
            f.attrs["version"] = np.int32(3)
            f.attrs["written_by"] = f"quantem_flow {_package_version()}"
            f.attrs["quantem_flow_provenance"] = json.dumps(
                {
                    "source": ds.source.identity.to_dict(),
                    "transforms": ds.transforms,
                    "representation_options": {k: repr(v) for k, v in options.items()},
                    "threshold": threshold,
                    "lossless": threshold is None,
                }
            )
            group = f.create_group("electron_events")
            pos_dtype = np.int32 if R * C < 2**31 else np.int64
            sp = group.create_dataset("scan_positions", data=np.arange(R * C, dtype=pos_dtype))
            sp.attrs["Nx"] = np.int64(C)
            sp.attrs["Ny"] = np.int64(R)
            frames = group.create_dataset(
                "frames", shape=(R * C,), dtype=h5py.vlen_dtype(np.dtype(np.uint32))
            )
            frames.attrs["Nx"] = np.int64(kc)
            frames.attrs["Ny"] = np.int64(kr)
            for r0, r1 in ds.chunks:
                payload, made = ds.load_payload((r0, r1))
                if isinstance(made.get("check"), dict):
                    checks.append(str(made["check"].get("check")))
                _write_events(frames, r0 * C, payload)
            if checks:
                f.attrs["quantem_flow_conversion_checks"] = json.dumps(sorted(set(checks)))
        os.replace(partial, out)
    finally:
        if partial.exists():
            partial.unlink()
    return out
