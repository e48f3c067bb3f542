"""Thermo Fisher Velox ``.emd`` files: a 4D-STEM camera stack and its JSON metadata.

A Velox EMD file is HDF5 (not EMD 1.0: no ``emd_group_type``): a dataset
``/Version`` holding JSON (``{"format": "Velox", "version": ...}``) and a
group ``/Data`` with one subgroup per kind of data, ``Image``,
``SpectrumStream``, ``SpectrumImage``, ``Spectrum``..., each holding one
group per acquisition (named by a UUID) with:

- ``Data``: an image stack stored as ``(height, width, frames)``, frames
  last, usually one frame per HDF5 chunk;
- ``Metadata``: ``uint8`` of shape ``(n, frames)``, column ``i`` the
  zero-padded UTF-8 JSON of frame ``i`` (``BinaryResult``: ``PixelSize``
  ``{width, height}`` in ``PixelUnitX``, ``Detector``...; ``Optics``:
  ``AccelerationVoltage`` in volts...; ``Scan``: ``ScanSize`` ``{width,
  height}``...).

A 4D-STEM acquisition with a camera is an ``Image`` stack with one frame per
scan position: frame ``i`` is scan position ``(i // width, i % width)``, and
``height x width x frames`` is ``k_r x k_c x`` positions.  The reader takes
the one ``Image`` stack whose frame count equals its ``Scan/ScanSize``
(or the one named by ``dataset_path``); the scan shape comes from
``ScanSize`` (``height`` rows, ``width`` columns) unless ``scan_shape`` is
given.  ``SpectrumStream``/``SpectrumImage`` hold EDS events, not
diffraction, and are not read.

Calibration from the stack's JSON: the detector pixel from
``BinaryResult/PixelSize`` when its unit (``PixelUnitX``) is reciprocal
(``1/m`` or ``1/nm``, converted to ``1/Å``), the optical axis from
``BinaryResult/Offset`` (``-offset / pixel size``) when not zero, and the
voltage from ``Optics/AccelerationVoltage``.  The scan step comes from the
pixel size (in ``m``) of a 2-D STEM image of the same file whose size is
the scan shape (the detector image Velox records with the stack); when
there is none, or several disagree, the scan is left uncalibrated with a
note.  A JSON sidecar's calibration overrides the file's.

Not verified against a 4D-STEM file written by Velox here: the field names
and the frames-last layout are those of Velox image stacks (as read by
RosettaSciIO); a 4-D ``Data`` or a stack whose frame count matches no
``ScanSize`` is refused with an error rather than guessed.
"""

from __future__ import annotations

import json
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
    QuantemFlowError,
    ShapeError,
)
from .base import (
    FrameSource,
    SourceIdentity,
    calibration_choice,
    check_exists,
    described_calibration,
    drop_unusable_samplings,
    header_digest,
    path_size,
)
from .hdf5 import (
    attribute_value,
    dataset_filters,
    hdf5_type_problem,
    layout_integrity,
    open_dataset,
    open_h5,
)

__all__ = ["VeloxSource", "read_velox_metadata", "sniff"]

#: Bytes of stored values read at a time into a scratch (frames are the last axis).
_SCRATCH_BYTES = 4 << 20
#: Detector pixels transposed at a time from the contiguous layout's scratch.
_TILE_PIXELS = 32
_KINDS = ("Image", "SpectrumStream", "SpectrumImage", "Spectrum")
_RECIPROCAL = {"1/m": 1e-10, "1/nm": 0.1, "1/å": 1.0, "1/a": 1.0, "1/pm": 100.0}
_LENGTH_M = {"m": 1.0, "nm": 1e-9, "µm": 1e-6, "um": 1e-6, "pm": 1e-12, "å": 1e-10, "a": 1e-10}


def sniff(path: Path, head: bytes) -> bool:
    """An HDF5 file with a ``/Version`` dataset and a ``/Data`` group of Velox kinds (Image...)."""
    from .sniffers import hdf5_structure

    return hdf5_structure(path, head, _velox_groups)


def _velox_groups(f: Any) -> bool:
    import h5py

    data = f.get("Data")
    if not isinstance(f.get("Version"), h5py.Dataset) or not isinstance(data, h5py.Group):
        return False
    return any(k in data for k in _KINDS)


def read_velox_metadata(group: Any, path: Path, where: str) -> dict[str, Any]:
    """Return the JSON metadata of the first frame of a Velox acquisition group.

    Raises
    ------
    FormatError
        No ``Metadata`` dataset, or one that is not zero-padded UTF-8 JSON.
    """
    import h5py

    meta = group.get("Metadata")
    if (
        not isinstance(meta, h5py.Dataset)
        or meta.ndim not in (1, 2)
        or meta.dtype.kind not in "ui"
        or meta.dtype.itemsize != 1
    ):
        what = "none" if meta is None else f"{getattr(meta, 'dtype', type(meta).__name__)}"
        raise FormatError(
            f"{str(path)!r}: Velox acquisition {where!r} has no Metadata dataset (uint8, one "
            f"JSON text per frame; found: {what}); the file is damaged or not written by Velox"
        )
    column = meta[:, 0] if meta.ndim == 2 else meta[:]
    raw = np.asarray(column, dtype=np.uint8).tobytes().rstrip(b"\x00")
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormatError(
            f"{str(path)!r}: the Metadata of Velox acquisition {where!r} is not JSON ({exc}); "
            "the file is damaged"
        ) from exc
    if not isinstance(value, dict):
        raise FormatError(
            f"{str(path)!r}: the Metadata of Velox acquisition {where!r} is a JSON "
            f"{type(value).__name__}; expected an object"
        )
    return value


def _field(tree: Any, *names: str) -> Any:
    for name in names:
        if not isinstance(tree, dict) or name not in tree:
            return None
        tree = tree[name]
    return tree


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _scan_size(meta: dict[str, Any]) -> tuple[int, int] | None:
    w = _number(_field(meta, "Scan", "ScanSize", "width"))
    h = _number(_field(meta, "Scan", "ScanSize", "height"))
    if w is None or h is None or w < 1 or h < 1 or w != int(w) or h != int(h):
        return None
    return int(h), int(w)


class VeloxSource(FrameSource):
    """The 4D-STEM camera stack of a Velox ``.emd`` file.

    Parameters
    ----------
    path
        The ``.emd`` file.
    dataset_path
        The acquisition group (``"/Data/Image/<uuid>"``) or its ``Data``;
        ``None`` for the only ``Image`` stack whose frames fill its
        ``Scan/ScanSize``.
    scan_shape
        ``(rows, cols)``; ``None`` for ``Scan/ScanSize``.
    """

    format: ClassVar[str] = "velox"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dataset_path: str | None = None,
        scan_shape: Sequence[int] | str | None = None,
    ):
        import h5py

        self._path = check_exists(path, what="Velox EMD file")
        self._handle_file: Any = None
        self._handle_dset: Any = None
        self._handle_direct: bool | None = None  # stored bytes readable directly (per handle)
        with open_h5(self._path) as f:
            version = f.get("Version")
            try:
                problem = hdf5_type_problem(version.id.get_type())
                if problem is not None:  # never read: HDF5 may crash on a damaged one
                    raise TypeError(f"it is {problem}")
                first = np.asarray(version[()]).reshape(-1)[0]
                text = first.decode() if isinstance(first, bytes) else str(first)
                self._version = json.loads(text)
            except Exception as exc:
                raise FormatError(
                    f"{str(self._path)!r}: /Version is not Velox's JSON version record ({exc}); "
                    "expected a Velox .emd file"
                ) from exc
            images = f.get("Data/Image")
            stacks: list[tuple[str, tuple[int, ...], Any]] = []
            if isinstance(images, h5py.Group):
                for key in images:
                    g = images[key]
                    d = g.get("Data") if isinstance(g, h5py.Group) else None
                    if isinstance(d, h5py.Dataset):
                        where = f"/Data/Image/{key}"
                        stacks.append((where, tuple(int(s) for s in d.shape), g))
            listing = ", ".join(f"{w!r} {s}" for w, s, _ in stacks) or "none"
            if dataset_path is None:
                picked = []
                for where, shape, g in stacks:
                    if len(shape) != 3 or shape[2] < 2:
                        continue
                    size = _scan_size(read_velox_metadata(g, self._path, where))
                    if size is not None and size[0] * size[1] == shape[2]:
                        picked.append(where)
                if len(picked) != 1:
                    raise DatasetPathError(
                        f"{str(self._path)!r} holds {len(picked)} Velox image stacks whose frame "
                        f"count equals their Scan/ScanSize (image stacks: {listing}); expected "
                        "one 4D-STEM camera stack. Pass dataset_path= the acquisition group "
                        "(and scan_shape= if its ScanSize is missing)"
                    )
                group_path = picked[0]
                self._group_from = "the only image stack whose frames fill its Scan/ScanSize"
            else:
                group_path = dataset_path.rstrip("/")
                if group_path.endswith("/Data") and isinstance(f.get(group_path), h5py.Dataset):
                    group_path = group_path[: -len("/Data")]
                self._group_from = "given (dataset_path=)"
            group = f.get(group_path)
            dset = group.get("Data") if isinstance(group, h5py.Group) else None
            if not isinstance(dset, h5py.Dataset):
                raise DatasetPathError(
                    f"{group_path!r} in {str(self._path)!r} is not a Velox acquisition group "
                    f"holding Data; image stacks in the file: {listing}"
                )
            shape = tuple(int(s) for s in dset.shape)
            if len(shape) != 3:
                raise ShapeError(
                    f"{str(self._path)!r}: Velox Data {group_path + '/Data'!r} has shape {shape}; "
                    "expected an image stack (height, width, frames), one frame per scan "
                    "position"
                )
            if dset.dtype.kind not in "uif":
                raise DtypeError(
                    f"{str(self._path)!r}: Velox Data {group_path + '/Data'!r} has dtype "
                    f"{dset.dtype}; expected integer or real camera frames (FFT and DPC results "
                    "are not 4D-STEM data)"
                )
            self._meta = read_velox_metadata(group, self._path, group_path)
            self._layout = dataset_filters(dset)
            self._scan_images = self._companion_images(stacks, group_path)
            dtype = dset.dtype
        self._group_path = group_path
        self._dataset_path = group_path + "/Data"
        self._stored_shape = shape
        self._stored_dtype = dtype.str  # byte order as stored
        size = _scan_size(self._meta)
        self._set_frames(
            n_frames=shape[2],
            frame_shape=(shape[0], shape[1]),
            dtype=dtype,
            scan_shape=scan_shape if scan_shape is not None else size,
            path=self._path,
            scan_shape_from=(
                "the file (Scan/ScanSize in the Velox metadata)"
                if scan_shape is None and size is not None
                else None
            ),
        )

    def _companion_images(
        self, stacks: list[tuple[str, tuple[int, ...], Any]], skip: str
    ) -> list[tuple[str, tuple[int, int], dict[str, Any]]]:
        """2-D images (one frame) of the file: where, (rows, cols), metadata."""
        out = []
        for where, shape, g in stacks:
            if where == skip or len(shape) != 3 or shape[2] != 1:
                continue
            try:
                meta = read_velox_metadata(g, self._path, where)
            except FormatError:
                continue
            out.append((where, (shape[0], shape[1]), meta))
        return out

    # -- calibration ---------------------------------------------------------------
    def _file_calibration(self) -> tuple[Calibration | None, list[str], list[str]]:
        used: list[str] = []
        notes: list[str] = []
        kwargs: dict[str, Any] = {}
        binary = _field(self._meta, "BinaryResult") or {}
        unit = str(_field(binary, "PixelUnitX") or "").strip()
        pw = _number(_field(binary, "PixelSize", "width"))
        ph = _number(_field(binary, "PixelSize", "height"))
        factor = _RECIPROCAL.get(unit.lower())
        if factor is not None and pw and ph and pw > 0 and ph > 0:
            kwargs["detector_sampling"] = (ph * factor, pw * factor)
            kwargs["detector_units"] = "1/Å"
            used.append(f"detector pixel {ph:g} x {pw:g} {unit} (BinaryResult/PixelSize)")
            ox = _number(_field(binary, "Offset", "x"))
            oy = _number(_field(binary, "Offset", "y"))
            if ox is not None and oy is not None and (ox, oy) != (0.0, 0.0):
                kwargs["detector_origin"] = (-oy / ph, -ox / pw)
                used.append("optical axis from BinaryResult/Offset")
        elif unit or pw is not None:
            notes.append(
                f"the Velox stack's BinaryResult/PixelSize is {pw!r} x {ph!r} {unit!r}; only a "
                "reciprocal unit (1/m, 1/nm) calibrates a diffraction pixel, so the detector was "
                "left uncalibrated"
            )
        volts = _number(_field(self._meta, "Optics", "AccelerationVoltage"))
        if volts is not None:
            kv = volts / 1000.0
            if 10.0 <= kv <= 2000.0:
                kwargs["accelerating_voltage_kV"] = kv
                used.append(f"voltage {kv:g} kV (Optics/AccelerationVoltage)")
            else:
                notes.append(
                    f"Optics/AccelerationVoltage is {volts!r} V ({kv:g} kV), outside 10-2000 kV; "
                    "the voltage was not taken from it"
                )
        steps = set()
        sources = []
        for where, shape, meta in self._scan_images:
            if shape != self.shape[:2]:
                continue
            b = _field(meta, "BinaryResult") or {}
            to_m = _LENGTH_M.get(str(_field(b, "PixelUnitX") or "").strip().lower())
            w = _number(_field(b, "PixelSize", "width"))
            h = _number(_field(b, "PixelSize", "height"))
            if to_m is None or not w or not h or w <= 0 or h <= 0:
                continue
            step = (round(h * to_m * 1e10, 9), round(w * to_m * 1e10, 9))
            if min(step) > 0 and math.isfinite(max(step)):
                steps.add(step)
                sources.append(where)
        if len(steps) == 1:
            step = steps.pop()
            kwargs["scan_sampling"] = step
            kwargs["scan_units"] = "Å"
            used.append(f"scan step {step[0]:g} x {step[1]:g} Å from the image(s) {sources}")
        elif len(steps) > 1:
            notes.append(
                f"the STEM images {sources} of the scan's size give different pixel sizes "
                f"{sorted(steps)} Å; the scan was left uncalibrated"
            )
        else:
            notes.append(
                "no 2-D STEM image of the scan's size with a finite, positive pixel size in m "
                "was found in the file, so the scan was left uncalibrated"
            )
        drop_unusable_samplings(kwargs, used, notes, "the Velox metadata")
        if not kwargs:
            return None, used, notes
        return Calibration(**kwargs), used, notes

    def _calibration_choice(self) -> tuple[Calibration | None, str | None]:
        return calibration_choice(
            self._path,
            lambda: described_calibration(
                self._file_calibration(), f"Velox metadata of {self._group_path!r}"
            ),
        )

    @property
    def calibration(self) -> Calibration | None:
        """A JSON sidecar's calibration, else the one the Velox metadata records."""
        return self._calibration_choice()[0]

    @property
    def notes(self) -> list[str]:
        """Explicit choices made while opening."""
        return [*super().notes, *self._file_calibration()[2]]

    # -- description -------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The ``.emd`` file."""
        return self._path

    @property
    def integrity(self) -> tuple[bool, str]:
        """Fletcher32 checksums (HDF5 filter 3), verified by HDF5 on every read, if present."""
        return layout_integrity(self._layout, f"dataset {self._dataset_path!r}")

    @property
    def identity(self) -> SourceIdentity:
        """Path, size and a digest of the dataset's layout and the stack's metadata."""
        return SourceIdentity(
            format=self.format,
            paths=(str(self._path),),
            file_sizes=(path_size(self._path),),
            header_sha256=header_digest(
                self._dataset_path,
                self._stored_shape,
                str(self._dtype),
                self._layout,
                json.dumps(self._meta, sort_keys=True),
            ),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """The acquisition group, the stored layout, the Velox version and JSON sections."""
        keep = ("BinaryResult", "Optics", "Scan", "Acquisition", "Instrument", "Core")
        return {
            "dataset_path": self._dataset_path,
            "dataset_path_from": self._group_from,
            "stored_shape": list(self._stored_shape),
            "stored_order": "(height, width, frames): frames last",
            **self._layout,
            "velox_version": {k: attribute_value(v) for k, v in self._version.items()}
            if isinstance(self._version, dict)
            else attribute_value(self._version),
            "velox_metadata": {k: self._meta[k] for k in keep if k in self._meta},
            "calibration_from": self._calibration_choice()[1],
            **self.scan_metadata(),
        }

    # -- reading ---------------------------------------------------------------------------
    def _dset(self) -> Any:
        if self._handle_dset is None:
            h5file = open_h5(self._path)
            self._handle_dset = open_dataset(h5file, self._dataset_path, self._path)
            self._handle_file = h5file
        return self._handle_dset

    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read frames ``[start, stop)`` of the frames-last stack, frames moved first.

        ``Data`` is ``(k_r, k_c, frames)``: a frame is ``k_r * k_c`` values
        ``frames`` apart, so slicing ``Data[:, :, start:stop]`` makes HDF5
        scatter every value on its own.  The stored bytes are read in the
        order they lie instead, and transposed once into ``out``:

        - chunks covering whole frames ``(k_r, k_c, c)`` (Velox writes
          ``c = 1``) without filters: the chunk index is walked once per
          file version, runs of chunks adjacent in the file are read with
          one ``preadv`` (straight into ``out`` when ``c = 1``: a chunk is
          then one frame, in order), else through a bounded scratch;
        - a contiguous dataset: for groups of detector pixels, each pixel's
          run of ``stop - start`` values is read with one ``pread`` into a
          bounded scratch, transposed into ``out``;
        - anything else (compressed chunks, other chunk shapes): HDF5 reads
          chunk-aligned frame groups into a bounded scratch, transposed.

        Raises
        ------
        CorruptChunkError
            A chunk of the wrong stored size, a short read (truncated file)
            or an HDF5 error, naming the file, dataset and frames.
        """
        if not 0 <= start < stop <= self._n_frames:
            raise ShapeError(
                f"frames [{start}, {stop}) are outside the {self._n_frames} frames of "
                f"{str(self._path)!r}"
            )
        shape = (stop - start, *self._frame_shape)
        target = out
        if (
            target is None
            or target.shape != shape
            or target.dtype != self._dtype
            or not target.flags.c_contiguous
        ):
            target = np.empty(shape, dtype=self._dtype)
        chunks = self._layout.get("chunks")
        try:
            dset = self._dset()
            path = self._direct_path(dset)
            if path is not None and chunks and tuple(chunks[:2]) == self._frame_shape:
                self._read_frame_chunks(dset, path, int(chunks[2]), start, stop, target)
            elif path is not None and not chunks and dset.id.get_offset() is not None:
                self._read_contiguous(path, int(dset.id.get_offset()), start, stop, target)
            else:
                self._read_hdf5(dset, start, stop, target)
        except (OSError, RuntimeError, ValueError, KeyError) as exc:  # KeyError: h5py
            if isinstance(exc, QuantemFlowError):
                raise
            raise CorruptChunkError(
                f"could not read or decode frames [{start}, {stop}) of {self._dataset_path!r} in "
                f"{str(self._path)!r}: {exc}. The file may be truncated or a compressed chunk "
                "corrupt"
            ) from exc
        if out is not None and target is not out:
            out[...] = target
            return out
        return target

    def _direct_path(self, dset: Any) -> str | None:
        """The file to read stored bytes from, or ``None`` when HDF5 must read them.

        Only an unfiltered dataset in a file opened with the default
        ``sec2`` driver, whose first stored values read directly equal what
        HDF5 returns (checked once per open handle).
        """
        if self._layout.get("filters") or dset.file.driver != "sec2":
            return None
        if getattr(self, "_handle_direct", None) is None:
            self._handle_direct = self._direct_check(dset)
        return os.path.realpath(dset.file.filename) if self._handle_direct else None

    def _direct_check(self, dset: Any) -> bool:
        from .bslz4_read import chunk_index

        stored = np.dtype(dset.dtype)
        n = min(8, self._stored_shape[2])
        expected = np.asarray(dset[0, 0, :n])
        if dset.chunks is None:
            offset = dset.id.get_offset()
            if offset is None:
                return False
        else:
            index = chunk_index(dset)
            if not index.direct or tuple(index.chunks[:2]) != self._frame_shape:
                return bool(index.direct)
            offset = int(index.byte_offset[0])
            if offset < 0:
                return True  # nothing stored there: fill values, checked per chunk
            n = min(n, index.chunks[2])
            expected = expected[:n]
            # in a (k_r, k_c, c) chunk, pixel (0, 0) of its frames comes first
        want = n * stored.itemsize
        with open(os.path.realpath(dset.file.filename), "rb", buffering=0) as fh:
            fh.seek(offset)
            got = fh.read(want)
        return len(got) == want and bool(np.array_equal(np.frombuffer(got, dtype=stored), expected))

    def _corrupt(self, start: int, stop: int, why: str) -> CorruptChunkError:
        return CorruptChunkError(
            f"could not read frames [{start}, {stop}) of {self._dataset_path!r} in "
            f"{str(self._path)!r}: {why}. The file may be truncated or damaged; results "
            "computed so far are kept"
        )

    def _read_frame_chunks(
        self, dset: Any, path: str, per: int, start: int, stop: int, target: np.ndarray
    ) -> None:
        """Frames from unfiltered ``(k_r, k_c, per)`` chunks: runs of adjacent chunks, one read."""
        from .bslz4_read import chunk_index

        index = chunk_index(dset)
        kr, kc = self._frame_shape
        stored = np.dtype(dset.dtype)
        chunk_bytes = kr * kc * per * stored.itemsize
        j0, j1 = start // per, -(-stop // per)
        offsets = index.byte_offset[j0:j1]
        sizes = index.size[j0:j1]
        bad = np.flatnonzero((offsets >= 0) & (sizes != chunk_bytes))
        if bad.size:
            j = j0 + int(bad[0])
            raise self._corrupt(
                start,
                stop,
                f"chunk {j} (frames [{j * per}, {(j + 1) * per})) is stored in "
                f"{int(index.size[j])} bytes at byte {int(index.byte_offset[j])}; an "
                f"unfiltered chunk of shape {index.chunks} is {chunk_bytes} bytes",
            )
        # runs: chunks adjacent in the file, at most a scratch's worth of bytes
        most = max(1, _SCRATCH_BYTES // chunk_bytes)
        in_place = per == 1 and stored == self._dtype
        scratch = None if in_place else np.empty(min(j1 - j0, most) * chunk_bytes, np.uint8)
        fd = os.open(path, os.O_RDONLY)
        try:
            a = 0
            while a < j1 - j0:
                b = a + 1
                if offsets[a] >= 0:
                    while (
                        b < j1 - j0 and b - a < most and offsets[b] == offsets[b - 1] + chunk_bytes
                    ):
                        b += 1
                f0, f1 = max(start, (j0 + a) * per), min(stop, (j0 + b) * per)
                if offsets[a] < 0:  # never written: HDF5's fill value
                    target[f0 - start : f1 - start] = dset.fillvalue
                elif in_place:
                    view = target[f0 - start : f1 - start].data.cast("B")
                    self._pread(fd, view, int(offsets[a]), f0, f1)
                else:
                    assert scratch is not None
                    view = scratch[: (b - a) * chunk_bytes].data
                    self._pread(fd, view, int(offsets[a]), f0, f1)
                    values = scratch[: (b - a) * chunk_bytes].view(stored)
                    frames = values.reshape(b - a, kr, kc, per).transpose(0, 3, 1, 2)
                    frames = frames.reshape((b - a) * per, kr, kc)
                    first = (j0 + a) * per
                    target[f0 - start : f1 - start] = frames[f0 - first : f1 - first]
                a = b
        finally:
            os.close(fd)

    def _pread(self, fd: int, view: memoryview, offset: int, f0: int, f1: int) -> None:
        got = os.preadv(fd, [view], offset)
        if got != view.nbytes:
            raise self._corrupt(
                f0,
                f1,
                f"{view.nbytes} bytes at byte {offset} were expected, the file holds {got} there",
            )

    def _read_contiguous(
        self, path: str, offset: int, start: int, stop: int, target: np.ndarray
    ) -> None:
        """Frames of a contiguous ``(k_r, k_c, n)`` dataset: one ``pread`` per pixel's run."""
        kr, kc = self._frame_shape
        n = self._stored_shape[2]
        stored = np.dtype(self._stored_dtype)
        size = stored.itemsize
        m = stop - start
        pixels = kr * kc
        group = max(1, min(pixels, _SCRATCH_BYTES // (m * size)))
        scratch = np.empty((group, m), dtype=stored)
        flat = target.reshape(m, pixels)
        fd = os.open(path, os.O_RDONLY)
        try:
            for p0 in range(0, pixels, group):
                p1 = min(pixels, p0 + group)
                for q in range(p0, p1):
                    view = scratch[q - p0].data.cast("B")
                    self._pread(fd, view, offset + (q * n + start) * size, start, stop)
                for q in range(p0, p1, _TILE_PIXELS):  # a transpose in tiles (2-3x faster)
                    r = min(p1, q + _TILE_PIXELS)
                    flat[:, q:r] = scratch[q - p0 : r - p0].T
        finally:
            os.close(fd)

    def _read_hdf5(self, dset: Any, start: int, stop: int, target: np.ndarray) -> None:
        """Frames through HDF5 (filters, other chunk shapes): chunk-aligned groups, transposed."""
        kr, kc = self._frame_shape
        chunks = self._layout.get("chunks")
        step = int(chunks[2]) if chunks else 1
        per = max(1, _SCRATCH_BYTES // (kr * kc * self._dtype.itemsize))
        per = max(step, per - per % step)
        f0 = start
        while f0 < stop:
            f1 = min(stop, (f0 // step) * step + per)
            block = np.asarray(dset[:, :, f0:f1])
            target[f0 - start : f1 - start] = np.moveaxis(block, 2, 0)
            f0 = f1

    def close(self) -> None:
        """Close the file (it reopens on the next read)."""
        if self._handle_file is not None:
            self._handle_file.close()
        self._handle_file = None
        self._handle_dset = None
        self._handle_direct = None
