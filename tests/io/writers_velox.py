"""Velox ``.emd`` files written from the documented layout (h5py only).

Independent of :mod:`quantem_flow.io.velox`.  ``/Version``: JSON bytes;
``/Data/Image/<uuid>/Data``: ``(height, width, frames)``, frames last;
``/Data/Image/<uuid>/Metadata``: ``uint8 (n, frames)``, column ``i`` the
zero-padded JSON of frame ``i``.  A 4D-STEM camera stack has one frame per
scan position (row-major) and ``Scan/ScanSize`` = the scan; a HAADF image of
the scan's size (one frame) carries the scan's pixel size in metres.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["write_velox"]

CAMERA_UUID = "a3c5b0f2e0c34d8f9f1e2b3c4d5e6f70"
HAADF_UUID = "0f9e8d7c6b5a49382716051423324150"


def _metadata_columns(metas: list[dict[str, Any]]) -> np.ndarray:
    texts = [json.dumps(m).encode("utf-8") for m in metas]
    n = max(len(t) for t in texts) + 16
    out = np.zeros((n, len(texts)), dtype=np.uint8)
    for i, t in enumerate(texts):
        out[: len(t), i] = np.frombuffer(t, dtype=np.uint8)
    return out


def write_velox(
    path: Path,
    data: np.ndarray,
    *,
    pixel_size: tuple[float, float] | None = (2.0e8, 3.0e8),
    pixel_unit: str = "1/m",
    offset: tuple[float, float] = (0.0, 0.0),
    voltage_V: str | None = "300000",
    scan_size: tuple[int, int] | None = None,
    scan_pixel_m: tuple[float, float] | None = (5e-11, 7.5e-11),
    chunks: bool = True,
) -> Path:
    """Write a 4-D ``(R_r, R_c, k_r, k_c)`` array as a Velox 4D-STEM camera stack.

    ``pixel_size`` is (height, width) of a detector pixel in ``pixel_unit``,
    ``offset`` (x, y) in the same unit, ``scan_size`` overrides the
    ``(rows, cols)`` written in ``Scan/ScanSize`` and ``scan_pixel_m`` (row,
    col) is the pixel size of the HAADF image of the scan (``None``: none).
    """
    import h5py

    data = np.asarray(data)
    R, C, kr, kc = data.shape
    rows, cols = scan_size if scan_size is not None else (R, C)
    stack = np.ascontiguousarray(data.reshape(R * C, kr, kc).transpose(1, 2, 0))
    meta: dict[str, Any] = {
        "BinaryResult": {
            "Detector": "Ceta",
            "ImageSize": {"width": str(kc), "height": str(kr)},
            "PixelUnitX": pixel_unit,
            "PixelUnitY": pixel_unit,
            "Offset": {"x": str(offset[0]), "y": str(offset[1])},
        },
        "Scan": {"ScanSize": {"width": str(cols), "height": str(rows)}, "DwellTime": "0.001"},
        "Optics": {"CameraLength": "0.115"},
        "Core": {"MetadataDefinitionVersion": "7.9"},
    }
    if pixel_size is not None:
        meta["BinaryResult"]["PixelSize"] = {
            "width": str(pixel_size[1]),
            "height": str(pixel_size[0]),
        }
    if voltage_V is not None:
        meta["Optics"]["AccelerationVoltage"] = voltage_V
    with h5py.File(path, "w") as f:
        f.create_dataset("Version", data=np.array([b'{"format": "Velox", "version": "11"}']))
        images = f.create_group("Data/Image")
        cam = images.create_group(CAMERA_UUID)
        cam.create_dataset("Data", data=stack, chunks=(kr, kc, 1) if chunks else None)
        cam.create_dataset("Metadata", data=_metadata_columns([meta] * (R * C)))
        if scan_pixel_m is not None:
            haadf = images.create_group(HAADF_UUID)
            haadf.create_dataset("Data", data=np.zeros((R, C, 1), dtype="<u2"))
            hmeta = {
                "BinaryResult": {
                    "Detector": "HAADF",
                    "PixelSize": {"width": str(scan_pixel_m[1]), "height": str(scan_pixel_m[0])},
                    "PixelUnitX": "m",
                    "PixelUnitY": "m",
                },
                "Scan": {"ScanSize": {"width": str(C), "height": str(R)}},
            }
            haadf.create_dataset("Metadata", data=_metadata_columns([hmeta]))
        f.create_group("Presentation")
        f.create_group("SharedProperties")
    return path
