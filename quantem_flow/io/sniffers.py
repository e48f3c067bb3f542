"""Content sniffers of the built-in formats whose reader modules keep no sniffer.

A sniffer is ``sniff(path, head) -> bool``: from the first bytes of a file
(``head``, up to :data:`HEAD_BYTES`; ``b""`` for a directory) it says
cheaply whether the file is in its format.  It never raises and never
imports a heavy module before a cheap signature has matched (an HDF5
sniffer may open the file with h5py once the HDF5 signature is there).
The first line of a sniffer's docstring says what it looks for; detection
errors quote it.

The sniffers of readers whose modules import Numba (Dectris, counted, K2 IS,
raw_csr) live here too: detection calls every sniffer, and a `.npy` opened
in a fresh interpreter imported Numba for them (0.15-0.3 s).  Lighter
reader modules (EMD, Velox, ...) keep theirs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "COUNTED_FRAMES",
    "DECTRIS_DATA_GROUP",
    "DECTRIS_LINK_NAME",
    "HDF5_SIGNATURE",
    "HEAD_BYTES",
    "K2_SYNC",
    "counted",
    "dectris_master",
    "has_hdf5_signature",
    "hdf5_sniff_open",
    "hdf5_structure",
    "k2is",
    "mib",
    "npy",
    "raw_csr",
    "read_head",
    "zarr",
]

#: The Dectris master's group of ``data_NNNNNN`` links to the data files.
DECTRIS_DATA_GROUP = "/entry/data"
#: Names of the links in :data:`DECTRIS_DATA_GROUP`.
DECTRIS_LINK_NAME = re.compile(r"^data_(\d+)$")
#: The stempy electron-counted layout's dataset of per-frame events.
COUNTED_FRAMES = "/electron_events/frames"
#: The sync word starting every K2 IS block header (big-endian).
K2_SYNC = 0xFFFF0055
_RAW_CSR_FILETYPE = re.compile(
    rb"^\s*filetype\s*=\s*[\"']raw_csr[\"']", re.IGNORECASE | re.MULTILINE
)

#: Bytes of a file's start passed to every sniffer.
HEAD_BYTES = 4096
#: The HDF5 format signature (HDF5 File Format Specification, "Format Signature").
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: The signature may follow a user block of 512, 1024, 2048... bytes; offsets looked at.
_HDF5_OFFSETS = tuple([0] + [512 << i for i in range(12)])  # up to 1 MiB


def read_head(path: Path, n: int = HEAD_BYTES) -> bytes:
    """Return the first ``n`` bytes of a file, ``b""`` for a directory or an unreadable file."""
    if path.is_dir():
        return b""
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def has_hdf5_signature(path: Path, head: bytes) -> bool:
    """Whether the HDF5 signature is at offset 0 or after a power-of-two user block."""
    for offset in _HDF5_OFFSETS:
        if offset + 8 <= len(head):
            if head[offset : offset + 8] == HDF5_SIGNATURE:
                return True
            continue
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                if f.read(8) == HDF5_SIGNATURE:
                    return True
        except OSError:
            return False
    return False


def hdf5_sniff_open(path: Path, head: bytes) -> Any:
    """Open an HDF5 file for a structure sniffer, or return ``None`` (no signature, unreadable)."""
    if not has_hdf5_signature(path, head):
        return None
    try:
        import h5py

        return h5py.File(path, "r")
    except Exception:  # a sniffer never raises: a damaged file is simply not recognised
        return None


def hdf5_structure(path: Path, head: bytes, check: Callable[[Any], Any]) -> bool:
    """Whether ``check(h5py.File)`` is true of an HDF5 file; ``False`` for anything else.

    The structure sniffers' common frame: no signature, an unreadable file
    or an exception in ``check`` is simply not the format (a sniffer never
    raises).
    """
    f = hdf5_sniff_open(path, head)
    if f is None:
        return False
    try:
        with f:
            return bool(check(f))
    except Exception:  # a sniffer never raises
        return False


def hdf5(path: Path, head: bytes) -> bool:
    r"""The HDF5 signature ``\x89HDF\r\n\x1a\n`` (at offset 0 or after a user block)."""
    try:
        return has_hdf5_signature(path, head)
    except Exception:
        return False


def npy(path: Path, head: bytes) -> bool:
    r"""The NumPy ``\x93NUMPY`` magic string at offset 0."""
    return head.startswith(b"\x93NUMPY")


def mib(path: Path, head: bytes) -> bool:
    """A Merlin frame header (``MQ1,``), or a Merlin acquisition header ``.hdr`` (``HDR,``)."""
    return head.startswith(b"MQ1,") or (head.startswith(b"HDR,") and path.suffix.lower() == ".hdr")


def zarr(path: Path, head: bytes) -> bool:
    """A directory holding ``zarr.json`` (Zarr v3) or ``.zarray``/``.zgroup`` (v2)."""
    try:
        return path.is_dir() and any(
            (path / name).is_file() for name in ("zarr.json", ".zarray", ".zgroup")
        )
    except OSError:
        return False


def _dectris_links(f: Any) -> bool:
    group = f.get(DECTRIS_DATA_GROUP)
    return hasattr(group, "keys") and any(DECTRIS_LINK_NAME.match(n) for n in group)


def dectris_master(path: Path, head: bytes) -> bool:
    """An HDF5 file whose ``/entry/data`` group holds ``data_NNNNNN`` links (a Dectris master)."""
    return hdf5_structure(path, head, _dectris_links)


def counted(path: Path, head: bytes) -> bool:
    """An HDF5 file holding ``/electron_events/frames`` (the stempy electron-counted layout)."""
    return hdf5_structure(path, head, lambda f: COUNTED_FRAMES in f)


def k2is(path: Path, head: bytes) -> bool:
    """A sector file starting with the block sync word 0xFFFF0055, or a .gtg beside them."""
    if head[:4] == K2_SYNC.to_bytes(4, "big"):
        return True
    return path.suffix.lower() == ".gtg" and head[:4] in (b"\x00\x00\x00\x03", b"\x00\x00\x00\x04")


def raw_csr(path: Path, head: bytes) -> bool:
    """A TOML descriptor whose ``[params]`` say ``filetype = "raw_csr"``."""
    return b"[params]" in head and _RAW_CSR_FILETYPE.search(head) is not None
