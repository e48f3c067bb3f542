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
``<pix_y>`` under the root instead (or as well).  Each raw record is 130
rows x 128 columns of little-endian float32: the 128 x 128 frame then two
footer rows, which are dropped.

The scan shape rule (see :meth:`EmpadSource._choose_scan`): a ``scan_shape``
given by the user wins (a difference from the XML is recorded); otherwise
the candidates, in order, are the ``acquire`` scan parameters, the root
``<pix_x>``/``<pix_y>``, the ``search`` scan parameters and a raw file name
of the form ``..._x<cols>_y<rows>.raw``; the first whose size equals the
number of frames in the raw file is used, the ones skipped are recorded as a
note, and when none fits the error lists them all.

Calibration recorded by the XML (field names of the EMPAD acquisition
software; values in SI units):

- ``iom_measurements/high_voltage``, ``iom_measurements/ColumnSourceHighVoltage``
  or ``iom_measurements/source.get_voltage``: accelerating voltage in V;
- ``iom_measurements/calibrated_diffraction_angle``: detector pixel size in
  rad, used as ``mrad`` (x 1000) on both axes.

``calibrated_pixelsize`` is not used: its unit differs between software
generations.  Nor is a scan step derived from
``optics.get_full_scan_field_of_view``: that is the microscope's full scan
field, which the EMPAD scan covers only in part (``scan_size``), so a step
derived from it is not reliable; give the scan step explicitly.  A value
outside a plausible range (10-2000 kV, 0-100 mrad per pixel) is not used and
a note says so.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
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
    calibration_choice,
    check_exists,
    header_digest,
    path_size,
    sidecar_calibration,
)
from .raw import RawSource

__all__ = [
    "EMPAD_FOOTER_BYTES",
    "EMPAD_FRAME_SHAPE",
    "EmpadSource",
    "parse_empad_xml",
    "sniff",
]

EMPAD_FRAME_SHAPE = (128, 128)
#: Two footer rows of 128 float32 after every frame.
EMPAD_FOOTER_BYTES = 2 * 128 * 4
EMPAD_DTYPE = "<f4"
_RECORD_BYTES = EMPAD_FRAME_SHAPE[0] * EMPAD_FRAME_SHAPE[1] * 4 + EMPAD_FOOTER_BYTES

_MAX_METADATA_ENTRIES = 200

#: XML fields holding the accelerating voltage, in volts, first found wins.
VOLTAGE_FIELDS = (
    "iom_measurements/high_voltage",
    "iom_measurements/ColumnSourceHighVoltage",
    "iom_measurements/source.get_voltage",
)
#: XML field holding the detector pixel size in radians.
ANGLE_FIELD = "iom_measurements/calibrated_diffraction_angle"
_SNIFF_LIMIT = 1 << 18
_NAME_SHAPE = re.compile(r"_x(\d+)_y(\d+)(?:\.raw)?$", re.IGNORECASE)


def sniff(path: Path, head: bytes) -> bool:
    """An XML document naming its raw data file in a ``<raw_file filename=...>`` element."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text.startswith(b"<") or b"\x00" in head:
        return False
    if b"<raw_file" in head:
        return True
    if len(head) < 4096:
        return False
    try:
        with open(path, "rb") as f:
            return b"<raw_file" in f.read(_SNIFF_LIMIT)
    except OSError:
        return False


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
        Flattened leaf elements (``"iom_measurements/high_voltage": "300000"``),
        at most 200 of them.
    calibration_fields
        The calibration fields (:data:`VOLTAGE_FIELDS`, :data:`ANGLE_FIELD`)
        present, wherever they are in the file.

    """

    raw_name: str
    kind: str
    scan_shapes: dict[str, tuple[int, int]]
    series_count: int | None
    fields: dict[str, str]
    calibration_fields: dict[str, str] = dataclasses.field(default_factory=dict)


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
        calibration_fields={
            name: text
            for name in (*VOLTAGE_FIELDS, ANGLE_FIELD)
            if (text := _leaf_text(root, name)) is not None
        },
    )


def _leaf_text(root: ET.Element, path: str) -> str | None:
    """The stripped text of the element at ``a/b`` below the root (tags matched literally)."""
    elem: ET.Element | None = root
    for tag in path.split("/"):
        elem = next((c for c in elem if c.tag == tag), None) if elem is not None else None
    if elem is None or elem.text is None or not elem.text.strip():
        return None
    return elem.text.strip()


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


def _float_field(fields: dict[str, str], name: str) -> float | None:
    """A finite number from a flattened XML field, or ``None`` when absent or not a number."""
    text = fields.get(name)
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


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

    def _scan_candidates(self) -> list[tuple[tuple[int, int], str]]:
        """The scan shapes the files record, in the order of the rule (module docstring)."""
        shapes = self._xml.scan_shapes
        out: list[tuple[tuple[int, int], str]] = []
        labels = {
            "acquire": "XML <scan_parameters mode='acquire'>",
            "pix": "XML <pix_x>/<pix_y>",
            "search": "XML <scan_parameters mode='search'>",
        }
        for key, label in labels.items():
            if key in shapes:
                out.append((shapes[key], label))
        m = _NAME_SHAPE.search(self._xml.raw_name)
        if m and int(m.group(1)) > 0 and int(m.group(2)) > 0:
            shape = (int(m.group(2)), int(m.group(1)))
            out.append((shape, f"raw file name {self._xml.raw_name!r}"))
        return out

    def _choose_scan(
        self, n_frames: int, scan_shape: Sequence[int] | str | None, frame_offset: int
    ) -> tuple[Sequence[int] | str | None, str | None]:
        """Return the scan shape to pass on and how it was found (``None``: as resolved).

        The rule: a given ``scan_shape`` wins (a difference from what the
        XML records is noted); otherwise the first of the acquire scan
        parameters, ``<pix_x>``/``<pix_y>``, the search scan parameters and
        the raw file name whose size equals the frame count is used.
        """
        cands = self._scan_candidates()
        xml_cands = [c for c in cands if c[1].startswith("XML")]
        if scan_shape is not None:
            first = xml_cands[0] if xml_cands else None
            if first is not None and (
                isinstance(scan_shape, str) or tuple(int(v) for v in scan_shape) != first[0]
            ):
                self._extra_notes.append(
                    f"scan_shape={scan_shape!r} was given and overrides the scan shape "
                    f"{first[0]} written in {str(self._path)!r} ({first[1]})"
                )
            return scan_shape, None
        if not xml_cands:
            # No scan size in the XML (a series, or a stripped file): sidecar or error.
            return None, None
        usable = n_frames - frame_offset
        for i, (shape, label) in enumerate(cands):
            if shape[0] * shape[1] != usable:
                continue
            if i:
                skipped = ", ".join(f"{s} from {lab}" for s, lab in cands[:i])
                self._extra_notes.append(
                    f"the scan shape {shape} was taken from {label} because {skipped} do(es) not "
                    f"match the {usable} frames of {str(self._raw_path)!r}"
                )
                label = f"{label} ({', '.join(lab for _, lab in cands[:i])} did not match)"
            return shape, label
        listed = "; ".join(f"{s} = {s[0] * s[1]} frames from {lab}" for s, lab in cands)
        raise ScanShapeError(
            f"{str(self._path)!r}: no scan shape recorded in the XML fits the {usable} frames of "
            f"{str(self._raw_path)!r} (after frame_offset={frame_offset}): {listed}. The shape "
            "came from the XML; pass scan_shape=(rows, cols) to override it"
        )

    def _xml_calibration(self) -> tuple[Calibration | None, str | None, list[str]]:
        """The calibration the XML records, where it came from, and notes on unused values."""
        fields = self._xml.calibration_fields
        notes: list[str] = []
        used: list[str] = []
        kwargs: dict[str, Any] = {}
        for name in VOLTAGE_FIELDS:
            value = _float_field(fields, name)
            if value is None:
                continue
            kv = value / 1000.0
            if 10.0 <= kv <= 2000.0:
                kwargs["accelerating_voltage_kV"] = kv
                used.append(f"{name} = {fields[name]} V -> {kv:g} kV")
            else:
                notes.append(
                    f"the EMPAD XML gives {name} = {fields[name]!r}, read as {kv:g} kV, outside "
                    "10-2000 kV; the voltage was not taken from it"
                )
            break
        angle = _float_field(fields, ANGLE_FIELD)
        if angle is not None:
            mrad = angle * 1000.0
            if 0.0 < mrad <= 100.0:
                kwargs["detector_sampling"] = (mrad, mrad)
                kwargs["detector_units"] = "mrad"
                used.append(f"{ANGLE_FIELD} = {fields[ANGLE_FIELD]} rad/px -> {mrad:g} mrad/px")
            else:
                notes.append(
                    f"the EMPAD XML gives {ANGLE_FIELD} = {fields[ANGLE_FIELD]!r} rad per pixel, "
                    f"{mrad:g} mrad, outside (0, 100] mrad; the detector was left uncalibrated"
                )
        if not kwargs:
            return None, None, notes
        return Calibration(**kwargs), f"EMPAD XML {str(self._path)!r}: " + "; ".join(used), notes

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
        cal, how, unused = self._xml_calibration()
        notes = [*super().notes, *self._extra_notes, *unused]
        if cal is not None and sidecar_calibration(self._path) is not None:
            notes.append(f"the JSON sidecar's calibration overrides the one read from {how}")
        return notes

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
            "calibration_from": self._calibration_choice()[1],
        }

    def _calibration_choice(self) -> tuple[Calibration | None, str | None]:
        """The calibration to report and where from: a JSON sidecar wins over the file."""
        return calibration_choice(self._path, lambda: self._xml_calibration()[:2])

    @property
    def calibration(self) -> Calibration | None:
        """A JSON sidecar's calibration, else the voltage and mrad per pixel the XML records."""
        return self._calibration_choice()[0]

    # -- reading -------------------------------------------------------------------
    def read_frames(self, start: int, stop: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Read frames ``[start, stop)`` without their footer rows."""
        return self._raw.read_frames(start, stop, out=out)

    def close(self) -> None:
        """Drop the memory map."""
        self._raw.close()
