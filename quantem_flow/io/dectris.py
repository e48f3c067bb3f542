"""Dectris Arina / Eiger NeXus files: a ``*_master.h5`` plus linked data files.

The master holds detector metadata under ``/entry/instrument/detector`` and
one link per data file under ``/entry/data`` (``data_000001``,
``data_000002``...).  Each data file holds ``/entry/data/data`` of shape
``(frames, k_r, k_c)``, usually one frame per chunk, compressed with the
bitshuffle + LZ4 filter (HDF5 filter id 32008, registered by ``hdf5plugin``).
The frames of all data files, in link-name order, form the scan in
row-major order.

Calibration recorded by the master (NeXus ``NXdetector``/``NXbeam`` fields;
a field without a ``units`` attribute is read in the NeXus default: metres
for sizes and distances, pixels for the beam centre, eV for energies, Å for
wavelengths):

- ``detector/beam_center_y``, ``beam_center_x`` -> the detector origin
  ``(row, col)`` in pixels;
- ``detector/y_pixel_size``, ``x_pixel_size`` and ``detector_distance`` ->
  ``1000 * atan(pixel_size / distance)`` mrad per pixel (row, col).  The
  distance is the one the acquisition software recorded; on a microscope it
  is the effective camera length only if it was set so (give an explicit
  calibration otherwise: it wins, and the override is recorded);
- ``/entry/instrument/beam/incident_wavelength`` (electron wavelength) or
  ``detector/detectorSpecific/photon_energy`` (beam energy in eV) -> the
  accelerating voltage.

A value outside a plausible range (10-2000 kV, a wavelength of an electron
of that energy, 0-100 mrad per pixel) is not used and a note says so; what
was used is recorded as ``calibration_from`` in :attr:`DectrisSource.metadata`.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
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
    SourceNotFoundError,
    UnsupportedOperationError,
)
from ..representations.stored import STORED_CODEC, StoredFrames, concat_stored
from .base import (
    FrameSource,
    SourceIdentity,
    calibration_choice,
    check_exists,
    header_digest,
    path_size,
    sidecar_calibration,
)
from .bslz4_read import fill_value, read_bitshuffle
from .bslz4_read import supports as bslz4_supports
from .encoded_chunks import check_bitshuffle_chunks, needs_bitshuffle_guard
from .hdf5 import dataset_filters, open_h5, read_attribute
from .sniffers import DECTRIS_DATA_GROUP as _DATA_GROUP
from .sniffers import DECTRIS_LINK_NAME as _LINK_NAME
from .sniffers import dectris_master as sniff

__all__ = ["DETECTOR_FIELDS", "DectrisSource", "sniff"]

#: Scalar fields read from ``/entry/instrument/detector`` when present.
DETECTOR_FIELDS: tuple[str, ...] = (
    "description",
    "detector_number",
    "x_pixels_in_detector",
    "y_pixels_in_detector",
    "bit_depth_image",
    "bit_depth_readout",
    "count_time",
    "frame_time",
    "x_pixel_size",
    "y_pixel_size",
    "detector_distance",
    "beam_center_x",
    "beam_center_y",
    "sensor_material",
    "sensor_thickness",
    "countrate_correction_applied",
    "flatfield_correction_applied",
    "pixel_mask_applied",
    "virtual_pixel_correction_applied",
)

#: Scalar fields read from ``/entry/instrument/detector/detectorSpecific``.
DETECTOR_SPECIFIC_FIELDS: tuple[str, ...] = (
    "nimages",
    "ntrigger",
    "software_version",
    "eiger_fw_version",
    "data_collection_date",
    "photon_energy",
)

#: Scalar fields read from ``/entry/instrument/beam``.
BEAM_FIELDS: tuple[str, ...] = ("incident_wavelength", "incident_energy")

_DETECTOR = "/entry/instrument/detector"
_BEAM = "/entry/instrument/beam"


class DectrisSource(FrameSource):
    """A Dectris Arina / Eiger acquisition opened through its master file.

    Parameters
    ----------
    path
        The master file (``*_master.h5``).
    scan_shape
        ``(rows, cols)``; ``"square"`` to assume a square scan (recorded as
        a note); ``None`` to read a JSON sidecar (``x_master.h5.json``,
        ``x_master.json`` or ``x.json``).
    frame_offset
        Leading frames to skip.

    Notes
    -----
    The detector's pixel mask (``detectorSpecific/pixel_mask``) is reported
    in :attr:`metadata` (shape and number of flagged pixels) but never
    applied: the values read are the stored counts.

    Data files are opened directly (not through the master's external
    links), one handle per file, on first read in each process.

    The ``encoded`` representation is read natively when every data file is
    chunked by whole frames with the bitshuffle + LZ4 filter the detector
    writes (or another filter :func:`~quantem_flow.io.encoded_chunks.hdf5_codec`
    takes): :meth:`read_payload` keeps the stored chunks, read with
    ``read_direct_chunk``, compressed.

    """

    format: ClassVar[str] = "dectris"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scan_shape: Sequence[int] | str | None = None,
        frame_offset: int = 0,
    ):
        import h5py

        self._path = check_exists(path, what="Dectris master file")
        self._handle_files: dict[int, tuple[Any, Any]] | None = None
        with open_h5(self._path) as f:
            group = f.get(_DATA_GROUP)
            if not isinstance(group, h5py.Group):
                raise FormatError(
                    f"{str(self._path)!r} has no {_DATA_GROUP!r} group, so it is not a Dectris "
                    "master file; open a plain HDF5 file with format='hdf5' and dataset_path="
                )
            links = _data_links(group)
            if not links:
                raise FormatError(
                    f"{str(self._path)!r} has no data_NNNNNN entries in {_DATA_GROUP!r} "
                    f"(found {sorted(group.keys())}); expected a Dectris master file with links "
                    "to its data files, or open the file with format='hdf5' and dataset_path="
                )
            self._parts = [self._resolve_link(group, name) for name in links]
            self._link_names = links
            self._detector = _detector_metadata(f)
            self._beam = _group_scalars(f, _BEAM, BEAM_FIELDS)
        layouts: list[dict[str, Any]] = []
        counts: list[int] = []
        frame_shape: tuple[int, int] | None = None
        dtype: np.dtype[Any] | None = None
        for file_path, dset_path in self._parts:
            shape, dt, layout = _probe_dataset(file_path, dset_path, self._path)
            if frame_shape is None or dtype is None:
                frame_shape, dtype = (shape[1], shape[2]), dt
            elif (shape[1], shape[2]) != frame_shape or dt != dtype:
                raise FormatError(
                    f"data file {str(file_path)!r} holds frames {shape[1:]} of {dt} but the first "
                    f"data file of {str(self._path)!r} holds {frame_shape} of {dtype}; all data "
                    "files of one acquisition must agree"
                )
            counts.append(shape[0])
            layouts.append({"shape": list(shape), "dtype": str(dt), **layout})
        assert frame_shape is not None and dtype is not None
        if dtype.kind not in "uif":
            raise DtypeError(
                f"{str(self._parts[0][0])!r} holds dtype {dtype}; expected integer or real frames"
            )
        self._counts = counts
        self._starts = [0]
        for c in counts[:-1]:
            self._starts.append(self._starts[-1] + c)
        self._layouts = layouts
        self._set_frames(
            n_frames=sum(counts),
            frame_shape=frame_shape,
            dtype=dtype,
            scan_shape=scan_shape,
            path=self._path,
            frame_offset=frame_offset,
        )

    def _resolve_link(self, group: Any, name: str) -> tuple[Path, str]:
        """Return the (file, dataset path) a ``data_NNNNNN`` entry points at."""
        import h5py

        link = group.get(name, getlink=True)
        if isinstance(link, h5py.ExternalLink):
            target = Path(link.filename)
            if not target.is_absolute():
                target = self._path.parent / target
            if not target.exists():
                raise _missing_data_file(target, name, self._path)
            return target.resolve(), str(link.path)
        if isinstance(link, h5py.HardLink):
            return self._path, f"{_DATA_GROUP}/{name}"
        if isinstance(link, h5py.SoftLink):
            return self._path, str(link.path)
        raise FormatError(
            f"{_DATA_GROUP}/{name} in {str(self._path)!r} is a {type(link).__name__}; expected an "
            "external link to a data file"
        )

    @property
    def streams_blocks(self) -> bool:
        """True when every data file stores bitshuffle frames one per chunk (the usual layout).

        A block of frames then decodes only its own chunks, so a chunk pass
        reads it in cache-sized pieces (docs/streamed-pass.md).
        """
        from .bslz4_read import decodes_whole_frames

        return bool(self._layouts) and all(
            decodes_whole_frames(layout, (1, *self._frame_shape)) for layout in self._layouts
        )

    @functools.cached_property
    def stored_frames_codec(self) -> str | None:
        """``"bitshuffle-lz4"`` when every data file stores integer frames one LZ4 chunk each.

        Read directly (io/bslz4_read.py ``stored_readable``); decided once per source.
        """
        from .bslz4_read import stored_readable

        readable = self.streams_blocks and all(
            stored_readable(self._dset(i)) for i in range(len(self._parts))
        )
        return STORED_CODEC if readable else None

    def stored_frames(
        self, start: int, stop: int, *, buffer: np.ndarray | None = None
    ) -> StoredFrames:
        """Frames ``[start, stop)`` as stored, crossing data-file boundaries as needed."""
        if self.stored_frames_codec is None:
            return super().stored_frames(start, stop, buffer=buffer)
        from .bslz4_read import read_stored

        if not 0 <= start <= stop <= self._n_frames:
            raise ShapeError(
                f"frames [{start}, {stop}) lie outside the {self._n_frames} frames of "
                f"{str(self._path)!r}"
            )
        parts: list[StoredFrames] = []
        pos = start
        while pos < stop or not parts:
            i = bisect.bisect_right(self._starts, pos) - 1
            first = self._starts[i]
            end = min(stop, first + self._counts[i])
            file_path, dset_path = self._parts[i]
            part = read_stored(
                self._dset(i),
                pos - first,
                end - first,
                where=f"dataset {dset_path!r} of data file {str(file_path)!r} (master "
                f"{str(self._path)!r}; frames numbered in the acquisition)",
                buffer=buffer if pos == start and end == stop else None,
            )
            parts.append(dataclasses.replace(part, numbers=part.numbers + first))
            pos = end
            if pos == stop:
                break
        return concat_stored(parts)

    # -- native encoded reads ---------------------------------------------------
    @property
    def integrity(self) -> tuple[bool, str]:
        """Whether every data file's chunks carry Fletcher32 checksums."""
        from .hdf5 import layout_integrity

        for (file_path, dset_path), layout in zip(self._parts, self._layouts, strict=True):
            ok, why = layout_integrity(layout, f"dataset {dset_path!r} of {str(file_path)!r}")
            if not ok:
                return ok, why
        return True, "Fletcher32 checksum per chunk in every data file, verified by HDF5"

    def _encoded_codec(self) -> tuple[str, dict[str, Any]]:
        """The codec shared by every data file's chunks, or raise why there is none."""
        from .encoded_chunks import hdf5_codec

        found: tuple[str, dict[str, Any]] | None = None
        for (file_path, dset_path), layout in zip(self._parts, self._layouts, strict=True):
            where = f"dataset {dset_path!r} of data file {str(file_path)!r}"
            codec, config = hdf5_codec(layout, self._frame_shape, 3, where)
            if found is not None and found[0] != codec:
                raise UnsupportedOperationError(
                    f"the data files of {str(self._path)!r} use different codecs ({found[0]} and "
                    f"{codec} in {str(file_path)!r}); native encoded reads need one; convert the "
                    "acquisition with `quantem-flow convert`"
                )
            found = found or (codec, {k: v for k, v in config.items() if k != "chunks"})
        assert found is not None
        return found

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
        """Read a scan block as the stored compressed chunks (``"encoded"``), not decoding.

        Every chunk holding a frame of the block is read with
        ``read_direct_chunk`` (no HDF5 filter pipeline) from its data file
        and kept as it is; the runs skip the frames of a chunk outside the
        block (column sub-ranges, ``frame_offset``, chunks of several frames).

        Raises
        ------
        UnsupportedOperationError
            If a data file's layout or filter cannot be kept compressed (the
            message names the filter and says to convert).
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
            read_hdf5_chunk,
        )

        self.check_block(rows, cols)
        codec, config = self._encoded_codec()
        check_native_options(options, codec, config)
        table = PieceTable()
        origins = tuple(
            f"dataset {d!r} of data file {str(p)!r} (master {str(self._path)!r})"
            for p, d in self._parts
        )
        fills: set[Any] = set()
        stored: set[str] = set()
        C = self._scan.shape[1]
        for start, stop in flat_frame_ranges(rows, cols, C, self._scan.frame_offset):
            pos = start
            while pos < stop:
                i = bisect.bisect_right(self._starts, pos) - 1
                first_frame = self._starts[i]
                end = min(stop, first_frame + self._counts[i])
                dset = self._dset(i)
                n = int(self._layouts[i]["chunks"][0])
                fills.add(np.asarray(fill_value(dset, str(dset.file.filename))).item())
                stored.add(np.dtype(dset.dtype).str)
                for k, first, count in flat_runs(pos - first_frame, end - first_frame, n):

                    def fetch(
                        i: int = i, k: int = k, n: int = n, dset: Any = dset
                    ) -> tuple[bytes, int, tuple[int, ...]]:
                        what = (
                            f"stored chunk {k} (frames [{k * n}, {(k + 1) * n}) of the file) of "
                            f"{origins[i]}"
                        )
                        return read_hdf5_chunk(dset, (k * n, 0, 0), what), n, (i, k)

                    table.add((i, k), first, count, fetch)
                pos = end
        if len(stored) != 1:
            raise FormatError(
                f"the data files of {str(self._path)!r} store frames as {sorted(stored)}; one "
                "acquisition must use one dtype and byte order"
            )
        return build_payload(
            scan_shape=(rows[1] - rows[0], cols[1] - cols[0]),
            frame_shape=self._frame_shape,
            value_dtype=np.dtype(stored.pop()),
            codec=codec,
            codec_config={**config, "made": "native Dectris read (read_direct_chunk)"},
            pieces=table.pieces,
            piece_frames=table.frames,
            runs=table.runs,
            origins=origins,
            piece_origin=table.origin,
            fill_value=fills.pop() if len(fills) == 1 else 0,
        )

    # -- lazily opened handles ---------------------------------------------------
    def _dset(self, index: int) -> Any:
        if self._handle_files is None:
            self._handle_files = {}
        entry = self._handle_files.get(index)
        if entry is None:
            file_path, dset_path = self._parts[index]
            if not file_path.exists():
                raise _missing_data_file(file_path, self._link_names[index], self._path)
            f = open_h5(file_path)
            entry = (f, f[dset_path])
            self._handle_files[index] = entry
        return entry[1]

    # -- properties --------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The master file."""
        return self._path

    @property
    def data_files(self) -> list[Path]:
        """The data files, in link-name order."""
        return [p for p, _ in self._parts]

    @property
    def identity(self) -> SourceIdentity:
        """Master and data file paths, sizes and a digest of layouts and detector metadata."""
        paths = [self._path]
        for p in self.data_files:
            if p not in paths:
                paths.append(p)
        return SourceIdentity(
            format=self.format,
            paths=tuple(str(p) for p in paths),
            file_sizes=tuple(path_size(p) for p in paths),
            header_sha256=header_digest(
                self._link_names,
                [(str(p.name), d) for p, d in self._parts],
                self._layouts,
                sorted(self._detector.items()),
            ),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """Detector metadata, data-file layout and scan-shape choice."""
        expected = None
        nimages = self._detector.get("nimages")
        ntrigger = self._detector.get("ntrigger")
        if isinstance(nimages, int):
            expected = nimages * (ntrigger if isinstance(ntrigger, int) and ntrigger > 0 else 1)
        return {
            "detector": dict(self._detector),
            "data_files": [
                {"path": str(p), "dataset_path": d, **layout}
                for (p, d), layout in zip(self._parts, self._layouts, strict=True)
            ],
            "beam": dict(self._beam),
            "frames_announced": expected,
            "pixel_mask_applied_by_reader": False,
            **self.scan_metadata(),
            "calibration_from": self._calibration_choice()[1],
        }

    def _calibration_choice(self) -> tuple[Calibration | None, str | None]:
        """The calibration to report and where from: a JSON sidecar wins over the file."""
        return calibration_choice(
            self._path, lambda: master_calibration(self._detector, self._beam, self._path)[:2]
        )

    @property
    def notes(self) -> list[str]:
        """Explicit choices made while opening, and master values not used as calibration."""
        cal, how, unused = master_calibration(self._detector, self._beam, self._path)
        notes = [*super().notes, *unused]
        if cal is not None and sidecar_calibration(self._path) is not None:
            notes.append(f"the JSON sidecar's calibration overrides the one read from {how}")
        return notes

    @property
    def calibration(self) -> Calibration | None:
        """A JSON sidecar's calibration, else the beam centre, mrad/px and voltage of the master."""
        return self._calibration_choice()[0]

    # -- reading -------------------------------------------------------------------
    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read frames ``[start, stop)``, crossing data-file boundaries as needed."""
        if not 0 <= start <= stop <= self._n_frames:
            raise ShapeError(
                f"frames [{start}, {stop}) lie outside the {self._n_frames} frames of "
                f"{str(self._path)!r}"
            )
        kr, kc = self._frame_shape
        direct = out is not None and out.dtype == self._dtype and out.flags.c_contiguous
        if out is None:
            out = np.empty((stop - start, kr, kc), dtype=self._dtype)
            direct = True
        pos = start
        while pos < stop:
            i = bisect.bisect_right(self._starts, pos) - 1
            first = self._starts[i]
            # bisect_right skips empty data files: they share their start with the next
            end = min(stop, first + self._counts[i])
            file_path, dset_path = self._parts[i]
            if direct and bslz4_supports(self._layouts[i]):
                # read once, checked, decoded in parallel (io/bslz4_read.py)
                read_bitshuffle(
                    self._dset(i),
                    [(pos - first, end - first), (0, kr), (0, kc)],
                    out[pos - start : end - start],
                    where=f"dataset {dset_path!r} of data file {str(file_path)!r} (master "
                    f"{str(self._path)!r}), read for acquisition frames [{pos}, {end})",
                )
                pos = end
                continue
            if needs_bitshuffle_guard(self._layouts[i]):
                check_bitshuffle_chunks(
                    self._dset(i),
                    [(pos - first, end - first), (0, kr), (0, kc)],
                    f"dataset {dset_path!r} of data file {str(file_path)!r} (master "
                    f"{str(self._path)!r}), read for acquisition frames [{pos}, {end})",
                )
            try:
                if direct:  # decode straight into the destination, no temporary
                    self._dset(i).read_direct(
                        out,
                        source_sel=np.s_[pos - first : end - first],
                        dest_sel=np.s_[pos - start : end - start],
                    )
                else:
                    out[pos - start : end - start] = self._dset(i)[pos - first : end - first]
            except (OSError, RuntimeError, ValueError) as exc:
                raise CorruptChunkError(
                    f"could not read or decode frames [{pos}, {end}) of the acquisition "
                    f"(frames [{pos - first}, {end - first}) of {dset_path!r} in data file "
                    f"{str(file_path)!r}, master {str(self._path)!r}): {exc}. The data file may "
                    "be truncated or a compressed chunk corrupt"
                ) from exc
            pos = end
        return out

    def close(self) -> None:
        """Close every open data file."""
        if self._handle_files:
            for f, _ in self._handle_files.values():
                f.close()
        self._handle_files = None


def _data_links(group: Any) -> list[str]:
    """Return the ``data_NNNNNN`` entry names of ``/entry/data`` in numeric order."""
    found = []
    for name in group:
        m = _LINK_NAME.match(name)
        if m:
            found.append((int(m.group(1)), name))
    return [name for _, name in sorted(found)]


def _missing_data_file(target: Path, link: str, master: Path) -> SourceNotFoundError:
    return SourceNotFoundError(
        f"data file {str(target)!r} (linked as {_DATA_GROUP}/{link}) of master {str(master)!r} "
        "does not exist; copy every *_data_NNNNNN.h5 file next to the master"
    )


def _probe_dataset(
    file_path: Path, dset_path: str, master: Path
) -> tuple[tuple[int, int, int], np.dtype[Any], dict[str, Any]]:
    """Return shape, dtype and filter layout of one data file's frame dataset."""
    import h5py

    with open_h5(file_path) as f:
        dset = f.get(dset_path)
        if not isinstance(dset, h5py.Dataset):
            raise DatasetPathError(
                f"data file {str(file_path)!r} of master {str(master)!r} has no dataset "
                f"{dset_path!r}; expected the frames there"
            )
        if dset.ndim != 3:
            raise ShapeError(
                f"{dset_path!r} in {str(file_path)!r} has shape {dset.shape}; expected "
                "(frames, k_r, k_c)"
            )
        s = tuple(int(v) for v in dset.shape)
        return (s[0], s[1], s[2]), np.dtype(dset.dtype), dataset_filters(dset)


def _detector_metadata(f: Any) -> dict[str, Any]:
    """Read the detector fields that are present; absent ones are left out."""
    import h5py

    out: dict[str, Any] = {}
    det = f.get(_DETECTOR)
    if not isinstance(det, h5py.Group):
        return out
    for name in DETECTOR_FIELDS:
        obj = det.get(name)
        if isinstance(obj, h5py.Dataset) and obj.size == 1:
            out[name] = _scalar(obj[()])
            units = read_attribute(obj, "units")
            if units is not None:
                out[f"{name}_units"] = _scalar(units)
    spec = det.get("detectorSpecific")
    if isinstance(spec, h5py.Group):
        for name in DETECTOR_SPECIFIC_FIELDS:
            obj = spec.get(name)
            if isinstance(obj, h5py.Dataset) and obj.size == 1:
                out[name] = _scalar(obj[()])
                units = read_attribute(obj, "units")
                if units is not None and name == "photon_energy":
                    out[f"{name}_units"] = _scalar(units)
        mask = spec.get("pixel_mask")
        if isinstance(mask, h5py.Dataset):
            values = np.asarray(mask[()])
            out["pixel_mask_shape"] = [int(v) for v in values.shape]
            out["pixel_mask_flagged"] = int(np.count_nonzero(values))
    return out


def _group_scalars(f: Any, group_path: str, names: Sequence[str]) -> dict[str, Any]:
    """Read the scalar fields (and their ``units``) of one group that are present."""
    import h5py

    out: dict[str, Any] = {}
    group = f.get(group_path)
    if not isinstance(group, h5py.Group):
        return out
    for name in names:
        obj = group.get(name)
        if isinstance(obj, h5py.Dataset) and obj.size == 1:
            out[name] = _scalar(obj[()])
            units = read_attribute(obj, "units")
            if units is not None:
                out[f"{name}_units"] = _scalar(units)
    return out


_TO_METRES = {"m": 1.0, "mm": 1e-3, "um": 1e-6, "µm": 1e-6, "μm": 1e-6, "micron": 1e-6}
_TO_EV = {"ev": 1.0, "kev": 1e3, "mev": 1e6}
_TO_ANGSTROM = {"a": 1.0, "å": 1.0, "angstrom": 1.0, "nm": 10.0, "m": 1e10, "pm": 0.01}


def _number(values: dict[str, Any], name: str) -> float | None:
    v = values.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(float(v)) else None


def _in_unit(
    values: dict[str, Any], name: str, table: dict[str, float], default: str
) -> tuple[float | None, str]:
    """A field's value converted with ``table`` (its ``units`` or the NeXus default)."""
    value = _number(values, name)
    units = str(values.get(f"{name}_units", default)).strip()
    factor = table.get(units.lower())
    if value is None or factor is None:
        return None, units
    return value * factor, units


def voltage_from_wavelength(wavelength_angstrom: float) -> float:
    """Return the accelerating voltage (kV) of electrons of a relativistic wavelength (Å)."""
    h, m0, e, c = 6.62607015e-34, 9.1093837015e-31, 1.602176634e-19, 299792458.0
    p = h / (wavelength_angstrom * 1e-10)
    rest = m0 * c**2
    kinetic = math.sqrt((p * c) ** 2 + rest**2) - rest
    return kinetic / e / 1e3


def master_calibration(
    detector: dict[str, Any], beam: dict[str, Any], path: Path
) -> tuple[Calibration | None, str | None, list[str]]:
    """The calibration a Dectris master records (module docstring), where from, and notes.

    Parameters
    ----------
    detector, beam
        Scalar fields of ``/entry/instrument/detector`` (``detectorSpecific``
        fields included) and ``/entry/instrument/beam``, with ``*_units``.
    path
        The master, for messages.

    Returns
    -------
    tuple
        ``(calibration or None, how or None, notes on values not used)``.
    """
    where = f"{_DETECTOR} of {str(path)!r}"
    kwargs: dict[str, Any] = {}
    used: list[str] = []
    notes: list[str] = []
    by, bx = _number(detector, "beam_center_y"), _number(detector, "beam_center_x")
    if by is not None and bx is not None:
        kwargs["detector_origin"] = (by, bx)
        used.append(f"beam_center_y/x = ({by:g}, {bx:g}) px -> detector_origin")
    lengths = {
        name: _in_unit(detector, name, _TO_METRES, "m")
        for name in ("detector_distance", "y_pixel_size", "x_pixel_size")
    }
    dist, sy, sx = (v for v, _ in lengths.values())
    if dist is not None and sy is not None and sx is not None:
        mrad = (1e3 * math.atan(sy / dist), 1e3 * math.atan(sx / dist)) if dist > 0 else (0, 0)
        if dist > 0 and all(0 < v <= 100 for v in mrad):
            kwargs["detector_sampling"] = mrad
            kwargs["detector_units"] = "mrad"
            used.append(
                f"1000 * atan(y/x_pixel_size / detector_distance) = ({mrad[0]:.6g}, "
                f"{mrad[1]:.6g}) mrad/px from pixel sizes ({sy:g}, {sx:g}) m and distance "
                f"{dist:g} m"
            )
        else:
            notes.append(
                f"{where}: pixel sizes ({sy:g}, {sx:g}) m at detector_distance {dist:g} m give "
                f"{mrad} mrad per pixel, outside (0, 100]; the detector was left uncalibrated"
            )
    else:
        for name, (value, units) in lengths.items():
            if name in detector and value is None:
                notes.append(
                    f"{where}: {name} = {detector[name]!r} with units {units!r} is not a length "
                    "this reader converts (m, mm, um); the detector was left uncalibrated"
                )
    kv: float | None = None
    wavelength, _ = _in_unit(beam, "incident_wavelength", _TO_ANGSTROM, "Å")
    if wavelength is not None and wavelength > 0:
        kv = voltage_from_wavelength(wavelength)
        source = f"{_BEAM}/incident_wavelength = {wavelength:g} Å"
    else:
        for group, name in ((beam, "incident_energy"), (detector, "photon_energy")):
            energy, _ = _in_unit(group, name, _TO_EV, "eV")
            if energy is not None and energy > 0:
                kv = energy / 1e3
                source = f"{name} = {energy:g} eV"
                break
    if kv is not None:
        if 10.0 <= kv <= 2000.0:
            kwargs["accelerating_voltage_kV"] = kv
            used.append(f"{source} -> {kv:.6g} kV")
        else:
            notes.append(
                f"{str(path)!r}: {source} means {kv:.6g} kV electrons, outside 10-2000 kV (an "
                "X-ray energy?); the accelerating voltage was not taken from it"
            )
    if not kwargs:
        return None, None, notes
    return Calibration(**kwargs), f"Dectris master {str(path)!r}: " + "; ".join(used), notes


def _scalar(value: Any) -> Any:
    """Turn an HDF5 scalar into a JSON-ready Python value."""
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0] if value.size == 1 else value.tolist()
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode(errors="replace").strip("\x00 ")
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, str):
        return value.strip("\x00 ")
    return value
