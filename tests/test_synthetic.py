from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import DtypeError, ParameterError
from quantem_flow.synthetic import (
    DARK_FIELD_SHARE,
    synthetic_dataset,
    synthetic_truth,
    write_synthetic,
)

SMALL: dict[str, Any] = {"scan_shape": (12, 16), "detector_shape": (32, 36), "probe_radius_px": 5.0}


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    x = np.asarray(a, dtype=float).ravel()
    y = np.asarray(b, dtype=float).ravel()
    x = x - x.mean()
    y = y - y.mean()
    return float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum()))


@pytest.fixture(scope="module")
def small() -> tuple[np.ndarray, qf.synthetic.SyntheticTruth]:
    return synthetic_dataset(**SMALL, dose_per_frame=5000.0, seed=3)


def test_shapes_dtype_and_truth(small: tuple[np.ndarray, qf.synthetic.SyntheticTruth]) -> None:
    data, truth = small
    assert data.shape == (12, 16, 32, 36)
    assert data.dtype == np.uint16
    assert truth.phase.shape == (12, 16)
    assert truth.shift.shape == (2, 12, 16)
    assert truth.dark_field_share.shape == (12, 16)
    assert truth.scan_shape == (12, 16) and truth.detector_shape == (32, 36)
    assert truth.probe_radius == 5.0
    # off-centre on purpose
    assert truth.probe_center != ((32 - 1) / 2, (36 - 1) / 2)
    assert abs(truth.probe_center[0] - 15.5) > 0.5 or abs(truth.probe_center[1] - 17.5) > 0.5
    # the largest shift is deflection_px
    assert np.hypot(truth.shift[0], truth.shift[1]).max() == pytest.approx(1.5)
    assert truth.phase.min() >= 0 and truth.phase.max() > 0.1
    low, span = DARK_FIELD_SHARE
    assert truth.dark_field_share.min() == pytest.approx(low)
    assert truth.dark_field_share.max() == pytest.approx(low + span)
    params = truth.parameters()
    json.dumps(params)
    assert params["calibration"].startswith("none")


def test_counts_per_frame_match_the_dose(
    small: tuple[np.ndarray, qf.synthetic.SyntheticTruth],
) -> None:
    data, _ = small
    totals = data.sum(axis=(2, 3), dtype=np.int64)
    assert totals.mean() == pytest.approx(5000, rel=0.01)
    # Poisson: the spread of the totals is about sqrt(dose)
    assert 0.5 * np.sqrt(5000) < totals.std() < 2 * np.sqrt(5000)


def test_disk_follows_the_shift_and_halo_follows_the_phase(
    small: tuple[np.ndarray, qf.synthetic.SyntheticTruth],
) -> None:
    data, truth = small
    kr, kc = truth.detector_shape
    rr, cc = np.indices((kr, kc), dtype=float)
    cr, cc0 = truth.probe_center
    dist = np.hypot(rr - cr, cc - cc0)
    disk = dist < truth.probe_radius + 2.5
    frames = data.astype(float) * disk
    tot = frames.sum(axis=(2, 3))
    com_r = (frames * rr).sum(axis=(2, 3)) / tot - cr
    com_c = (frames * cc).sum(axis=(2, 3)) / tot - cc0
    assert pearson(com_r, truth.shift[0]) > 0.9
    assert pearson(com_c, truth.shift[1]) > 0.9
    # no systematic offset: the disk centre is the truth's probe centre
    assert abs(com_r.mean() - truth.shift[0].mean()) < 0.1
    assert abs(com_c.mean() - truth.shift[1].mean()) < 0.1
    dark = (data.astype(float) * (dist > 1.5 * truth.probe_radius)).sum(axis=(2, 3))
    assert pearson(dark, truth.phase) > 0.8


def test_deterministic_per_seed() -> None:
    a, ta = synthetic_dataset(scan_shape=(4, 5), detector_shape=(24, 24), probe_radius_px=4, seed=7)
    b, tb = synthetic_dataset(scan_shape=(4, 5), detector_shape=(24, 24), probe_radius_px=4, seed=7)
    c, _ = synthetic_dataset(scan_shape=(4, 5), detector_shape=(24, 24), probe_radius_px=4, seed=8)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ta.phase, tb.phase)
    assert not np.array_equal(a, c)
    truth = synthetic_truth(scan_shape=(4, 5), detector_shape=(24, 24), probe_radius_px=4, seed=7)
    np.testing.assert_array_equal(truth.shift, ta.shift)


def test_vacancies_break_the_periodicity() -> None:
    truth = synthetic_truth(scan_shape=(48, 64))
    assert len(truth.vacancies) == 2
    for r, c in truth.vacancies:
        # a vacancy site has much less phase than the heavy atoms around it
        ri, ci = round(r), round(c)
        assert truth.phase[ri, ci] < 0.5 * truth.phase.max()


def test_float_dtype_and_overflow() -> None:
    data, _ = synthetic_dataset(
        scan_shape=(2, 3), detector_shape=(24, 24), probe_radius_px=4, dtype="float32"
    )
    assert data.dtype == np.float32
    with pytest.raises(DtypeError, match="nothing is clipped"):
        synthetic_dataset(
            scan_shape=(2, 2),
            detector_shape=(24, 24),
            probe_radius_px=4,
            dtype="uint8",
            dose_per_frame=1e6,
        )
    with pytest.raises(DtypeError):
        synthetic_dataset(
            scan_shape=(2, 2), detector_shape=(24, 24), probe_radius_px=4, dtype="complex64"
        )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scan_shape": (0, 4)},
        {"scan_shape": (4,)},
        {"detector_shape": (16, 16), "probe_radius_px": 8},
        {"probe_radius_px": 0.5},
        {"dose_per_frame": 0},
        {"deflection_px": -1},
    ],
)
def test_bad_parameters(kwargs: dict[str, object]) -> None:
    with pytest.raises(ParameterError):
        synthetic_truth(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "fmt", "options"),
    [
        ("d.npy", None, {}),
        ("d.h5", None, {"dataset_path": "/data"}),
        ("d.zarr", None, {}),
        ("d.bin", "hdf5", {"dataset_path": "/data"}),
    ],
)
def test_write_synthetic_chunk_by_chunk(
    tmp_path: Path, name: str, fmt: str | None, options: dict[str, Any]
) -> None:
    kwargs: dict[str, Any] = {
        "scan_shape": (5, 6),
        "detector_shape": (24, 26),
        "probe_radius_px": 4.0,
        "seed": 2,
    }
    expected, _ = synthetic_dataset(**kwargs)
    # chunk_mib small enough for one scan row per step
    path = write_synthetic(tmp_path / name, format=fmt, chunk_mib=0.001, **kwargs)
    assert path == (tmp_path / name).absolute()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left
    ds = qf.open(path, format=fmt, **options)
    assert ds.shape == expected.shape
    np.testing.assert_array_equal(ds.load_block((0, 5)), expected)
    if name.endswith((".h5", ".bin")):
        meta = ds.source.metadata
        assert [f["id"] for f in meta["filters"]] == [32008]  # bitshuffle (+ LZ4)
        params = json.loads(meta["attributes"]["quantem_flow_synthetic"])
        assert params["scan_shape"] == [5, 6]


def test_write_synthetic_refuses_to_overwrite(tmp_path: Path) -> None:
    kwargs: dict[str, Any] = {
        "scan_shape": (2, 2),
        "detector_shape": (24, 24),
        "probe_radius_px": 4.0,
    }
    path = write_synthetic(tmp_path / "d.npy", **kwargs)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_synthetic(path, **kwargs)
    write_synthetic(path, overwrite=True, seed=1, **kwargs)
    assert np.load(path).shape == (2, 2, 24, 24)
    with pytest.raises(ParameterError, match="format"):
        write_synthetic(tmp_path / "d.tif", **kwargs)
    with pytest.raises(ParameterError, match="chunk_mib"):
        write_synthetic(tmp_path / "e.npy", chunk_mib=0, **kwargs)


def test_engine_recovers_the_truth(small: tuple[np.ndarray, qf.synthetic.SyntheticTruth]) -> None:
    data, truth = small
    probe = qf.find_probe(data.mean(axis=(0, 1)))
    assert probe.center == pytest.approx(truth.probe_center, abs=0.3)
    assert probe.radius == pytest.approx(truth.probe_radius, abs=0.5)
    ds = qf.open(data, chunk_rows=4)
    com, adf, phase = qf.compute(
        qf.center_of_mass(ds), qf.virtual_adf(ds), qf.idpc(ds), client="synchronous"
    )
    assert pearson(com.data[0], truth.shift[0]) > 0.9
    assert pearson(com.data[1], truth.shift[1]) > 0.9
    assert pearson(adf.data, truth.phase) > 0.8
    assert pearson(phase.data, truth.phase) > 0.8


def test_frames_do_not_depend_on_internal_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    import quantem_flow.synthetic as synth

    kwargs: dict[str, Any] = {
        "scan_shape": (2, 9),
        "detector_shape": (24, 24),
        "probe_radius_px": 4.0,
    }
    whole, _ = synthetic_dataset(**kwargs)
    monkeypatch.setattr(synth, "_TEMP_ELEMENTS", 24 * 24 * 2)  # two frames per step
    blocked, _ = synthetic_dataset(**kwargs)
    np.testing.assert_array_equal(whole, blocked)
