"""Figures (matplotlib) and interop (np.asarray, to_xarray) of typed results."""

from __future__ import annotations

import json

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow import plotting

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CAL = qf.Calibration(
    scan_sampling=0.5,
    scan_units="Å",
    detector_sampling=0.9,
    detector_units="mrad",
    accelerating_voltage_kV=300,
)


@pytest.fixture(scope="module")
def results() -> dict[str, qf.Result]:
    data, _ = qf.synthetic_dataset(scan_shape=(16, 20), detector_shape=(32, 36), probe_radius_px=5)
    raw = qf.open(data)
    cal = raw.with_calibration(CAL)
    lazy = {
        "bf": qf.virtual_bf(cal),
        "adf": qf.virtual_adf(cal, inner=6, outer=14, units="mrad"),
        "com": qf.center_of_mass(cal),
        "mean": qf.mean_diffraction(cal),
        "mean_px": qf.mean_diffraction(raw),
        "bf_px": qf.virtual_bf(raw),
        "ssb": qf.ssb(cal, voltage_kV=300, semiangle_mrad=4.5),
    }
    lazy["idpc"] = qf.idpc(lazy["com"])
    out = dict(zip(lazy, qf.compute(*lazy.values(), client="synchronous"), strict=True))
    yield out
    plt.close("all")


def _colorbar_labels(fig) -> list[str]:
    return [a.get_ylabel() for a in fig.axes if a.get_label() == "<colorbar>"]


def test_scan_image_calibrated_axes_colorbar_title(results):
    bf = results["bf"]
    fig = bf.plot()
    ax = fig.axes[0]
    assert ax.get_xlabel() == "scan column (Å)"
    assert ax.get_ylabel() == "scan row (Å)"
    # extent in Å, row axis down (top is row 0)
    left, right, bottom, top = ax.images[0].get_extent()
    assert left == pytest.approx(-0.25) and right == pytest.approx(9.75)
    assert top == pytest.approx(-0.25) and bottom == pytest.approx(7.75)
    assert ax.get_ylim()[0] > ax.get_ylim()[1]
    assert _colorbar_labels(fig) == ["bf (counts)"]
    title = ax.get_title()
    assert "virtual_bf" in title and "px" in title and "centre" in title
    plt.close(fig)


def test_uncalibrated_scan_is_px(results):
    fig = results["bf_px"].plot()
    ax = fig.axes[0]
    assert ax.get_xlabel() == "scan column (px)"
    assert ax.images[0].get_extent()[1] == pytest.approx(19.5)
    plt.close(fig)


def test_scalebar_replaces_ticks(results):
    fig = results["bf"].plot(scalebar=True)
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == []
    texts = [t.get_text() for a in ax.artists for t in a.findobj(matplotlib.text.Text)]
    assert any(t.endswith(" Å") for t in texts), texts
    plt.close(fig)


def test_vector_field_colour_wheel_and_arrows(results):
    com = results["com"]
    fig = com.plot(arrows=True)
    labels = [c.get_label() for a in fig.axes for c in a.child_axes]
    assert "colour wheel" in labels
    main = fig.axes[0]
    assert main.get_xlabel() == "scan column (Å)"
    assert any(type(c).__name__ == "Quiver" for c in main.collections)
    assert any("|v| (mrad)" in lab for lab in _colorbar_labels(fig))
    assert "center_of_mass" in main.get_title() and "mrad" in main.get_title()
    plt.close(fig)


def test_diffraction_in_mrad_with_detectors(results):
    mean = results["mean"]
    fig = mean.plot(detectors=[results["bf"], results["adf"]])
    ax = fig.axes[0]
    assert ax.get_xlabel() == "k column (mrad from the beam centre)"
    assert ax.get_ylabel() == "k row (mrad from the beam centre)"
    origin_col = mean.axes[1].origin  # the beam centre (given or found), recorded
    assert mean.provenance.parameters["axes_origin"]["px"][1] == origin_col
    assert ax.images[0].get_extent()[1] == pytest.approx((35.5 - origin_col) * 0.9)
    ellipses = [p for p in ax.patches if type(p).__name__ == "Ellipse"]
    assert len(ellipses) == 3  # bf outer, adf inner and outer
    widths = sorted(round(e.width, 6) for e in ellipses)
    assert widths[1:] == [pytest.approx(12.0), pytest.approx(28.0)]  # adf 6-14 mrad
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("adf: 6-14 mrad") for t in legend)
    assert "log scale" in _colorbar_labels(fig)[0]
    assert "counts per frame" in _colorbar_labels(fig)[0]
    plt.close(fig)


def test_uncalibrated_pattern_never_mrad(results):
    fig = results["mean_px"].plot(detectors=[results["bf_px"]])
    ax = fig.axes[0]
    assert ax.get_xlabel() == "k column (px)"
    texts = " ".join(t.get_text() for t in fig.findobj(matplotlib.text.Text))
    assert "mrad" not in texts
    plt.close(fig)


def test_ssb_amplitude_and_phase_side_by_side(results):
    fig = results["ssb"].plot()
    images = [a for a in fig.axes if a.images and a.get_label() != "<colorbar>"]
    assert [a.get_title() for a in images] == ["amplitude", "phase"]
    assert images[0].get_position().x1 <= images[1].get_position().x0
    assert _colorbar_labels(fig) == ["amplitude (dimensionless)", "phase (rad)"]
    suptitle = fig.get_suptitle()
    assert "ssb" in suptitle and "300 kV" in suptitle and "semiangle 4.5 mrad" in suptitle
    plt.close(fig)


def test_phase_image_units(results):
    fig = results["idpc"].plot()
    assert _colorbar_labels(fig) == ["phase (rad)"]
    assert "rotation" in fig.axes[0].get_title()
    plt.close(fig)


def test_panel_draws_every_result_and_detectors(results):
    r = results
    fig = qf.plot(r["bf"], r["adf"], r["com"], r["idpc"], r["mean"], r["ssb"])
    titles = [a.get_title() for a in fig.axes]
    for op in ("virtual_bf", "virtual_adf", "center_of_mass", "idpc", "mean_diffraction"):
        assert any(op in t for t in titles), (op, titles)
    pattern = next(a for a in fig.axes if "mean_diffraction" in a.get_title())
    assert len([p for p in pattern.patches if type(p).__name__ == "Ellipse"]) == 3
    plt.close(fig)


def test_plot_rejects_arrays():
    with pytest.raises(qf.errors.ParameterError, match="quantem_flow results"):
        qf.plot(np.zeros((3, 3)))


def test_write_figures(results, tmp_path):
    from PIL import Image

    paths = plotting.write_figures({"bf": results["bf"], "com": results["com"]}, tmp_path)
    assert sorted(paths) == ["bf", "com", "overview"]
    for p in paths.values():
        with Image.open(p) as im:
            assert im.size[0] > 300 and im.size[1] > 200
    with pytest.raises(FileExistsError):
        plotting.write_figures({"bf": results["bf"]}, tmp_path)


def test_asarray(results):
    bf = results["bf"]
    a = np.asarray(bf)
    assert a is bf.data
    assert np.asarray(bf, dtype=np.float32).dtype == np.float32
    c = np.array(bf, copy=True)
    assert c is not bf.data and np.array_equal(c, bf.data)
    assert float(np.mean(bf)) == pytest.approx(float(bf.data.mean()))


def test_to_xarray(results):
    xr = pytest.importorskip("xarray")
    com = results["com"]
    da = com.to_xarray()
    assert isinstance(da, xr.DataArray)
    assert da.dims == ("component", "scan_row", "scan_col")
    assert list(da.coords["component"].values) == ["row", "col"]
    assert da.coords["scan_col"].attrs["units"] == "Å"
    assert float(da.coords["scan_col"][3]) == pytest.approx(1.5)
    assert da.attrs["units"] == "mrad"
    assert json.loads(da.attrs["provenance"])["operator"] == "center_of_mass"
    mean = results["mean"].to_xarray()
    assert mean.dims == ("k_row", "k_col") and mean.coords["k_row"].attrs["units"] == "mrad"


def test_cli_run_writes_figures(tmp_path, capsys):
    import yaml

    from quantem_flow.cli import main

    data = tmp_path / "d.h5"
    qf.write_synthetic(
        data, format="hdf5", scan_shape=(8, 10), detector_shape=(24, 24), probe_radius_px=4
    )
    yml = tmp_path / "p.yaml"
    spec = {
        "version": 1,
        "input": {"path": str(data), "options": {"dataset_path": "/data"}},
        "outputs": {"bf": {"op": "virtual_bf"}, "mean": {"op": "mean_diffraction"}},
        "save": {"png": "images/"},
    }
    yml.write_text(yaml.safe_dump(spec), encoding="utf-8")
    args = ["run", str(yml), "--scheduler", "synchronous", "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    figs = tmp_path / "figures"
    assert sorted(p.name for p in figs.iterdir()) == ["bf.png", "mean.png", "overview.png"]
    assert str(figs) in out
    assert (tmp_path / "images" / "bf.png").exists()  # the data images stay
    # refused before computing without --overwrite; --no-figures and --figures DIR
    assert main(args) == 2
    assert "already exist" in capsys.readouterr().err
    other = tmp_path / "elsewhere"
    assert main([*args, "--overwrite", "--figures", str(other)]) == 0
    assert (other / "overview.png").exists()
    (other / "bf.png").unlink()
    assert main([*args, "--overwrite", "--no-figures", "--figures", str(other)]) == 0
    assert not (other / "bf.png").exists()
