"""EMPAD acquisitions: an XML description plus a raw file of float32 frames.

The XML names the raw file (``<raw_file filename="...">``, resolved next to
the XML; any directory in the name is the acquisition PC's and is ignored)
and the scan size::

    <root>
      <raw_file filename="scan_x256_y256.raw"/>
      <scan_parameters mode="acquire">
        <scan_resolution_x>256</scan_resolution_x>
        <scan_resolution_y>256</scan_resolution_y>
      </scan_parameters>
    </root>

``scan_resolution_x`` is the number of scan columns (fast axis) and
``scan_resolution_y`` the number of rows.  Older files give ``<pix_x>`` and
``<pix_y>`` under the root instead.  Each raw record is 130 rows x 128
columns of little-endian float32: the 128 x 128 frame then two footer rows,
which are dropped.
"""

from __future__ import annotations

import dataclasses
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path, PureWindowsPath
from typing import Any, ClassVar

import numpy as np

from ..calibration import Calibration
from ..errors import FormatError, ScanShapeError, SourceNotFoundError
from .base import (
    FrameSource,
    SourceIdentity,
    check_exists,
    header_digest,
    path_size,
    resolve_scan_shape,
    sidecar_calibration,
)
from .raw import RawSource

__all__ = ["EMPAD_FOOTER_BYTES", "EMPAD_FRAME_SHAPE", "EmpadSource", "parse_empad_xml"]

EMPAD_FRAME_SHAPE = (128, 128)
#: Two footer rows of 128 float32 after every frame.
EMPAD_FOOTER_BYTES = 2 * 128 * 4
EMPAD_DTYPE = "<f4"
_RECORD_BYTES = EMPAD_FRAME_SHAPE[0] * EMPAD_FRAME_SHAPE[1] * 4 + EMPAD_FOOTER_BYTES

_MAX_METADATA_ENTRIES = 200


@dataclasses.dataclass(frozen=True)
class EmpadXml:
    """What the reader takes from an EMPAD XML file.

    Attributes
    ----------
    raw_name
        File name of the raw data (directory part dropped).
    kind
        ``"scan"`` or ``"series"`` (``<type>``; ``"scan"`` when absent).
    scan_shapes
        ``(rows, cols)`` per ``<scan_parameters mode=...>`` (``"acquire"``,
        ``"search"``...), plus ``"pix"`` for root ``<pix_x>``/``<pix_y>``.
    series_count
        ``<count>`` of a series, if given.
    fields
        Flattened leaf elements (``"iom_measurements/high_voltage": "300000"``).

    """

    raw_name: str
    kind: str
    scan_shapes: dict[str, tuple[int, int]]
    series_count: int | None
    fields: dict[str, str]


def parse_empad_xml(path: Path) -> EmpadXml:
    """Parse an EMPAD XML file.

    Parameters
    ----------
    path
        The ``.xml`` file.

    Returns
    -------
    EmpadXml
        Raw file name, scan shapes and flattened metadata.

    Raises
    ------
    FormatError
        If the file is not XML or names no raw file.

    """
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        raise FormatError(f"{str(path)!r} is not a readable EMPAD XML file: {exc}") from exc
    raw = root.find("raw_file")
    raw_name = raw.get("filename") if raw is not None else None
    if not raw_name:
        raise FormatError(
            f"{str(path)!r} has no <raw_file filename=...> element, so the raw data file is "
            "unknown; open the raw file with format='raw', dtype='<f4', frame_shape=(128, 128), "
            f"frame_footer_bytes={EMPAD_FOOTER_BYTES} instead"
        )
    # The name may carry the acquisition PC's directory (either separator).
    raw_name = PureWindowsPath(raw_name).name
    typ = (root.findtext("type") or "scan").strip().lower()
    shapes: dict[str, tuple[int, int]] = {}
    for params in root.findall("scan_parameters"):
        mode = params.get("mode", "acquire")
        x = _scan_value(params, "scan_resolution_x", path)
        y = _scan_value(params, "scan_resolution_y", path)
        if x is not None and y is not None and mode not in shapes:
            shapes[mode] = (y, x)
    px = _int_text(root.findtext("pix_x"), "pix_x", path)
    py = _int_text(root.findtext("pix_y"), "pix_y", path)
    if px is not None and py is not None:
        shapes["pix"] = (py, px)
    count = _int_text(root.findtext("count"), "count", path)
    if count is None:
        for params in root.findall("scan_parameters"):
            count = _scan_value(params, "series_count", path)
            if count is not None:
                break
    return EmpadXml(
        raw_name=raw_name,
        kind=typ,
        scan_shapes=shapes,
        series_count=count,
        fields=_flatten(root),
    )


def _scan_value(params: ET.Element, name: str, path: Path) -> int | None:
    """Read ``<name>N</name>`` or ``<parameter name="name">N</parameter>``."""
    text = params.findtext(name)
    if text is None:
        for p in params.findall("parameter"):
            if p.get("name") == name:
                text = p.text if p.text is not None else p.get("value")
                break
    return _int_text(text, name, path)


def _int_text(text: str | None, name: str, path: Path) -> int | None:
    if text is None:
        return None
    try:
        value = int(float(text.strip()))
    except ValueError as exc:
        raise FormatError(
            f"<{name}> in {str(path)!r} holds {text!r}; expected a positive integer"
        ) from exc
    if value < 1:
        raise FormatError(f"<{name}> in {str(path)!r} holds {value}; expected a positive integer")
    return value


def _flatten(root: ET.Element) -> dict[str, str]:
    """Return leaf elements (and attributes of empty ones) as ``path: text``."""
    out: dict[str, str] = {}

    def visit(elem: ET.Element, prefix: str) -> None:
        for child in elem:
            if len(out) >= _MAX_METADATA_ENTRIES:
                return
            key = f"{prefix}{child.tag}"
            if "mode" in child.attrib:
                key += f"[{child.attrib['mode']}]"
            if len(child):
                visit(child, key + "/")
                continue
            text = (child.text or "").strip()
            if text and len(text) <= 200:
                out.setdefault(key, text)
            for attr, value in child.attrib.items():
                if attr != "mode" and len(value) <= 200:
                    out.setdefault(f"{key}@{attr}", value)

    visit(root, "")
    return out


class EmpadSource(FrameSource):
    """An EMPAD acquisition opened through its XML file.

    Parameters
    ----------
    path
        The ``.xml`` file; the raw file it names must lie next to it.
    scan_shape
        ``None`` to use the XML's scan size (or, if it has none, a JSON
        sidecar); ``(rows, cols)`` or ``"square"`` to override the XML (the
        override is recorded as a note when it differs).
    frame_offset
        Leading frames to skip.

    Notes
    -----
    The XML's ``mode="acquire"`` scan parameters are used.  When they do not
    match the raw file but the ``mode="search"`` ones do (some acquisition
    software versions swap them), the search ones are used and a note says
    so.

    """

    format: ClassVar[str] = "empad"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        scan_shape: Sequence[int] | str | None = None,
        frame_offset: int = 0,
    ):
        self._path = check_exists(path, what="EMPAD XML file")
        self._xml = parse_empad_xml(self._path)
        self._raw_path = self._path.parent / self._xml.raw_name
        if not self._raw_path.exists():
            raise SourceNotFoundError(
                f"raw file {str(self._raw_path)!r} named by <raw_file> in {str(self._path)!r} "
                "does not exist; EMPAD raw files must keep their name and lie next to the XML"
            )
        self._raw_path = self._raw_path.resolve()
        size = self._raw_path.stat().st_size
        if size < _RECORD_BYTES or size % _RECORD_BYTES:
            raise FormatError(
                f"EMPAD raw file {str(self._raw_path)!r} holds {size} bytes, which is "
                f"{size / _RECORD_BYTES:.4g} records of {_RECORD_BYTES} bytes (130 x 128 float32); "
                "expected a whole number: the file is truncated or not an EMPAD raw file"
            )
        n_frames = size // _RECORD_BYTES
        self._extra_notes: list[str] = []
        choice = self._choose_scan(n_frames, scan_shape, frame_offset)
        self._set_frames(
            n_frames=n_frames,
            frame_shape=EMPAD_FRAME_SHAPE,
            dtype=EMPAD_DTYPE,
            scan_shape=choice[0],
            path=self._path,
            frame_offset=frame_offset,
        )
        if choice[1] is not None:
            self._scan = dataclasses.replace(self._scan, how=choice[1])
        self._raw = RawSource(
            self._raw_path,
            dtype=EMPAD_DTYPE,
            frame_shape=EMPAD_FRAME_SHAPE,
            scan_shape=self._scan.shape,
            frame_footer_bytes=EMPAD_FOOTER_BYTES,
            frame_offset=frame_offset,
        )

    def _choose_scan(
        self, n_frames: int, scan_shape: Sequence[int] | str | None, frame_offset: int
    ) -> tuple[Sequence[int] | str | None, str | None]:
        """Return the scan shape to pass on and how it was found (``None``: as resolved)."""
        shapes = self._xml.scan_shapes
        xml_shape = shapes.get("acquire") or shapes.get("pix")
        xml_from = "XML <scan_parameters mode='acquire'>" if "acquire" in shapes else "XML <pix_x>"
        if scan_shape is not None:
            if xml_shape is not None and (
                isinstance(scan_shape, str) or tuple(int(v) for v in scan_shape) != xml_shape
            ):
                self._extra_notes.append(
                    f"scan_shape={scan_shape!r} was given and overrides the scan shape "
                    f"{xml_shape} written in {str(self._path)!r}"
                )
            return scan_shape, None
        if xml_shape is None:
            # No scan size in the XML (a series, or an older file): sidecar or error.
            return None, None
        usable = n_frames - frame_offset
        if xml_shape[0] * xml_shape[1] != usable:
            search = shapes.get("search")
            if search is not None and search[0] * search[1] == usable:
                self._extra_notes.append(
                    f"the XML's acquire scan size {xml_shape} does not match the {usable} frames "
                    f"of {str(self._raw_path)!r} but its search scan size {search} does; "
                    "the search scan size was used"
                )
                return search, "XML <scan_parameters mode='search'> (acquire did not match)"
            # Let resolve_scan_shape raise its message, naming the XML as the source.
            try:
                resolve_scan_shape(n_frames, xml_shape, frame_offset=frame_offset)
            except ScanShapeError as exc:
                raise ScanShapeError(
                    f"{str(self._path)!r}: {exc}. The shape came from the XML; pass "
                    "scan_shape=(rows, cols) to override it"
                ) from exc
        return xml_shape, xml_from

    # -- properties --------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The XML file."""
        return self._path

    @property
    def raw_path(self) -> Path:
        """The raw data file."""
        return self._raw_path

    @property
    def notes(self) -> list[str]:
        """Explicit choices made while opening."""
        return super().notes + list(self._extra_notes)

    @property
    def identity(self) -> SourceIdentity:
        """XML and raw paths and sizes, and a digest of the XML and the record layout."""
        return SourceIdentity(
            format=self.format,
            paths=(str(self._path), str(self._raw_path)),
            file_sizes=(path_size(self._path), path_size(self._raw_path)),
            header_sha256=header_digest(
                self._path.read_bytes(),
                EMPAD_DTYPE,
                EMPAD_FRAME_SHAPE,
                EMPAD_FOOTER_BYTES,
                self._n_frames,
            ),
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """Raw file, record layout, XML scan sizes and flattened XML fields."""
        return {
            "raw_file": str(self._raw_path),
            "stored_dtype": EMPAD_DTYPE,
            "record_shape": [130, 128],
            "frame_footer_bytes": EMPAD_FOOTER_BYTES,
            "acquisition_type": self._xml.kind,
            "xml_scan_shapes": {k: list(v) for k, v in self._xml.scan_shapes.items()},
            "xml_series_count": self._xml.series_count,
            "xml": dict(self._xml.fields),
            **self.scan_metadata(),
        }

    @property
    def calibration(self) -> Calibration | None:
        """Calibration from a JSON sidecar next to the XML, if any."""
        return sidecar_calibration(self._path)

    # -- reading -------------------------------------------------------------------
    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read frames ``[start, stop)`` without their footer rows."""
        return self._raw.read_frames(start, stop, out=out)

    def close(self) -> None:
        """Drop the memory map."""
        self._raw.close()
