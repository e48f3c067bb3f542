"""Writers of small test files in every format the readers support.

Each writer takes frames in scan order and returns the path to open.  They
write the real on-disk layouts (NeXus master + bitshuffle/LZ4 data files,
EMPAD XML + raw with footer rows, Merlin MQ1 headers...) so that the readers
are tested against the byte layout of the instruments, not against
themselves.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "MIB_HEADER_BYTES_QUAD",
    "MIB_HEADER_BYTES_SINGLE",
    "mib_header",
    "write_dectris",
    "write_empad",
    "write_hdf5",
    "write_mib",
    "write_npy",
    "write_raw",
    "write_sidecar",
    "write_stempy",
    "write_zarr",
]


def write_sidecar(path: Path, scan_shape: Sequence[int], **extra: Any) -> Path:
    """Write ``<path>.json`` holding ``{"scan_shape": [...], ...}``."""
    side = Path(str(path) + ".json")
    side.write_text(json.dumps({"scan_shape": [int(v) for v in scan_shape], **extra}))
    return side


# -- simple formats -------------------------------------------------------------------


def write_npy(path: Path, array: np.ndarray) -> Path:
    """Write a ``.npy`` file."""
    np.save(path, array)
    return path


def write_raw(
    path: Path,
    frames: np.ndarray,
    *,
    dtype: str,
    offset: int = 0,
    header_bytes: int = 0,
    footer_bytes: int = 0,
) -> Path:
    """Write frames ``(n, k_r, k_c)`` as raw records with junk headers and footers."""
    frames = np.asarray(frames, dtype=np.dtype(dtype))
    with open(path, "wb") as f:
        f.write(b"\xab" * offset)
        for frame in frames:
            f.write(b"\xcd" * header_bytes)
            f.write(frame.tobytes())
            f.write(b"\xef" * footer_bytes)
    return path


def write_hdf5(
    path: Path,
    array: np.ndarray,
    *,
    dataset_path: str = "/data",
    bitshuffle: bool = True,
    chunks: tuple[int, ...] | None = None,
) -> Path:
    """Write one 3-D or 4-D dataset, bitshuffle + LZ4 compressed by default."""
    import h5py
    import hdf5plugin

    if chunks is None:
        chunks = (1,) * (array.ndim - 2) + tuple(array.shape[-2:])
    kwargs: dict[str, Any] = dict(hdf5plugin.Bitshuffle(cname="lz4")) if bitshuffle else {}
    with h5py.File(path, "w") as f:
        f.create_group("/other").create_dataset("scalar", data=1.0)
        f.create_dataset(dataset_path, data=array, chunks=chunks, **kwargs)
    return path


def write_zarr(
    path: Path,
    array: np.ndarray,
    *,
    array_path: str | None = None,
    chunks: tuple[int, ...] | None = None,
    compressor: str = "blosc",
) -> Path:
    """Write a Zarr v3 store with the array at the root or at ``array_path`` in a group."""
    import zarr
    from zarr.codecs import BloscCodec, ZstdCodec

    codec = (
        BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")
        if compressor == "blosc"
        else ZstdCodec(level=3)
    )
    if chunks is None:
        chunks = tuple(max(1, s // 2) for s in array.shape[:-2]) + tuple(array.shape[-2:])
    if array_path is None:
        z = zarr.create_array(
            path,
            shape=array.shape,
            chunks=chunks,
            dtype=array.dtype,
            compressors=codec,
            zarr_format=3,
        )
    else:
        root = zarr.open_group(path, mode="w", zarr_format=3)
        root.attrs["instrument"] = "test"
        root.create_array("notes", shape=(3,), dtype="i4")
        z = root.create_array(
            array_path, shape=array.shape, chunks=chunks, dtype=array.dtype, compressors=codec
        )
    z[...] = array
    z.attrs["written_by"] = "tests.io.writers"
    return path


# -- Dectris ------------------------------------------------------------------------------


def write_dectris(
    directory: Path,
    name: str,
    frames: np.ndarray,
    *,
    frames_per_file: int = 1000,
    bit_depth: int = 16,
    compression: bool = True,
    pixel_mask: np.ndarray | None = None,
    ntrigger: int = 1,
) -> Path:
    """Write a Dectris-style NeXus master and its data files.

    Parameters
    ----------
    directory
        Where to write ``<name>_master.h5`` and ``<name>_data_NNNNNN.h5``.
    name
        Acquisition name.
    frames
        ``(n, k_r, k_c)`` in scan order; cast to ``uint{bit_depth}``.
    frames_per_file
        Frames per data file (the last one may hold fewer).
    bit_depth
        8, 16 or 32.
    compression
        Bitshuffle + LZ4 (filter 32008), one frame per chunk, as the
        detector writes them; ``False`` writes uncompressed chunks.
    pixel_mask
        ``(k_r, k_c)`` mask stored as ``detectorSpecific/pixel_mask``.
    ntrigger
        Value stored as ``detectorSpecific/ntrigger``.

    Returns
    -------
    Path
        The master file.
    """
    import h5py
    import hdf5plugin

    dtype = np.dtype(f"uint{bit_depth}")
    frames = np.asarray(frames).astype(dtype)
    n, kr, kc = frames.shape
    directory = Path(directory)
    master = directory / f"{name}_master.h5"
    filt: dict[str, Any] = dict(hdf5plugin.Bitshuffle(cname="lz4")) if compression else {}
    links: list[tuple[str, str]] = []
    for i, start in enumerate(range(0, n, frames_per_file), start=1):
        block = frames[start : start + frames_per_file]
        fname = f"{name}_data_{i:06d}.h5"
        with h5py.File(directory / fname, "w") as f:
            entry = f.create_group("entry")
            entry.attrs["NX_class"] = "NXentry"
            data = entry.create_group("data")
            data.attrs["NX_class"] = "NXdata"
            d = data.create_dataset("data", data=block, chunks=(1, kr, kc), **filt)
            d.attrs["image_nr_low"] = np.int32(start + 1)
            d.attrs["image_nr_high"] = np.int32(start + len(block))
        links.append((f"data_{i:06d}", fname))
    with h5py.File(master, "w") as f:
        entry = f.create_group("entry")
        entry.attrs["NX_class"] = "NXentry"
        data = entry.create_group("data")
        data.attrs["NX_class"] = "NXdata"
        for link, fname in links:
            data[link] = h5py.ExternalLink(fname, "/entry/data/data")
        inst = entry.create_group("instrument")
        inst.attrs["NX_class"] = "NXinstrument"
        det = inst.create_group("detector")
        det.attrs["NX_class"] = "NXdetector"
        det.create_dataset("description", data=np.bytes_(b"Dectris ARINA"))
        det.create_dataset("detector_number", data=np.bytes_(b"E-01-0001"))
        det.create_dataset("x_pixels_in_detector", data=np.uint32(kc))
        det.create_dataset("y_pixels_in_detector", data=np.uint32(kr))
        det.create_dataset("bit_depth_image", data=np.uint32(bit_depth))
        det.create_dataset("bit_depth_readout", data=np.uint32(bit_depth))
        for field, value, units in (
            ("count_time", 9.9e-5, "s"),
            ("frame_time", 1.0e-4, "s"),
            ("x_pixel_size", 1.0e-4, "m"),
            ("y_pixel_size", 1.0e-4, "m"),
            ("detector_distance", 0.1, "m"),
        ):
            ds = det.create_dataset(field, data=np.float32(value))
            ds.attrs["units"] = np.bytes_(units.encode())
        det.create_dataset("countrate_correction_applied", data=np.uint8(1))
        spec = det.create_group("detectorSpecific")
        spec.create_dataset("nimages", data=np.uint32(n // ntrigger))
        spec.create_dataset("ntrigger", data=np.uint32(ntrigger))
        spec.create_dataset("software_version", data=np.bytes_(b"1.0.0"))
        mask = np.zeros((kr, kc), np.uint32) if pixel_mask is None else pixel_mask
        spec.create_dataset("pixel_mask", data=np.asarray(mask, dtype=np.uint32))
    return master


# -- EMPAD ----------------------------------------------------------------------------------

EMPAD_ROWS_RAW = 130
EMPAD_COLS = 128


def write_empad(
    directory: Path,
    name: str,
    frames: np.ndarray,
    *,
    scan_shape_in_xml: bool = True,
    raw_subdir_in_xml: str = "",
) -> Path:
    """Write an EMPAD acquisition: ``<name>.xml`` plus ``<name>.raw``.

    Parameters
    ----------
    directory
        Output directory.
    name
        Acquisition name.
    frames
        ``(R, C, 128, 128)`` float32.  Each raw record is 130 x 128
        little-endian float32: the frame then two footer rows, written with
        nonzero junk so that a reader which keeps them fails.
    scan_shape_in_xml
        Write ``<scan_parameters mode="acquire">`` with the scan size; when
        ``False`` the XML has no scan size and the reader needs one.
    raw_subdir_in_xml
        A directory prefix written before the raw file name in the XML (the
        instrument PC's path), which the reader must ignore.

    Returns
    -------
    Path
        The XML file.
    """
    frames = np.asarray(frames, dtype=np.float32)
    if frames.ndim != 4 or frames.shape[2:] != (128, 128):
        raise ValueError(f"EMPAD frames must be (R, C, 128, 128), got {frames.shape}")
    R, C = frames.shape[:2]
    directory = Path(directory)
    raw = directory / f"{name}.raw"
    records = np.empty((R * C, EMPAD_ROWS_RAW, EMPAD_COLS), dtype="<f4")
    records[:, :128] = frames.reshape(R * C, 128, 128)
    junk = np.arange(R * C * 2 * 128, dtype="<f4").reshape(R * C, 2, 128)
    records[:, 128:] = -1.0e6 - junk
    records.tofile(raw)
    scan = (
        f'  <scan_parameters mode="search">\n'
        f"    <scan_resolution_x>{C + 3}</scan_resolution_x>\n"
        f"    <scan_resolution_y>{R + 5}</scan_resolution_y>\n"
        f"  </scan_parameters>\n"
        f'  <scan_parameters mode="acquire">\n'
        f"    <scan_resolution_x>{C}</scan_resolution_x>\n"
        f"    <scan_resolution_y>{R}</scan_resolution_y>\n"
        f'    <dwell_time units="s">0.001</dwell_time>\n'
        f"  </scan_parameters>\n"
        if scan_shape_in_xml
        else ""
    )
    prefix = raw_subdir_in_xml.rstrip("/\\") + "/" if raw_subdir_in_xml else ""
    xml = directory / f"{name}.xml"
    xml.write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<root name="{name}">\n'
        "  <software_version>1.2.0 (2021-01-01)</software_version>\n"
        '  <timestamp isoformat="2024-05-01T12:00:00">May 1 2024 12:00:00</timestamp>\n'
        f'  <raw_file filename="{prefix}{name}.raw"/>\n'
        "  <type>scan</type>\n"
        f"{scan}"
        "  <iom_measurements>\n"
        "    <high_voltage>300000</high_voltage>\n"
        "    <calibrated_pixelsize>0.0021</calibrated_pixelsize>\n"
        "  </iom_measurements>\n"
        "</root>\n"
    )
    return xml


# -- Merlin ----------------------------------------------------------------------------------

MIB_HEADER_BYTES_SINGLE = 384
MIB_HEADER_BYTES_QUAD = 768
_MIB_DTYPES = {"U08": ">u1", "U16": ">u2", "U32": ">u4"}
_MIB_DACS = (
    "3RX,175,511,000,000,000,000,000,000,125,255,125,125,100,100,082,100,087,030,128,004,255,"
    "129,128,176,168,511,511"
)


def mib_header(
    sequence: int,
    *,
    depth: str = "U16",
    quad: bool = False,
    width: int | None = None,
    height: int | None = None,
) -> bytes:
    """Return one Merlin MQ1 frame header of the real field layout.

    Fields: ``MQ1``, sequence number, data offset (= header size), number of
    chips, width, height, pixel depth, sensor layout, chip select, time stamp,
    shutter time, counter, colour mode, gain mode, eight thresholds, then per
    chip the DAC block, then the extended time stamp, shutter time in ns and
    counter depth.  Padded with NUL bytes to 384 (single chip) or 768 (quad).
    """
    size = MIB_HEADER_BYTES_QUAD if quad else MIB_HEADER_BYTES_SINGLE
    n_chips = 4 if quad else 1
    w = width if width is not None else (512 if quad else 256)
    h = height if height is not None else (512 if quad else 256)
    counter_depth = {"U08": 6, "U16": 12, "U32": 24, "R64": 12}[depth]
    fields = [
        "MQ1",
        f"{sequence:06d}",
        f"{size:05d}",
        f"{n_chips:02d}",
        f"{w:05d}",
        f"{h:05d}",
        depth,
        "   2x2" if quad else "   1x1",
        "0F" if quad else "01",
        "2024-05-01 12:00:00.000000",
        "0.001000",
        "0",
        "0",
        "0",
        *(["1.000000E+1", "5.110000E+2"] + ["0.000000E+0"] * 6),
        *([_MIB_DACS] * n_chips),
        "MQ1A",
        "2024-05-01T12:00:00.000000000Z",
        "1000000ns",
        str(counter_depth),
    ]
    text = ",".join(fields).encode("ascii") + b","
    if len(text) > size:
        raise ValueError(f"header text {len(text)} bytes does not fit in {size}")
    return text.ljust(size, b"\x00")


def write_mib(
    path: Path,
    frames: np.ndarray,
    *,
    depth: str = "U16",
    quad: bool = False,
    hdr: dict[str, str] | None = None,
    first_sequence: int = 1,
) -> Path:
    """Write a Merlin ``.mib`` file in processed mode.

    Parameters
    ----------
    path
        Output file.
    frames
        ``(n, k_r, k_c)``; ``(n, 256, 256)`` single chip, ``(n, 512, 512)``
        quad (already assembled, as processed mode stores it).
    depth
        ``"U08"``, ``"U16"`` or ``"U32"`` (big-endian on disk), or ``"R64"``
        to write a raw-mode header (the pixel bytes are then meaningless).
    quad
        Write 768-byte quad headers (4 chips, layout ``2x2``).
    hdr
        Key/value pairs of an acquisition header written to ``<stem>.hdr``.
    first_sequence
        Sequence number of the first frame.

    Returns
    -------
    Path
        The ``.mib`` file.
    """
    frames = np.asarray(frames)
    n, kr, kc = frames.shape
    on_disk = np.dtype(_MIB_DTYPES.get(depth, ">u8"))
    data = frames.astype(on_disk)
    with open(path, "wb") as f:
        for i in range(n):
            f.write(mib_header(first_sequence + i, depth=depth, quad=quad, width=kc, height=kr))
            f.write(data[i].tobytes())
    if hdr is not None:
        lines = ["HDR,\t"] + [f"{k}:\t{v}" for k, v in hdr.items()] + ["End\t"]
        Path(path).with_suffix(".hdr").write_text("\n".join(lines) + "\n")
    return Path(path)


# -- electron-counted (NCEM 4D Camera / stempy) ---------------------------------------------


def write_stempy(
    path: Path,
    events_per_frame: Sequence[np.ndarray],
    scan_shape: Sequence[int],
    frame_shape: Sequence[int],
    positions: Sequence[int] | np.ndarray | None = None,
    *,
    attrs: str = "NxNy",
    version: int | None = None,
    positions_dtype: str = "int32",
) -> Path:
    """Write an electron-counted HDF5 file in the stempy layout.

    Parameters
    ----------
    path
        Output file.
    events_per_frame
        One 1-D array of flat pixel indices ``r * k_c + c`` per frame entry
        (one element per electron; a repeated index is a count > 1).
    scan_shape, frame_shape
        ``(rows, cols)`` of the scan and the detector.
    positions
        Flat scan index of each frame entry; ``None`` writes
        ``arange(len(events_per_frame))``.
    attrs
        ``"NxNy"`` (``Nx`` = width, ``Ny`` = height on both datasets),
        ``"dimensions"`` (``frame_dimensions`` / ``scan_dimensions`` =
        (width, height)) or ``"none"``.
    version
        Root ``version`` attribute, if any.
    positions_dtype
        Dtype of ``scan_positions``.

    Returns
    -------
    Path
        The file.
    """
    import h5py

    R, C = (int(v) for v in scan_shape)
    kr, kc = (int(v) for v in frame_shape)
    n = len(events_per_frame)
    pos = np.arange(n) if positions is None else np.asarray(positions)
    with h5py.File(path, "w") as f:
        if version is not None:
            f.attrs["version"] = version
        group = f.create_group("electron_events")
        sp = group.create_dataset("scan_positions", data=pos.astype(positions_dtype))
        frames = group.create_dataset("frames", shape=(n,), dtype=h5py.vlen_dtype(np.uint32))
        obj = np.empty(n, dtype=frames.dtype)  # vlen dtype: equal lengths stay 1-D
        for i, ev in enumerate(events_per_frame):
            obj[i] = np.asarray(ev, dtype=np.uint32)
        if n:
            frames.write_direct(obj)
        if attrs == "NxNy":
            frames.attrs["Nx"] = kc
            frames.attrs["Ny"] = kr
            sp.attrs["Nx"] = C
            sp.attrs["Ny"] = R
        elif attrs == "dimensions":
            frames.attrs["frame_dimensions"] = np.array([kc, kr])
            sp.attrs["scan_dimensions"] = np.array([C, R])
        elif attrs != "none":
            raise ValueError(f"attrs must be 'NxNy', 'dimensions' or 'none', got {attrs!r}")
        f.create_group("stem").create_dataset("images", data=np.zeros((1, R, C), np.uint64))
    return Path(path)
