"""qf.live: a stream received in scan order, queried while it runs, equal to the offline pass."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("zmq")
pytest.importorskip("cbor2")
pytest.importorskip("lz4")

import quantem_flow as qf
from quantem_flow.errors import StreamProtocolError
from quantem_flow.streams.dectris_sim import DectrisSimulator
from quantem_flow.streams.live_chunks import open_live_folder
from tests.conftest import probe_data

SCAN = (12, 10)
CENTER = (8.6, 14.2)


def _queries(ds: qf.Dataset4D) -> list[object]:
    return [
        qf.virtual_bf(ds, radius=4.5, center=CENTER),
        qf.virtual_adf(ds, inner=6, outer=11, center=CENTER),
        qf.center_of_mass(ds, center=CENTER),
    ]


def test_partial_results_while_the_scan_runs_and_bit_identical_results_at_the_end(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    data = probe_data(rng, scan=SCAN)
    frames = data.reshape(-1, *data.shape[2:])
    with DectrisSimulator(frames, rate_hz=100.0) as sim:
        acq = qf.live(sim.endpoint, scan_shape=SCAN, directory=tmp_path, chunk_rows=3)
        sim.start()
        partial = acq.dataset_so_far(wait_s=20)
        rows = partial.scan_shape[0]
        assert 0 < rows < SCAN[0]  # the scan is still running (100 frames/s: 1.2 s in all)
        (bf_partial,) = qf.compute(
            qf.virtual_bf(partial, radius=4.5, center=CENTER), client="synchronous"
        )
        assert bf_partial.shape == (rows, SCAN[1])
        assert any("live: partial" in n for n in bf_partial.provenance.notes)
        report = acq.wait(timeout_s=30)
    assert report.complete
    full = acq.dataset()
    live_results = qf.compute(*_queries(full), client="synchronous")
    offline = qf.open(data, chunk_rows=3)
    offline_results = qf.compute(*_queries(offline), client="synchronous")
    for a, b in zip(live_results, offline_results, strict=True):
        np.testing.assert_array_equal(a.data, b.data)  # bit for bit
    np.testing.assert_array_equal(bf_partial.data, offline_results[0].data[:rows])
    assert acq.storage == "bslz4-chunks"  # the simulator sends bitshuffle+LZ4: kept so
    kept = open_live_folder(tmp_path)  # the folder opens again on its own
    np.testing.assert_array_equal(kept.load_block((0, SCAN[0])), data)


def test_an_incomplete_series_is_refused_or_marked(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    data = probe_data(rng, scan=SCAN)
    frames = data.reshape(-1, *data.shape[2:])
    with DectrisSimulator(frames, skip=[23, 57]) as sim:
        acq = qf.live(sim.endpoint, scan_shape=SCAN, directory=tmp_path)
        sim.start()
        report = acq.wait(timeout_s=30)
    assert report.missing == [23, 57] and not report.complete
    assert acq.rows_complete == 2  # rows 0-1 whole; row 2 lacks image 23
    with pytest.raises(StreamProtocolError, match=r"incomplete.*23, 57"):
        acq.dataset()
    marked = acq.dataset(allow_incomplete=True)
    (bf,) = qf.compute(qf.virtual_bf(marked, radius=4.5, center=CENTER), client="synchronous")
    assert any("INCOMPLETE" in n and "23, 57" in n for n in bf.provenance.notes)
    assert bf.data.reshape(-1)[23] == 0 and bf.data.reshape(-1)[57] == 0
    assert acq.dataset_so_far().scan_shape == (2, SCAN[1])  # only whole rows


def test_a_cut_stream_keeps_what_came(rng: np.random.Generator, tmp_path: Path) -> None:
    data = probe_data(rng, scan=SCAN)
    frames = data.reshape(-1, *data.shape[2:])
    with DectrisSimulator(frames, stop_after=45) as sim:
        acq = qf.live(sim.endpoint, scan_shape=SCAN, directory=tmp_path, timeout_s=1.0)
        sim.start()
        t0 = time.perf_counter()
        report = acq.wait(timeout_s=30)
        assert time.perf_counter() - t0 < 20
    assert report.reason == "timeout" and not report.ended
    so_far = acq.dataset_so_far()
    assert so_far.scan_shape == (4, SCAN[1])  # 45 frames: 4 whole rows of 10
    np.testing.assert_array_equal(so_far.load_block((0, 4)), data[:4])


def test_merlin_tcp_through_qf_live_equals_the_offline_pass(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    from quantem_flow.streams.merlin_tcp import MerlinSimulator

    data = probe_data(rng, scan=SCAN)
    frames = data.reshape(-1, *data.shape[2:])
    with MerlinSimulator(frames) as sim:
        acq = qf.live(
            f"tcp://{sim.host}:{sim.port}", scan_shape=SCAN, protocol="merlin", directory=tmp_path
        )
        sim.start()
        report = acq.wait(timeout_s=30)
    assert report.complete, report.describe()
    live_results = qf.compute(*_queries(acq.dataset()), client="synchronous")
    offline_results = qf.compute(*_queries(qf.open(data)), client="synchronous")
    for a, b in zip(live_results, offline_results, strict=True):
        np.testing.assert_array_equal(a.data, b.data)


def _pipeline_file(folder: Path, *, with_com: bool) -> Path:
    """A pipeline YAML for `quantem-flow live`: BF (and CoM), saved to live_results.h5."""
    import yaml

    outputs: dict[str, object] = {"bf": {"op": "virtual_bf", "radius": 4.5, "center": list(CENTER)}}
    if with_com:
        outputs["com"] = {"op": "center_of_mass", "center": list(CENTER)}
    pipeline = folder / "live.yaml"
    pipeline.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "input": {"path": "unused.npy", "chunk_rows": 3},
                "outputs": outputs,
                "save": {"results": "live_results.h5"},
            }
        )
    )
    return pipeline


def test_the_live_command_runs_a_pipeline_on_a_stream(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    import subprocess
    import sys

    data = probe_data(rng, scan=SCAN)
    frames = data.reshape(-1, *data.shape[2:])
    pipeline = _pipeline_file(tmp_path, with_com=True)
    with DectrisSimulator(frames, skip=[5]) as sim:
        proc = subprocess.Popen(
            [sys.executable, "-m", "quantem_flow", "live", "--dectris", sim.endpoint,
             "--scan", f"{SCAN[0]}x{SCAN[1]}", str(pipeline), "--scheduler", "synchronous",
             "--timeout", "2", "--allow-incomplete", "--keep", str(tmp_path / "kept")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        sim.start()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "INCOMPLETE: 119 of 120 images received; missing images 5" in out
    results = qf.load_results(tmp_path / "live_results.h5")
    (offline,) = qf.compute(
        qf.virtual_bf(qf.open(data), radius=4.5, center=CENTER), client="synchronous"
    )
    expected = offline.data.copy()
    expected.reshape(-1)[5] = 0  # the frame that never came reads as 0
    np.testing.assert_array_equal(results["bf"].data, expected)
    assert any("INCOMPLETE" in n and "image numbers 5" in n for n in results["bf"].provenance.notes)
    kept = open_live_folder(tmp_path / "kept").load_block((0, SCAN[0])).reshape(-1, *data.shape[2:])
    np.testing.assert_array_equal(np.delete(kept, 5, axis=0), np.delete(frames, 5, axis=0))
    assert not kept[5].any()  # the image that never came reads as 0


def test_follow_yields_growing_results_and_ends_on_the_whole_scan(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    data = probe_data(rng, scan=SCAN)
    frames = data.reshape(-1, *data.shape[2:])
    with DectrisSimulator(frames, rate_hz=100.0) as sim:
        acq = qf.live(sim.endpoint, scan_shape=SCAN, directory=tmp_path)
        sim.start()
        updates = list(
            acq.follow(
                lambda ds: qf.virtual_bf(ds, radius=4.5, center=CENTER),
                every_s=0.2,
                client="synchronous",
            )
        )
    rows = [r for r, _ in updates]
    assert rows == sorted(rows) and rows[-1] == SCAN[0] and len(rows) >= 3
    (offline,) = qf.compute(
        qf.virtual_bf(qf.open(data), radius=4.5, center=CENTER), client="synchronous"
    )
    for r, (bf,) in updates:
        np.testing.assert_array_equal(bf.data, offline.data[:r])  # every update exact on its rows


@pytest.mark.parametrize("compression", ["bslz4", "lz4"])
def test_the_series_is_kept_as_hdf5_with_the_chunks_as_received(
    rng: np.random.Generator, tmp_path: Path, compression: str
) -> None:
    import cbor2
    import h5py

    from quantem_flow.streams.dectris_stream import encode_image

    data = probe_data(rng, scan=SCAN)
    frames = data.reshape(-1, *data.shape[2:])
    cal = qf.Calibration(detector_sampling=0.5, detector_units="mrad")
    kept = tmp_path / "series.h5"
    with DectrisSimulator(frames, compression=compression) as sim:
        acq = qf.live(
            sim.endpoint, scan_shape=SCAN, directory=tmp_path, keep_hdf5=kept, calibration=cal
        )
        sim.start()
        assert acq.wait(timeout_s=30).complete
    ds = qf.open(kept, dataset_path="/entry/data/data", scan_shape=SCAN)
    np.testing.assert_array_equal(ds.load_block((0, SCAN[0])), data)
    assert ds.calibration == cal  # recorded with the frames
    with h5py.File(kept, "r") as f:
        dset = f["entry/data/data"]
        assert dset.chunks == (1, *data.shape[2:]) and "32008" in dset._filters
        if compression == "bslz4":  # byte for byte what the detector sent
            sent = cbor2.loads(
                encode_image(frames[7], series_id=1, image_id=7, compression="bslz4")
            )
            payload = sent["data"]["threshold_1"].value[1].value.value[2]
            assert dset.id.read_direct_chunk((7, 0, 0))[1] == payload
    with pytest.raises(qf.errors.OverwriteError, match="never replaces"):
        qf.live("tcp://127.0.0.1:1", scan_shape=SCAN, directory=tmp_path, keep_hdf5=kept)


def test_the_series_is_kept_in_dectris_layout_and_opens_whole(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    import h5py

    data = probe_data(rng, scan=SCAN)  # 120 frames
    frames = data.reshape(-1, *data.shape[2:])
    cal = qf.Calibration(detector_sampling=0.5, detector_units="mrad")
    master = tmp_path / "series_master.h5"
    with DectrisSimulator(frames, skip=[61]) as sim:
        acq = qf.live(
            sim.endpoint,
            scan_shape=SCAN,
            directory=tmp_path / "work",
            keep_hdf5=master,
            images_per_file=50,  # 3 data files: 50, 50, 20 frames
            calibration=cal,
            timeout_s=2,
        )
        sim.start()
        assert acq.wait(timeout_s=30).missing == [61]
    data_files = sorted(p.name for p in tmp_path.glob("series_data_*.h5"))
    assert data_files == [f"series_data_{k:06d}.h5" for k in (1, 2, 3)]
    ds = qf.open(master)  # the DECTRIS reader; scan shape and calibration from the sidecar
    assert ds.source.format == "dectris" and ds.scan_shape == SCAN and ds.calibration == cal
    got = ds.load_block((0, SCAN[0])).reshape(-1, *data.shape[2:])
    want = frames.copy()
    want[61] = 0  # never came: a chunk never written reads as the fill value
    np.testing.assert_array_equal(got, want)
    with h5py.File(tmp_path / "series_data_000002.h5", "r") as f:
        d = f["entry/data/data"]
        assert d.shape[0] == 50 and int(d.attrs["image_nr_low"]) == 51
        assert "32008" in d._filters and d.chunks == (1, *data.shape[2:])
    (tmp_path / "series_master.h5").unlink()  # the master gone, the others still there
    with pytest.raises(qf.errors.OverwriteError, match=r"series\.json' exists"):
        qf.live(
            "tcp://127.0.0.1:1",
            scan_shape=SCAN,
            directory=tmp_path,
            keep_hdf5=master,
            images_per_file=50,
        )


@pytest.mark.cluster
def test_the_live_command_updates_results_while_the_scan_runs(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    import re
    import subprocess
    import sys

    data = probe_data(rng, scan=SCAN)
    frames = data.reshape(-1, *data.shape[2:])
    pipeline = _pipeline_file(tmp_path, with_com=False)
    with DectrisSimulator(frames, rate_hz=25.0) as sim:  # 4.8 s of scan
        proc = subprocess.Popen(
            [sys.executable, "-m", "quantem_flow", "live", "--dectris", sim.endpoint,
             "--scan", f"{SCAN[0]}x{SCAN[1]}", str(pipeline)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        sim.start()
        out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    covered = [int(m) for m in re.findall(r"results over (\d+) of 12 scan rows", out)]
    assert any(0 < r < SCAN[0] for r in covered), out  # partial results before the end
    assert re.search(r"page: +http://127\.0\.0\.1:\d+/quantem-flow", out), out
    (offline,) = qf.compute(
        qf.virtual_bf(qf.open(data), radius=4.5, center=CENTER), client="synchronous"
    )
    saved = qf.load_results(tmp_path / "live_results.h5")["bf"]
    np.testing.assert_array_equal(saved.data, offline.data)
    assert any(n.startswith("live: joined from") for n in saved.provenance.notes)


def test_a_script_without_a_main_guard_receives_once(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = tmp_path / "at_the_microscope.py"
    script.write_text(
        "import numpy as np\n"
        "import quantem_flow as qf\n"
        "from quantem_flow.streams.dectris_sim import DectrisSimulator\n"
        "frames = np.arange(6 * 4 * 8 * 8, dtype=np.uint16).reshape(24, 8, 8)\n"
        "with DectrisSimulator(frames) as sim:\n"
        "    acq = qf.live(sim.endpoint, scan_shape=(6, 4))\n"
        "    sim.start()\n"
        "    print('report:', acq.wait(timeout_s=30).describe())\n"
        "    print('bf total:', int(acq.dataset().load_block((0, 6)).sum()))\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("report: complete: 24 of 24 images") == 1  # run once, not again
    assert f"bf total: {sum(range(6 * 4 * 8 * 8))}" in proc.stdout
