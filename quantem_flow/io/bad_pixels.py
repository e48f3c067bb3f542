"""Direct Electron bad-pixel maps (``<file>.seq.Config.Metadata.xml``) and their patching.

The map is XML: ``Configuration/BadPixels/BadPixelMap`` elements, each for one
readout size (attributes ``Rows`` and ``Columns``; ``Binning`` on maps of a
binned readout), holding ``Defect`` elements that name a whole row
(``Row="r"``), rows ``a`` to ``b`` inclusive (``Rows="a-b"``), a whole column
(``Column``/``Columns`` likewise) or one pixel (``Row`` and ``Column``).
Rows index the frame's first axis and columns its second, as stored.

Patching replaces each bad pixel by the mean of its good neighbours in the
3 x 3 window around it (clipped at the frame's edge), every bad pixel from
the values before any is patched; a bad pixel with no good neighbour is
refused (the map leaves nothing to estimate it from).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import FormatError, ShapeError
from .references import file_sha256

__all__ = ["BadPixelPatch", "load_bad_pixel_map"]


def _span(text: str | None, limit: int, what: str, path: Path) -> range | None:
    """``"r"`` or ``"a-b"`` (inclusive) as a range within ``[0, limit)``; ``None`` if absent."""
    if text is None:
        return None
    parts = text.strip().split("-")
    try:
        a, b = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (None, None)
    except ValueError:
        a = b = None
    if a is None or b is None or not 0 <= a <= b < limit:
        raise FormatError(
            f"{str(path)!r}: a Defect's {what}={text!r}; expected an index or 'a-b' within "
            f"0..{limit - 1}"
        )
    return range(a, b + 1)


def _span_of(
    attrib: dict[str, str], names: tuple[str, str], limit: int, path: Path
) -> range | None:
    """The span named by whichever of ``names`` a ``Defect`` carries (both: refused)."""
    given = [n for n in names if n in attrib]
    if len(given) > 1:
        raise FormatError(
            f"{str(path)!r}: a Defect gives both {names[0]} and {names[1]} ({attrib}); it must "
            "give one"
        )
    return _span(attrib[given[0]], limit, given[0], path) if given else None


def _read_mask(path: Path, shape: tuple[int, int]) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The bad pixels of the map sized ``shape`` (and the sizes of every map found)."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise FormatError(f"{str(path)!r} is not an XML bad-pixel map: {exc}") from exc
    maps = root.findall("./BadPixels/BadPixelMap") or root.findall(".//BadPixelMap")
    sizes = []
    chosen = None
    for m in maps:
        try:
            size = (int(m.get("Rows", "")), int(m.get("Columns", "")))
        except ValueError as exc:
            raise FormatError(
                f"{str(path)!r}: a BadPixelMap has Rows={m.get('Rows')!r}, "
                f"Columns={m.get('Columns')!r}; expected integers"
            ) from exc
        sizes.append(size)
        if size == shape and chosen is None:
            chosen = m
    if chosen is None:
        raise ShapeError(
            f"{str(path)!r} holds bad-pixel maps of {sizes} (rows, cols), none of the frames' "
            f"{shape}: a cropped or binned readout needs the map's window, which this reader "
            "does not place. Leave 'bad_pixels' out of corrections="
        )
    rows, cols = shape
    mask = np.zeros(shape, dtype=bool)
    for d in chosen.iter("Defect"):
        r = _span_of(d.attrib, ("Row", "Rows"), rows, path)
        c = _span_of(d.attrib, ("Column", "Columns"), cols, path)
        if r is None and c is None:
            raise FormatError(f"{str(path)!r}: a Defect names neither a row nor a column")
        mask[
            slice(r.start, r.stop) if r is not None else slice(None),
            slice(c.start, c.stop) if c is not None else slice(None),
        ] = True
    return mask, sizes


@dataclass(frozen=True)
class BadPixelPatch:
    """Where the bad pixels are and the good neighbours each is patched from."""

    path: str
    sha256: str
    #: Flat indices of the bad pixels.
    bad: np.ndarray
    #: ``(n_bad, 9)`` flat indices of each one's 3 x 3 window (padded with its own index).
    neighbours: np.ndarray
    #: ``(n_bad, 9)`` weights: ``1 / good neighbours`` where a neighbour is good, else 0.
    weights: np.ndarray

    @property
    def count(self) -> int:
        """Bad pixels patched."""
        return int(self.bad.size)

    def apply(self, frames: np.ndarray) -> None:
        """Patch ``(n, rows, cols)`` real-valued ``frames`` in place."""
        if not self.bad.size or not frames.shape[0]:
            return
        flat = frames.reshape(frames.shape[0], -1)
        values = (flat[:, self.neighbours] * self.weights).sum(axis=-1)
        flat[:, self.bad] = values


def load_bad_pixel_map(path: Path, shape: tuple[int, int]) -> BadPixelPatch:
    """Read the bad-pixel map of ``path`` for frames of ``shape`` and plan the patching.

    Raises
    ------
    FormatError
        Not XML, or a ``Defect`` out of range or naming nothing.
    ShapeError
        No map of the frames' size; or a bad pixel without a good neighbour.
    """
    mask, _ = _read_mask(path, shape)
    rows, cols = shape
    bad_rc = np.argwhere(mask)
    offsets = np.array([(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1)])
    near = bad_rc[:, None, :] + offsets[None, :, :]
    inside = (
        (near[..., 0] >= 0) & (near[..., 0] < rows) & (near[..., 1] >= 0) & (near[..., 1] < cols)
    )
    r = np.clip(near[..., 0], 0, rows - 1)
    c = np.clip(near[..., 1], 0, cols - 1)
    good = inside & ~mask[r, c]
    counts = good.sum(axis=1)
    if bad_rc.size and not counts.all():
        lone = bad_rc[int(np.argmin(counts))]
        raise ShapeError(
            f"{str(path)!r}: bad pixel (row {int(lone[0])}, col {int(lone[1])}) has no good "
            "neighbour in its 3 x 3 window to be patched from; leave 'bad_pixels' out of "
            "corrections= and mask it instead"
        )
    weights = np.where(good, 1.0 / np.maximum(counts, 1)[:, None], 0.0)
    return BadPixelPatch(
        path=str(path),
        sha256=file_sha256(path),
        bad=(bad_rc[:, 0] * cols + bad_rc[:, 1]).astype(np.int64),
        neighbours=(r * cols + c).astype(np.int64),
        weights=weights,
    )
