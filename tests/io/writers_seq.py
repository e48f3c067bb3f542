"""An independent writer of Norpix StreamPix ``.seq`` files (from the documented header layout).

Built with ``struct`` and NumPy from the header's field table (magic, UTF-16
name, version, header size, description, then the image description words),
never through the reader.  Each frame is followed by an 8-byte timestamp and
zero padding up to the stride (``true_image_size``), as StreamPix writes it.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np


def write_seq(
    path: Path,
    frames: np.ndarray,
    *,
    version: int = 5,
    stride_pad: int = 512,
    header_overrides: dict[str, int] | None = None,
    trailing: bytes = b"",
) -> Path:
    """Write ``frames`` (``(n, rows, cols)`` uint8/16/32) and return ``path``."""
    n, height, width = frames.shape
    depth = frames.dtype.itemsize * 8
    image = width * height * frames.dtype.itemsize
    stride = -(-(image + 8) // stride_pad) * stride_pad  # image, timestamp, padding
    fields = {
        "magic": 0xFEED,
        "version": version,
        "header_size": 1024,
        "width": width,
        "height": height,
        "bit_depth": depth,
        "bit_depth_real": depth,
        "image_size_bytes": image,
        "image_format": 100,
        "allocated_frames": n,
        "origin": 0,
        "true_image_size": stride,
        "compression_format": 0,
        **(header_overrides or {}),
    }
    header = bytearray(1024)
    struct.pack_into("<L", header, 0, fields["magic"])
    header[4:24] = "Norpix seq".encode("utf-16-le")
    struct.pack_into("<ll", header, 28, fields["version"], fields["header_size"])
    description = "quantem test".encode("utf-16-le") + b"\0\0"
    header[36 : 36 + len(description)] = description
    struct.pack_into(
        "<9L",
        header,
        548,
        *(
            fields[k]
            for k in (
                "width",
                "height",
                "bit_depth",
                "bit_depth_real",
                "image_size_bytes",
                "image_format",
                "allocated_frames",
                "origin",
                "true_image_size",
            )
        ),
    )
    struct.pack_into("<d", header, 584, 400.0)
    struct.pack_into("<L", header, 620, fields["compression_format"])
    assert len(header) == 1024, len(header)
    offset = 8192 if version >= 5 else 1024
    with open(path, "wb") as f:
        f.write(bytes(header) + bytes(offset - 1024))
        for i, frame in enumerate(frames):
            body = np.ascontiguousarray(frame, dtype=frame.dtype.newbyteorder("<")).tobytes()
            stamp = struct.pack("<LHH", 1_700_000_000 + i, i % 1000, 0)
            f.write(body + stamp + bytes(stride - image - 8))
        f.write(trailing)
    return path
