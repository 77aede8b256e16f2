"""mdboost.tracking.runs and .notes: point names, metric order, ordered nested runs, markdown notes."""

from __future__ import annotations

import math

import pytest

from mdboost.ranking.recommend import Recommendation
from mdboost.tracking.notes import markdown_table, ranking_note, validation_note
from mdboost.tracking.runs import KEY_METRICS, ChildRun, log_children, ordered_metrics, point_name


@pytest.mark.parametrize("kwargs, name", [
    ({"max_divergence": -0.1}, "max_divergence"), ({"max_divergence": math.nan}, "max_divergence"),
    ({"gamma": -1}, "gamma"), ({"temperature": -1.0}, "temperature"),
])
def test_point_name_rejects_bad_values_naming_them(kwargs, name):
    args = {"drafter": "int8", "divergence": "kl", "max_divergence": 0.1, "gamma": 2, "temperature": 1.0, **kwargs}
    with pytest.raises(ValueError, match=name):
        point_name(**args)


def test_point_name_reads_csv_strings_like_numbers():
    assert point_name("tuned:12", "kl", "0.05", "4", "0.7") == point_name("tuned:12", "kl", 0.05, 4, 0.7)
    assert point_name("ngram:3", "none", "0.0", "3", "1.0") == "ngram:3 SD g3 T1"


def test_ordered_metrics_puts_the_key_figures_first_and_keeps_the_rest_in_order():
    row = {"n_positions": 64, "rank": 3, "md_acceptance": 0.5, "predicted_speedup_hi": 1.4, "drafter": "int8",
           "predicted_speedup": 1.2, "quality_ok": False, "nll_drafter": math.inf, "predicted_speedup_lo": math.nan}
    out = ordered_metrics(row)
    assert list(out) == ["predicted_speedup", "predicted_speedup_hi", "md_acceptance", "n_positions", "rank",
                         "quality_ok"]
    assert out["quality_ok"] == 0.0 and out["n_positions"] == 64.0
    assert KEY_METRICS[0] == "predicted_speedup"
    with pytest.raises(TypeError, match="first"):
        ordered_metrics(row, first="predicted_speedup")


@pytest.fixture
def client(tmp_path):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    eid = c.create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    return c, eid, c.create_run(eid, run_name="parent").info.run_id


def test_log_children_lists_them_in_the_given_order_newest_first(client):
    """Created in one burst (many within a millisecond), they still list in order: MLflow's
    default order is start time descending, and each child starts strictly after the next."""
    c, eid, parent = client
    children = [ChildRun(f"point {i}", {"i": i}, {"predicted_speedup": 2.0 - i / 100, "n_positions": 8.0},
                         {"rank": str(i + 1)}) for i in range(25)]
    ids = log_children(c, eid, parent, children)
    found = c.search_runs([eid], f"tags.mlflow.parentRunId = '{parent}'", max_results=100)
    assert [r.info.run_id for r in found] == ids
    assert [r.info.run_name for r in found] == [ch.name for ch in children]
    starts = [r.info.start_time for r in found]
    assert all(a > b for a, b in zip(starts, starts[1:]))
    for run, child in zip(found, children):
        assert run.info.status == "FINISHED" and run.info.end_time >= run.info.start_time
        assert run.data.params == {"i": str(child.params["i"])}
        assert run.data.tags["rank"] == child.tags["rank"]
        assert run.data.metrics == child.metrics


def test_log_children_logs_metrics_in_their_order(client):
    """The store hands metrics back in logging order (the UI's default metric is the first shared one)."""
    c, eid, parent = client
    metrics = {"predicted_speedup": 1.1, "zeta": 1.0, "n_positions": 3.0, "alpha": 2.0}
    (run_id,) = log_children(c, eid, parent, [ChildRun("a", {}, metrics)])
    store = c._tracking_client.store
    assert [m.key for m in store.get_run(run_id).data._metric_objs] == list(metrics)


def test_log_children_refuses_duplicate_names(client):
    c, eid, parent = client
    with pytest.raises(ValueError, match="distinct names.*'a'"):
        log_children(c, eid, parent, [ChildRun("a"), ChildRun("b"), ChildRun("a")])
    assert c.search_runs([eid], f"tags.mlflow.parentRunId = '{parent}'") == []


def test_markdown_table_escapes_pipes_and_requires_columns():
    table = markdown_table([{"a": "x|y", "b": 1}], [("a", "A"), ("b", "B")])
    assert table.splitlines() == ["| A | B |", "|---|---|", "| x\\|y | 1 |"]
    with pytest.raises(ValueError, match="columns"):
        markdown_table([], [])


def _row(rank, drafter, budget, gamma, speedup, **extra):
    return {"rank": rank, "drafter": drafter, "target": "tiny", "temperature": 0.7,
            "divergence": "none" if budget == 0 else "kl", "max_divergence": budget, "gamma": gamma,
            "predicted_speedup": speedup, "predicted_speedup_lo": speedup - 0.1, "predicted_speedup_hi": speedup + 0.1,
            "engine_acceptance": 0.6, "engine_acceptance_lo": 0.5, "engine_acceptance_hi": 0.7,
            "engine_mean_accepted_length": 2.5, "cost_ratio": 0.2, "nll_mentored": 1.0, "quality_ok": True, **extra}


def test_ranking_note_leads_with_the_verdict_and_lists_the_top_points_in_order():
    rec = Recommendation("tuned:2", "tiny", 0.7, "kl", 0.1, 3, 1.5, 1.4, 1.6, True, True, 1.0, 1.02)
    points = [_row(1, "tuned:2", 0.1, 3, 1.5), _row(4, "ngram:2", 0.0, 2, 1.2), _row(9, "int8", 0.1, 1, 1.1)]
    note = ranking_note(rec, points, bootstrap={"prompts": 4, "resamples": 200, "level": 0.9},
                        snippet="out = generate(...)", n_pairs=3, n_rows=18, nll_tolerance=0.05, top=2)
    lines = note.splitlines()
    assert lines[0] == f"**{rec.verdict()}**" and rec.verdict().startswith("recommended: tuned:2")
    assert "```python" in lines and "out = generate(...)" in lines
    ranking = lines[lines.index("### Ranking"):]
    table = [ln for ln in ranking if ln.startswith("| ")]
    assert table[0].startswith("| rank | point |") and len(table) == 1 + 2  # header and the top 2
    assert table[1].startswith("| 1 | tuned:2 kl 0.1 g3 T0.7 | tiny | 1.500 [1.400, 1.600] | 0.600 [0.500, 0.700] | 2.50 |")
    assert table[2].startswith("| 4 | ngram:2 SD g2 T0.7 |")
    assert "3 pairs, 3 operating points" in note and "Top 2 of 3 points shown." in note
    with pytest.raises(ValueError, match="top"):
        ranking_note(rec, points, bootstrap={}, snippet="", n_pairs=1, n_rows=1, nll_tolerance=0.0, top=0)


def test_ranking_note_says_when_plain_decoding_wins():
    rec = Recommendation("ngram:2", "tiny", 1.0, "none", 0.0, 2, 0.8, 0.7, 0.9, False, True, 1.0, 1.0)
    note = ranking_note(rec, [_row(1, "ngram:2", 0.0, 2, 0.8)], bootstrap={"prompts": 2, "resamples": 10, "level": 0.9},
                        snippet="", n_pairs=1, n_rows=2, nll_tolerance=0.05)
    assert note.splitlines()[0] == f"**{rec.verdict()}**" and rec.verdict().startswith("plain decoding is reliably fastest")


def test_validation_note_marks_realized_figures_outside_their_interval():
    cell = {"cell": 0, "drafter": "int8", "divergence": "kl", "max_divergence": 0.2, "gamma": 2, "temperature": 0.5,
            "predicted_speedup": 1.2, "predicted_speedup_lo": 1.1, "predicted_speedup_hi": 1.3, "realized_speedup": 1.5,
            "speedup_inside": False, "predicted_acceptance": 0.6, "predicted_acceptance_lo": math.nan,
            "predicted_acceptance_hi": math.nan, "realized_acceptance": 0.55, "acceptance_inside": None,
            "predicted_mean_accepted_length": 2.0, "predicted_mean_accepted_length_lo": 1.5,
            "predicted_mean_accepted_length_hi": 2.5, "realized_mean_accepted_length": 2.2,
            "mean_accepted_length_inside": True}
    note = validation_note("intervals cover 0 of 1 cells", [cell, dict(cell, cell=1, max_divergence=0.0)],
                           prompts=2, max_new_tokens=8, ranking_run_id="abc")
    lines = note.splitlines()
    assert lines[0] == "**intervals cover 0 of 1 cells**" and "Ranking run: `abc`." in note
    rows = [ln for ln in lines if ln.startswith("| ")][1:]
    assert rows[0] == "| 0 | int8 kl 0.2 g2 T0.5 | 1.20 [1.10, 1.30] | 1.50 * | 0.600 | 0.550 | 2.00 [1.50, 2.50] | 2.20 |"
    assert rows[1].startswith("| 1 | int8 SD g2 T0.5 |")


def test_the_parent_run_lasts_as_long_as_the_job(client):
    """A parent logged at the end of a 30-minute job shows 30 minutes in the UI, not the seconds
    of logging: it starts when the job did."""
    import time

    import mlflow

    from mdboost.tracking.runs import parent_run

    c, eid, _ = client
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(c.tracking_uri)  # as the pipelines' setup() points mlflow at their store
    try:
        began = time.time() - 1800.0
        with parent_run(c, eid, "rank:x", began) as run:
            run_id = run.info.run_id
            mlflow.log_metric("m", 1.0)
    finally:
        mlflow.set_tracking_uri(before)
    info = c.get_run(run_id).info
    assert info.start_time == int(began * 1000) and info.status == "FINISHED"
    assert 1800 * 1000 <= info.end_time - info.start_time < 1900 * 1000
    assert c.get_run(run_id).data.metrics == {"m": 1.0} and info.run_name == "rank:x"
    for bad in (time.time() + 3600, float("nan"), "now"):
        with pytest.raises(ValueError, match="started_at must be a past time"):
            parent_run(c, eid, "rank:y", bad)
