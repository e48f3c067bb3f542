"""Keeping a live series as HDF5 while it is received: one file, or DECTRIS's master and data files.

Every frame is one chunk, compressed with bitshuffle+LZ4 (HDF5 filter
32008, ``hdf5plugin``): a frame the detector sent bitshuffle+LZ4 is written
with ``write_direct_chunk`` as the bytes it came in (no second compression);
others go through the filter.

* ``keep_hdf5="series.h5"``: one file, ``/entry/data/data`` of
  ``(R_r * R_c, k_r, k_c)``; its ``quantem_flow`` attribute records the
  stream, the scan shape and the calibration (``qf.open`` reads the
  calibration back; give ``scan_shape=``).
* ``keep_hdf5="series_master.h5"``: the layout DECTRIS's file writer uses,
  ``series_master.h5`` with ``/entry/data/data_NNNNNN`` external links to
  ``series_data_NNNNNN.h5`` files of ``images_per_file`` frames each
  (``/entry/data/data`` with ``image_nr_low``/``image_nr_high``), the
  detector's size and bit depth and ``detectorSpecific/nimages``, plus the
  JSON sidecar ``series.json`` (scan shape, calibration) that ``qf.open``
  reads for any file: ``qf.open("series_master.h5")`` opens the scan whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["IMAGES_PER_FILE", "HDF5Keep", "kept_files"]

#: Frames per data file in the DECTRIS layout (the SIMPLON file writer's usual
#: ``nimages_per_file``).
IMAGES_PER_FILE = 1000


def kept_files(path: Path, n_images: int, images_per_file: int = IMAGES_PER_FILE) -> list[Path]:
    """Every file keeping ``n_images`` frames at ``path`` writes (checked before receiving)."""
    if not path.name.endswith("_master.h5"):
        return [path]
    stem = path.name[: -len("_master.h5")]
    count = -(-int(n_images) // max(1, int(images_per_file)))
    return [
        path,
        path.parent / f"{stem}.json",
        *(path.parent / f"{stem}_data_{k + 1:06d}.h5" for k in range(count)),
    ]


class HDF5Keep:
    """Where received frames go as HDF5 chunks (one of the two layouts above)."""

    def __init__(
        self,
        path: Path,
        *,
        scan_shape: tuple[int, int],
        frame_shape: tuple[int, int],
        dtype: np.dtype[Any],
        record: dict[str, Any],
        images_per_file: int = IMAGES_PER_FILE,
    ) -> None:
        import h5py
        import hdf5plugin

        R, C = scan_shape
        n = R * C
        stored = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
        options = dict(hdf5plugin.Bitshuffle(cname="lz4"))
        self._files: list[Any] = []
        self._dsets: list[Any] = []
        self._per_file = n
        text = json.dumps(record)
        if not path.name.endswith("_master.h5"):
            f = h5py.File(path, "x")
            dset = f.create_dataset(
                "entry/data/data",
                shape=(n, *frame_shape),
                dtype=stored,
                chunks=(1, *frame_shape),
                **options,
            )
            dset.attrs["quantem_flow"] = text
            self._files.append(f)
            self._dsets.append(dset)
            return
        per = max(1, int(images_per_file))
        self._per_file = per
        _, sidecar, *data_files = kept_files(path, n, per)
        for existing in (sidecar, *data_files):  # refused up front: nothing is replaced
            if existing.exists():
                from ..errors import OverwriteError

                raise OverwriteError(
                    f"{str(existing)!r} exists; choose another keep_hdf5 name (a live series "
                    "never replaces a file)"
                )
        names = [p.name for p in data_files]
        for k, name in enumerate(names):
            first = k * per
            count = min(per, n - first)
            f = h5py.File(path.parent / name, "x")
            entry = f.create_group("entry")
            entry.attrs["NX_class"] = "NXentry"
            group = entry.create_group("data")
            group.attrs["NX_class"] = "NXdata"
            dset = group.create_dataset(
                "data",
                shape=(count, *frame_shape),
                dtype=stored,
                chunks=(1, *frame_shape),
                **options,
            )
            dset.attrs["image_nr_low"] = np.int64(first + 1)
            dset.attrs["image_nr_high"] = np.int64(first + count)
            self._files.append(f)
            self._dsets.append(dset)
        with h5py.File(path, "x") as master:
            entry = master.create_group("entry")
            entry.attrs["NX_class"] = "NXentry"
            entry.attrs["quantem_flow"] = text
            group = entry.create_group("data")
            group.attrs["NX_class"] = "NXdata"
            for k, name in enumerate(names):
                group[f"data_{k + 1:06d}"] = h5py.ExternalLink(name, "/entry/data/data")
            det = entry.create_group("instrument").create_group("detector")
            det.parent.attrs["NX_class"] = "NXinstrument"
            det.attrs["NX_class"] = "NXdetector"
            det.create_dataset("x_pixels_in_detector", data=np.uint32(frame_shape[1]))
            det.create_dataset("y_pixels_in_detector", data=np.uint32(frame_shape[0]))
            det.create_dataset("bit_depth_image", data=np.uint32(8 * stored.itemsize))
            spec = det.create_group("detectorSpecific")
            spec.create_dataset("nimages", data=np.uint64(n))
            spec.create_dataset("ntrigger", data=np.uint64(1))
            spec.create_dataset("nimages_per_file", data=np.uint64(per))
        record_of_scan: dict[str, Any] = {"scan_shape": [R, C]}
        if record.get("calibration") is not None:
            record_of_scan["calibration"] = record["calibration"]
        sidecar.write_text(json.dumps(record_of_scan, indent=1), encoding="utf-8")

    def write(self, image_id: int, chunk: bytes | None, frame: np.ndarray | None) -> None:
        """Keep one frame: its chunk as received, or the decoded frame through the filter."""
        k, i = divmod(image_id, self._per_file)
        dset = self._dsets[k]
        if chunk is not None:
            dset.id.write_direct_chunk((i, 0, 0), chunk)
        else:
            assert frame is not None
            dset[i] = frame

    def close(self) -> None:
        """Close every file (each is complete on disk after this)."""
        errors = []
        for f in self._files:
            try:
                f.close()
            except Exception as exc:  # a full disk: the others still closed
                errors.append(exc)
        if errors:
            raise errors[0]
