"""mdboost.validation: prediction-quality metrics against scipy and direct computations."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from mdboost.validation import absolute_errors, prediction_quality, spearman, top_pair_agrees
from mdboost.validation.plots import plot_predicted_vs_realized


@pytest.mark.parametrize("seed", range(12))
def test_spearman_matches_scipy_with_and_without_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 30))
    x = rng.normal(size=n)
    y = x + rng.normal(scale=float(rng.uniform(0.1, 3)), size=n)
    if seed % 2:  # heavy ties
        x, y = np.round(x), np.round(y * 2) / 2
    expected = stats.spearmanr(x, y).statistic
    if np.isnan(expected):
        assert np.isnan(spearman(x, y))
    else:
        assert spearman(x, y) == pytest.approx(expected, abs=1e-12)


def test_spearman_edge_cases():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert np.isnan(spearman([1.0], [2.0]))
    assert np.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_spearman_is_invariant_under_monotone_maps():
    rng = np.random.default_rng(3)
    x, y = rng.uniform(size=15), rng.uniform(size=15)
    assert spearman(x, y) == pytest.approx(spearman(np.exp(5 * x), y ** 3))


def test_top_pair_agreement():
    assert top_pair_agrees([1.2, 1.9, 1.5], [1.1, 1.7, 1.6])
    assert not top_pair_agrees([1.2, 1.9, 1.5], [1.1, 1.5, 1.6])
    assert top_pair_agrees([1.0, 2.0], [1.5, 1.5])  # tie at the top counts


def test_prediction_quality_equals_direct_computation():
    rng = np.random.default_rng(0)
    pa, ra = rng.uniform(0.3, 0.9, 8), rng.uniform(0.3, 0.9, 8)
    ra[:3] = pa[:3] + np.array([0.01, -0.02, 0.029])
    ps, rs = rng.uniform(0.8, 2.5, 8), rng.uniform(0.8, 2.5, 8)
    q = prediction_quality(pa, ra, ps, rs, tolerance=0.03)
    m = q.as_metrics()
    np.testing.assert_allclose(q.acceptance_error, np.abs(pa - ra))
    assert m["acceptance_mae"] == pytest.approx(np.mean(np.abs(pa - ra)))
    assert m["acceptance_max_error"] == pytest.approx(np.max(np.abs(pa - ra)))
    assert m["acceptance_within_tolerance"] == pytest.approx(np.mean(np.abs(pa - ra) <= 0.03))
    assert m["speedup_mae"] == pytest.approx(np.mean(np.abs(ps - rs)))
    assert m["acceptance_spearman"] == pytest.approx(stats.spearmanr(pa, ra).statistic)
    assert m["speedup_spearman"] == pytest.approx(stats.spearmanr(ps, rs).statistic)
    assert m["top_pair_agrees"] == float(rs[np.argmax(ps)] == rs.max())
    np.testing.assert_allclose(absolute_errors(ps, rs), np.abs(ps - rs))


@pytest.mark.parametrize("args, name", [
    (([0.5], [0.5, 0.6], [1.0], [1.0]), "realized_acceptance"),
    (([], [], [], []), "predicted_acceptance"),
    (([0.5], [np.nan], [1.0], [1.0]), "realized_acceptance"),
    (([1.5], [0.5], [1.0], [1.0]), "predicted_acceptance"),
    (([0.5, 0.6], [0.5, 0.6], [1.0], [1.0]), "same pairs"),
])
def test_bad_inputs_raise(args, name):
    with pytest.raises(ValueError, match=name):
        prediction_quality(*args)


def test_bad_tolerance_raises():
    with pytest.raises(ValueError, match="tolerance"):
        prediction_quality([0.5], [0.5], [1.0], [1.0], tolerance=-0.1)


def test_scatter_plot_is_a_png_with_two_panels(tmp_path):
    import matplotlib.image as mpimg

    path = plot_predicted_vs_realized(["a -> t", "b -> t", "c -> t"], [0.5, 0.6, 0.7],
                                      [0.52, 0.58, 0.75], [1.1, 1.3, 1.6], [1.0, 1.4, 1.5],
                                      tmp_path / "sub" / "scatter.png")
    assert path == tmp_path / "sub" / "scatter.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(path)
    assert img.shape[1] > img.shape[0] > 200  # wide figure: two panels side by side
    assert not any(p.name.startswith(".") for p in path.parent.iterdir())  # no temp leftovers


def test_scatter_plot_leaves_out_a_cell_that_drafted_nothing(tmp_path):
    """A realized acceptance is NaN where a cell's runs drafted nothing (a draft floor): no point
    on the acceptance panel; a NaN speedup, or a NaN predicted acceptance, is still refused."""
    path = plot_predicted_vs_realized(["a", "b"], [0.5, 0.6], [float("nan"), 0.58], [1.0, 1.1], [0.98, 1.2],
                                      tmp_path / "nan.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot_predicted_vs_realized(["a"], [0.5], [float("nan")], [1.0], [0.98], tmp_path / "none.png")
    with pytest.raises(ValueError, match="realized_speedup must be 2 finite numbers"):
        plot_predicted_vs_realized(["a", "b"], [0.5, 0.6], [0.5, 0.6], [1.0, 1.1], [1.0, float("nan")], tmp_path / "x.png")
    with pytest.raises(ValueError, match="predicted_acceptance must be 2 finite numbers"):
        plot_predicted_vs_realized(["a", "b"], [0.5, float("nan")], [0.5, 0.6], [1.0, 1.1], [1.0, 1.1], tmp_path / "x.png")
    # the drafter decoding alone predicts and realizes no acceptance: no point either
    plot_predicted_vs_realized(["a", "b"], [0.5, float("nan")], [0.5, float("nan")], [1.0, 1.1], [1.0, 1.1],
                               tmp_path / "alone.png")


def test_scatter_plot_rejects_mismatched_lengths(tmp_path):
    with pytest.raises(ValueError, match="realized_speedup"):
        plot_predicted_vs_realized(["a", "b"], [0.5, 0.6], [0.5, 0.6], [1.0, 1.1], [1.0],
                                   tmp_path / "x.png")


def test_expected_acceptance_metrics_skip_nan_points():
    pa, ra, ea = [0.5, 0.6, 0.7, 0.8], [0.45, 0.7, 0.7, 0.9], [0.52, float("nan"), 0.69, 0.78]
    q = prediction_quality(pa, ra, [1.1, 1.2, 1.3, 1.4], [1.0, 1.3, 1.2, 1.5], expected_acceptance=ea)
    m = q.as_metrics()
    err = np.abs(np.array([0.5, 0.7, 0.8]) - np.array([0.52, 0.69, 0.78]))
    assert m["acceptance_mae_expected"] == pytest.approx(err.mean())
    assert m["acceptance_max_error_expected"] == pytest.approx(err.max())
    assert m["acceptance_within_tolerance_expected"] == 1.0 and m["acceptance_points_expected"] == 3
    assert m["acceptance_spearman_expected"] == pytest.approx(stats.spearmanr([0.5, 0.7, 0.8], [0.52, 0.69, 0.78]).statistic)
    assert m["acceptance_mae"] == pytest.approx(np.mean(np.abs(np.array(pa) - np.array(ra))))
    none = prediction_quality(pa, ra, [1.1, 1.2, 1.3, 1.4], [1.0, 1.3, 1.2, 1.5], expected_acceptance=[float("nan")] * 4)
    assert "acceptance_mae_expected" not in none.as_metrics()
    assert "acceptance_mae_expected" not in prediction_quality(pa, ra, [1, 2, 3, 4], [1, 2, 3, 4]).as_metrics()


@pytest.mark.parametrize("ea", [[0.5, 0.5], [0.5, 0.5, 0.5, 1.5]])
def test_expected_acceptance_bad_input(ea):
    with pytest.raises(ValueError, match="expected_acceptance"):
        prediction_quality([0.5] * 4, [0.5] * 4, [1.0] * 4, [1.0] * 4, expected_acceptance=ea)
