"""Synthetic 4D-STEM data with a known answer, for demos, tests and benchmarks.

The specimen is a weak phase object: Gaussian "atoms" (positive phase
peaks) on a rectangular lattice with a lighter atom at the centre of each
cell and a few vacancies, so that images are not trivially periodic.  At
each scan position the detector records

* the bright-field probe disk (uniform, with an anti-aliased edge one pixel
  wide) of radius ``probe_radius_px``, centred at a fixed **off-centre**
  detector position (so that centre finding is exercised) and shifted by
  ``deflection_px * grad(phase) / max|grad(phase)|`` (row component along
  detector rows, column component along detector columns: no rotation, no
  transpose);
* a weak dark-field halo around the undeflected disk whose share of the
  counts grows where the phase is high (so ADF images show the atoms);

with Poisson noise of ``dose_per_frame`` expected counts per frame.  The
noise of scan row ``r`` comes from ``numpy.random.default_rng([seed, r])``,
so the data are the same whichever rows are generated together.

Scan steps and detector pixels are uncalibrated (``px``): the data carry no
physical calibration, and none is claimed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DtypeError, ParameterError

__all__ = [
    "MODELS",
    "SyntheticTruth",
    "synthetic_dataset",
    "synthetic_truth",
    "truth_of",
    "write_synthetic",
]

#: Share of each frame's counts in the dark-field halo: ``low`` where the
#: phase is lowest, ``low + span`` where it is highest.
DARK_FIELD_SHARE = (0.03, 0.12)

_LATTICE_STEP_PX = (6.0, 7.0)  # scan pixels between heavy atoms (row, col)
_ATOM_SIGMA_PX = 1.1
_HEAVY_PHASE_RAD = 0.25
_LIGHT_PHASE_RAD = 0.09
_TEMP_ELEMENTS = 4 * 2**20
_FORMATS = {".npy": "npy", ".h5": "hdf5", ".hdf5": "hdf5", ".zarr": "zarr"}


@dataclasses.dataclass(frozen=True, eq=False)
class SyntheticTruth:
    """The known answer of a synthetic dataset.

    Attributes
    ----------
    phase
        ``(R_r, R_c)`` specimen phase in rad (nominal: a weak phase object).
    probe_center
        ``(row, col)`` detector pixel of the centre of the undeflected disk.
    probe_radius
        Radius of the bright-field disk in detector pixels.
    shift
        ``(2, R_r, R_c)`` true disk shift in detector pixels; component 0
        along detector rows, 1 along detector columns.
    dark_field_share
        ``(R_r, R_c)`` expected share of each frame's counts in the halo.
    scan_shape, detector_shape
        Shape of the data ``(R_r, R_c)`` and ``(k_r, k_c)``.
    dose_per_frame
        Expected counts per frame.
    deflection_px
        Largest disk shift, in detector pixels.
    seed
        Seed of the specimen and of the noise.
    dtype
        Dtype of the frames.
    vacancies
        ``(row, col)`` scan positions of the missing heavy atoms.
    """

    phase: np.ndarray
    probe_center: tuple[float, float]
    probe_radius: float
    shift: np.ndarray
    dark_field_share: np.ndarray
    scan_shape: tuple[int, int]
    detector_shape: tuple[int, int]
    dose_per_frame: float
    deflection_px: float
    seed: int
    dtype: str
    vacancies: tuple[tuple[float, float], ...]

    def parameters(self) -> dict[str, Any]:
        """Return the generating parameters, JSON-ready (stored with written files)."""
        return {
            "generator": "quantem_flow.synthetic",
            "scan_shape": list(self.scan_shape),
            "detector_shape": list(self.detector_shape),
            "probe_center_px": list(self.probe_center),
            "probe_radius_px": self.probe_radius,
            "dose_per_frame": self.dose_per_frame,
            "deflection_px": self.deflection_px,
            "seed": self.seed,
            "dtype": self.dtype,
            "vacancies": [list(v) for v in self.vacancies],
            "dark_field_share": list(DARK_FIELD_SHARE),
            "shift_convention": "deflection_px * grad(phase) / max|grad(phase)|, "
            "component 0 along detector rows, 1 along detector columns",
            "calibration": "none (scan and detector in px)",
        }


def _pair(value: Sequence[int], name: str, minimum: int) -> tuple[int, int]:
    try:
        a, b = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ParameterError(f"{name} must be two integers (rows, cols), got {value!r}") from None
    if a < minimum or b < minimum:
        raise ParameterError(f"{name} must be at least ({minimum}, {minimum}), got {value!r}")
    return (a, b)


def _check(
    scan_shape: Sequence[int],
    detector_shape: Sequence[int],
    probe_radius_px: float,
    dose_per_frame: float,
    deflection_px: float,
    dtype: str | np.dtype[Any],
) -> tuple[tuple[int, int], tuple[int, int], np.dtype[Any]]:
    scan = _pair(scan_shape, "scan_shape", 2)
    det = _pair(detector_shape, "detector_shape", 8)
    if not (math.isfinite(probe_radius_px) and probe_radius_px >= 1.0):
        raise ParameterError(f"probe_radius_px must be >= 1, got {probe_radius_px!r}")
    if not (math.isfinite(dose_per_frame) and dose_per_frame > 0):
        raise ParameterError(f"dose_per_frame must be > 0, got {dose_per_frame!r}")
    if not (math.isfinite(deflection_px) and deflection_px >= 0):
        raise ParameterError(f"deflection_px must be >= 0, got {deflection_px!r}")
    reach = probe_radius_px + deflection_px + 2.0
    if 2 * reach > min(det) * 0.9:
        raise ParameterError(
            f"the disk (radius {probe_radius_px} px, shifted up to {deflection_px} px) does not "
            f"fit on a {det[0]} x {det[1]} detector with room for a dark-field halo; use a "
            f"detector of at least {math.ceil(2 * reach / 0.9)} px or a smaller probe_radius_px"
        )
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise DtypeError(f"dtype must be a NumPy dtype name, got {dtype!r}") from None
    if dt.kind not in "uif":
        raise DtypeError(f"dtype must be an integer or float dtype, got {dt}")
    return scan, det, dt


def _specimen(
    scan: tuple[int, int], seed: int
) -> tuple[np.ndarray, np.ndarray, tuple[tuple[float, float], ...]]:
    """Return the phase, its analytic gradient ``(2, R, C)`` and the vacancies."""
    rng = np.random.default_rng([int(seed), 0x5EED])
    R, C = scan
    a_r, a_c = _LATTICE_STEP_PX
    sigma = _ATOM_SIGMA_PX
    sites_r = np.arange(-a_r / 2, R + a_r, a_r) + 0.3 * a_r
    sites_c = np.arange(-a_c / 2, C + a_c, a_c) + 0.4 * a_c
    heavy = [(float(r), float(c)) for r in sites_r for c in sites_c]
    inside = [i for i, (r, c) in enumerate(heavy) if 1 <= r < R - 1 and 1 <= c < C - 1]
    n_vac = min(2, max(len(inside) - 1, 0))
    vac_idx = set(rng.choice(inside, size=n_vac, replace=False).tolist()) if n_vac else set()
    atoms: list[tuple[float, float, float]] = []
    for i, (r, c) in enumerate(heavy):
        if i not in vac_idx:
            atoms.append((r, c, _HEAVY_PHASE_RAD * (1.0 + 0.08 * rng.standard_normal())))
        atoms.append(
            (r + a_r / 2, c + a_c / 2, _LIGHT_PHASE_RAD * (1.0 + 0.08 * rng.standard_normal()))
        )
    jitter = 0.15 * rng.standard_normal((len(atoms), 2))
    phase = np.zeros(scan)
    grad = np.zeros((2, *scan))
    half = math.ceil(4.5 * sigma)
    for (r0, c0, amp), (jr, jc) in zip(atoms, jitter, strict=True):
        r0, c0 = r0 + jr, c0 + jc
        lo_r, hi_r = max(0, math.floor(r0) - half), min(R, math.floor(r0) + half + 1)
        lo_c, hi_c = max(0, math.floor(c0) - half), min(C, math.floor(c0) + half + 1)
        if lo_r >= hi_r or lo_c >= hi_c:
            continue
        dr = np.arange(lo_r, hi_r, dtype=np.float64)[:, None] - r0
        dc = np.arange(lo_c, hi_c, dtype=np.float64)[None, :] - c0
        g = amp * np.exp(-(dr**2 + dc**2) / (2 * sigma**2))
        phase[lo_r:hi_r, lo_c:hi_c] += g
        grad[0, lo_r:hi_r, lo_c:hi_c] -= g * dr / sigma**2
        grad[1, lo_r:hi_r, lo_c:hi_c] -= g * dc / sigma**2
    vacancies = tuple(heavy[i] for i in sorted(vac_idx))
    return phase, grad, vacancies


def synthetic_truth(
    *,
    scan_shape: Sequence[int] = (48, 64),
    detector_shape: Sequence[int] = (64, 72),
    probe_radius_px: float = 8.0,
    dose_per_frame: float = 2000.0,
    deflection_px: float = 1.5,
    seed: int = 0,
    dtype: str = "uint16",
) -> SyntheticTruth:
    """Return the known answer of :func:`synthetic_dataset` without making frames.

    Takes the same parameters as :func:`synthetic_dataset` and is cheap.

    Returns
    -------
    SyntheticTruth
        Phase, probe centre and radius, true shift field.
    """
    scan, det, dt = _check(
        scan_shape,
        detector_shape,
        float(probe_radius_px),
        float(dose_per_frame),
        float(deflection_px),
        dtype,
    )
    phase, grad, vacancies = _specimen(scan, seed)
    peak = float(np.hypot(grad[0], grad[1]).max())
    shift = grad * (float(deflection_px) / peak) if peak > 0 else np.zeros_like(grad)
    span = float(phase.max() - phase.min())
    norm = (phase - phase.min()) / span if span > 0 else np.zeros_like(phase)
    low, extra = DARK_FIELD_SHARE
    # off-centre on purpose: centre finding must not assume the detector centre
    center = (round(0.46 * (det[0] - 1), 2), round(0.55 * (det[1] - 1), 2))
    return SyntheticTruth(
        phase=phase,
        probe_center=center,
        probe_radius=float(probe_radius_px),
        shift=shift,
        dark_field_share=low + extra * norm,
        scan_shape=scan,
        detector_shape=det,
        dose_per_frame=float(dose_per_frame),
        deflection_px=float(deflection_px),
        seed=int(seed),
        dtype=str(dt),
        vacancies=vacancies,
    )


class _Frames:
    """Generates the scan rows of a synthetic dataset, one row at a time."""

    def __init__(self, truth: SyntheticTruth):
        self.truth = truth
        kr, kc = truth.detector_shape
        self.k_r = np.arange(kr, dtype=np.float64)[None, :, None]
        self.k_c = np.arange(kc, dtype=np.float64)[None, None, :]
        cr, cc = truth.probe_center
        d0 = np.hypot(self.k_r[0] - cr, self.k_c[0] - cc)
        radius = truth.probe_radius
        halo = np.where(d0 > radius, np.exp(-(d0 - radius) / (1.5 * radius)), 0.0)
        self.halo = halo / halo.sum()
        self.dtype = np.dtype(truth.dtype)
        if self.dtype.kind in "ui":
            self.max_value = int(np.iinfo(self.dtype).max)
        else:
            self.max_value = int(np.finfo(self.dtype).max)

    def row(self, r: int) -> np.ndarray:
        """Return scan row ``r`` as ``(R_c, k_r, k_c)`` counts."""
        t = self.truth
        C = t.scan_shape[1]
        kr, kc = t.detector_shape
        out = np.empty((C, kr, kc), dtype=self.dtype)
        rng = np.random.default_rng([t.seed, int(r)])
        # frames per step: bounds the float64 temporaries to ~32 MiB each
        step = max(1, _TEMP_ELEMENTS // (kr * kc))
        for c0 in range(0, C, step):
            c1 = min(C, c0 + step)
            cr = t.probe_center[0] + t.shift[0, r, c0:c1][:, None, None]
            cc = t.probe_center[1] + t.shift[1, r, c0:c1][:, None, None]
            d = np.hypot(self.k_r - cr, self.k_c - cc)
            disk = np.clip(t.probe_radius + 0.5 - d, 0.0, 1.0)
            disk /= disk.sum(axis=(1, 2), keepdims=True)
            share = t.dark_field_share[r, c0:c1][:, None, None]
            lam = t.dose_per_frame * ((1.0 - share) * disk + share * self.halo[None])
            counts = rng.poisson(lam)
            top = int(counts.max())
            if top > self.max_value:
                raise DtypeError(
                    f"scan row {r} has a pixel of {top} counts, more than dtype {self.dtype} "
                    f"holds ({self.max_value}); nothing is clipped -- use a wider dtype or a "
                    "lower dose_per_frame"
                )
            out[c0:c1] = counts
        return out

    def rows(self, r0: int, r1: int) -> np.ndarray:
        return np.stack([self.row(r) for r in range(r0, r1)])


#: The synthetic models: ``"disk"`` (a shifted bright-field disk: fast, exact CoM
#: answer) and ``"wave"`` (wave optics, :mod:`quantem_flow.synthetic_wave`: physically
#: consistent for SSB, calibrated).
MODELS = ("disk", "wave")


def truth_of(*, model: str = "disk", **params: Any) -> Any:
    """The known answer of a synthetic dataset of either model, without making frames.

    Parameters
    ----------
    model
        ``"disk"`` (:func:`synthetic_truth`) or ``"wave"``
        (:func:`quantem_flow.synthetic_wave.wave_truth`).
    **params
        That model's parameters.

    Returns
    -------
    SyntheticTruth or WaveTruth
        The answer; ``.phase`` is the specimen phase at the scan positions.
    """
    if model == "disk":
        return synthetic_truth(**params)
    if model == "wave":
        from .synthetic_wave import wave_truth

        return wave_truth(**params)
    raise ParameterError(f"model must be one of {list(MODELS)}, got {model!r}")


def _frames_of(truth: Any) -> Any:
    if getattr(truth, "model", "disk") == "wave":
        from .synthetic_wave import WaveFrames

        return WaveFrames(truth)
    return _Frames(truth)


def synthetic_dataset(
    *,
    scan_shape: Sequence[int] = (48, 64),
    detector_shape: Sequence[int] = (64, 72),
    probe_radius_px: float = 8.0,
    dose_per_frame: float | None = None,
    deflection_px: float = 1.5,
    seed: int = 0,
    dtype: str = "uint16",
    model: str = "disk",
    **wave_options: Any,
) -> tuple[np.ndarray, Any]:
    """Make a synthetic 4D-STEM dataset of a weak phase object, in memory.

    Parameters
    ----------
    model
        ``"disk"`` (the default: the bright-field disk shifted by the phase
        gradient, uncalibrated) or ``"wave"`` (wave optics, calibrated,
        consistent for SSB; :mod:`quantem_flow.synthetic_wave`, whose
        options ``voltage_kV``, ``semiangle_mrad``, ``detector_mrad``,
        ``defocus_A`` and ``phase_max_rad`` go in ``**wave_options``;
        ``probe_radius_px`` and ``deflection_px`` are the disk model's).
    scan_shape
        ``(R_r, R_c)`` scan positions.
    detector_shape
        ``(k_r, k_c)`` detector pixels.
    probe_radius_px
        Radius of the bright-field disk in detector pixels.
    dose_per_frame
        Expected total counts per frame (Poisson noise); ``None``: 2000 for
        the disk model, 50000 for the wave model.
    deflection_px
        Largest shift of the disk, in detector pixels, where the phase
        gradient is steepest.
    seed
        Seeds the specimen (jitter, vacancies) and the noise; the same seed
        gives the same data.
    dtype
        Integer or float dtype of the counts; a count that does not fit
        raises :class:`~quantem_flow.errors.DtypeError` (nothing is clipped).
    **wave_options
        The wave model's own parameters (above).

    Returns
    -------
    data : numpy.ndarray
        ``(R_r, R_c, k_r, k_c)`` counts.
    truth : SyntheticTruth or WaveTruth
        The known answer: phase (and, for the disk model, the probe centre
        and radius and the shift field; for the wave model, the calibration).

    Examples
    --------
    >>> from quantem_flow.synthetic import synthetic_dataset
    >>> data, truth = synthetic_dataset(scan_shape=(8, 8), detector_shape=(32, 32),
    ...                                 probe_radius_px=5)
    >>> data.shape
    (8, 8, 32, 32)
    """
    truth = _truth_from(
        model=model,
        scan_shape=scan_shape,
        detector_shape=detector_shape,
        probe_radius_px=probe_radius_px,
        dose_per_frame=dose_per_frame,
        deflection_px=deflection_px,
        seed=seed,
        dtype=dtype,
        **wave_options,
    )
    return _frames_of(truth).rows(0, truth.scan_shape[0]), truth


def _truth_from(
    *,
    model: str,
    probe_radius_px: float,
    deflection_px: float,
    dose_per_frame: float | None,
    **common: Any,
) -> Any:
    """The truth of ``model`` from :func:`synthetic_dataset`'s parameters."""
    if model == "disk":
        if common.keys() - {"scan_shape", "detector_shape", "seed", "dtype"}:
            extra = sorted(common.keys() - {"scan_shape", "detector_shape", "seed", "dtype"})
            raise ParameterError(f"options {extra} are the wave model's; pass model='wave'")
        return synthetic_truth(
            probe_radius_px=probe_radius_px,
            deflection_px=deflection_px,
            dose_per_frame=2000.0 if dose_per_frame is None else dose_per_frame,
            **common,
        )
    return truth_of(
        model=model, dose_per_frame=5e4 if dose_per_frame is None else dose_per_frame, **common
    )


def _temporary_sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def write_synthetic(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    chunk_mib: float = 64.0,
    overwrite: bool = False,
    **kwargs: Any,
) -> Path:
    """Write a synthetic dataset to a file, a few scan rows at a time.

    Never holds more than about ``chunk_mib`` of frames in memory, so large
    datasets (for benchmarks) can be written.  The file appears under its
    name only once it is complete.

    Parameters
    ----------
    path
        Target ``.npy`` file, HDF5 file or Zarr v3 directory.
    format
        ``"npy"``, ``"hdf5"`` or ``"zarr"``; ``None`` guesses it from the
        suffix (``.npy``, ``.h5``/``.hdf5``, ``.zarr``).
    chunk_mib
        MiB of frames generated and written per step.
    overwrite
        Replace an existing file.
    **kwargs
        ``model=`` (``"disk"`` or ``"wave"``) and that model's parameters
        (:func:`synthetic_truth`, :func:`quantem_flow.synthetic_wave.wave_truth`).

    Returns
    -------
    pathlib.Path
        The absolute path written.

    Notes
    -----
    * ``npy``: one 4-D ``(R_r, R_c, k_r, k_c)`` array.
    * ``hdf5``: the 4-D dataset ``/data``, compressed with bitshuffle + LZ4
      (``hdf5plugin``), one scan row per HDF5 chunk; its attribute
      ``quantem_flow_synthetic`` holds the generating parameters as JSON,
      and, for the calibrated wave model, ``quantem_flow`` holds the
      calibration, which :func:`quantem_flow.open` reads.
    * ``zarr``: a Zarr v3 array at the root of the store, one scan row per
      chunk, with the same attribute.

    Open it with ``quantem_flow.open(path)`` (HDF5: ``dataset_path="/data"``).
    """
    target = Path(path).expanduser().absolute()
    fmt = format if format is not None else _FORMATS.get(target.suffix.lower())
    if fmt == "h5":
        fmt = "hdf5"
    if fmt not in ("npy", "hdf5", "zarr"):
        raise ParameterError(
            f"format must be 'npy', 'hdf5' or 'zarr' (or None with a .npy, .h5/.hdf5 or .zarr "
            f"name), got format={format!r} for {target.name!r}"
        )
    if not (math.isfinite(chunk_mib) and chunk_mib > 0):
        raise ParameterError(f"chunk_mib must be > 0, got {chunk_mib!r}")
    if (target.exists() or target.is_symlink()) and not overwrite:
        raise FileExistsError(
            f"{str(target)!r} already exists; pass overwrite=True to replace it or choose "
            "another name"
        )
    truth = truth_of(**kwargs)
    frames = _frames_of(truth)
    R, C = truth.scan_shape
    kr, kc = truth.detector_shape
    shape = (R, C, kr, kc)
    row_bytes = C * kr * kc * frames.dtype.itemsize
    step = max(1, min(R, int(chunk_mib * 2**20 // row_bytes)))
    attrs = json.dumps(truth.parameters())
    # a calibrated model states its calibration where quantem-flow's readers look for it
    stated = (
        json.dumps({"calibration": truth.calibration().to_dict()})
        if hasattr(truth, "calibration")
        else None
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_sibling(target)
    try:
        if fmt == "npy":
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=frames.dtype, shape=shape)
            for r0 in range(0, R, step):
                r1 = min(R, r0 + step)
                out[r0:r1] = frames.rows(r0, r1)
            out.flush()
            del out
        elif fmt == "hdf5":
            import h5py
            import hdf5plugin

            with h5py.File(tmp, "w") as f:
                dset = f.create_dataset(
                    "data",
                    shape=shape,
                    dtype=frames.dtype,
                    chunks=(1, C, kr, kc),
                    **hdf5plugin.Bitshuffle(cname="lz4"),
                )
                dset.attrs["quantem_flow_synthetic"] = attrs
                if stated is not None:
                    dset.attrs["quantem_flow"] = stated
                for r0 in range(0, R, step):
                    r1 = min(R, r0 + step)
                    dset[r0:r1] = frames.rows(r0, r1)
        else:
            import zarr

            arr = zarr.create_array(
                str(tmp), shape=shape, chunks=(1, C, kr, kc), dtype=frames.dtype, zarr_format=3
            )
            arr.attrs["quantem_flow_synthetic"] = attrs
            if stated is not None:
                arr.attrs["quantem_flow"] = json.loads(stated)
            for r0 in range(0, R, step):
                r1 = min(R, r0 + step)
                arr[r0:r1] = frames.rows(r0, r1)
        if target.exists() or target.is_symlink():
            _remove(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            _remove(tmp)
    return target
