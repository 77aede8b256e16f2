"""mdboost.validation.cells: which cells are validated, and refusing contradicting settings."""

from __future__ import annotations

import json

import pytest
import yaml

from mdboost.ranking.recommend import recommend
from mdboost.validation.cells import cell_key, check_md_solve, complete_rows, resolve_sampling, select_cells
from tests._validation_rows import ranking_rows

RANKING = {"temperatures": [0.7, 1.0], "top_k": None, "top_p": None}


def test_sampling_defaults_to_the_rankings():
    assert resolve_sampling(RANKING) == RANKING
    assert resolve_sampling({**RANKING, "top_k": "50", "top_p": 0.9}, top_k=50, top_p=0.9) == {
        "temperatures": [0.7, 1.0], "top_k": 50, "top_p": 0.9}
    assert resolve_sampling(RANKING, temperature=0.7)["temperatures"] == [0.7]


@pytest.mark.parametrize("given, match", [
    (dict(temperature=0.5), r"generation.temperature is 0.5 but the ranking predicts at temperatures \[0.7, 1.0\]"),
    (dict(top_k=40), r"generation.top_k is 40 but the ranking predicts with top_k None"),
    (dict(top_p=0.95), r"generation.top_p is 0.95 but the ranking predicts with top_p None"),
])
def test_sampling_contradicting_the_ranking_is_refused(given, match):
    with pytest.raises(ValueError, match=match):
        resolve_sampling(RANKING, **given)


def test_top_k_differing_from_the_rankings_is_refused():
    with pytest.raises(ValueError, match="top_k is 10 but the ranking predicts with top_k 50"):
        resolve_sampling({**RANKING, "top_k": 50}, top_k=10)


def test_md_solve_differing_from_the_rankings_is_refused():
    rows = complete_rows(ranking_rows(), temperature=None, md_solve="reached")
    assert {r["md_solve"] for r in rows} == {"needed"}  # the rows' own column wins
    check_md_solve(rows, None)
    check_md_solve(rows, "needed")
    with pytest.raises(ValueError, match="generation.md_solve is 'reached' but the ranking predicts for md_solve 'needed'"):
        check_md_solve(rows, "reached")


def test_old_rows_get_best_gamma_and_the_single_temperature():
    old = [{k: v for k, v in r.items() if k not in ("gamma", "temperature", "md_solve")} for r in ranking_rows()[:3]]
    rows = complete_rows(old, temperature=0.5, md_solve="reached")
    assert [(r["gamma"], r["temperature"], r["md_solve"]) for r in rows] == [("3", 0.5, "reached")] * 3
    with pytest.raises(ValueError, match="temperature"):
        complete_rows(old, temperature=None, md_solve="reached")


def test_cells_cover_the_space_and_start_with_the_recommendation():
    rows = ranking_rows()
    rec = recommend([r for r in rows if r["target"] == "t"]).to_dict()
    cells = select_cells(rows, rec, cells=12)
    keys = [cell_key(c) for c in cells]
    assert keys[0] == cell_key(rec) and len(cells) == 13 and len(set(keys)) == 13
    assert {k[2] for k in keys} == {0.7, 1.0}
    assert {(k[2], k[4] > 0) for k in keys} == {(0.7, True), (0.7, False), (1.0, True), (1.0, False)}
    assert {k[0] for k in keys} == {"a", "b", "c"}
    assert {k[5] for k in keys} == {1, 2, 3, 4}
    assert len({k[4] for k in keys if k[4] > 0}) >= 2 and {k[3] for k in keys} == {"none", "kl", "tv"}
    assert all(c["target"] != "ngram:2" for c in cells)
    assert [cell_key(c) for c in select_cells(rows, rec, cells=12)] == keys  # deterministic


def test_cells_prefer_quality_ok_rows_and_recompute_the_recommendation():
    rows = ranking_rows(bad_budget=0.2)
    cells = select_cells(rows, None, cells=10)
    assert cell_key(cells[0]) == cell_key(recommend([r for r in rows if r["target"] == "t"]).to_dict())
    assert all(c["quality_ok"] == "True" for c in cells)
    assert any(float(c["max_divergence"]) > 0 for c in cells[1:])


def test_cells_at_one_temperature_only_and_fewer_than_asked():
    rows = ranking_rows(drafters=("a",), gammas=(2,), points=(("none", 0.0), ("kl", 0.1)))
    cells = select_cells(rows, None, cells=50, temperatures=[1.0])
    assert len(cells) == 2 and {float(c["temperature"]) for c in cells} == {1.0}
    # a recommendation at a temperature left out: the best cell among the allowed ones instead
    rec = recommend([r for r in rows if r["target"] == "t"]).to_dict()
    assert rec["temperature"] == 0.7
    assert float(select_cells(rows, rec, cells=0, temperatures=[1.0])[0]["temperature"]) == 1.0
    with pytest.raises(ValueError, match="cells must be an integer >= 0"):
        select_cells(rows, None, cells=-1)
    with pytest.raises(ValueError, match="no cell to validate"):
        select_cells(rows, None, cells=1, temperatures=[0.3])


def _ranking_dir(tmp_path, temperature: float) -> str:
    from mdboost.ranking.report import write_csv
    from pipelines.loader import to_dict
    from pipelines.config import RankConfig

    cfg = to_dict(RankConfig())
    cfg["md"]["temperature"] = temperature
    (tmp_path / "rank").mkdir()
    (tmp_path / "rank" / "config.resolved.yaml").write_text(yaml.safe_dump(cfg))
    rows = ranking_rows(temperatures=(temperature,))
    write_csv(rows, tmp_path / "rank" / "ranking.csv")
    summary = {"sampling": {"temperatures": [temperature], "top_k": None, "top_p": None}, "md_solve": "needed"}
    (tmp_path / "rank" / "summary.json").write_text(json.dumps(summary))
    return str(tmp_path / "rank")


def test_validate_cli_refuses_a_temperature_mismatch(tmp_path, capsys):
    from mdboost import cli

    val = {"ranking": {"ranking_dir": _ranking_dir(tmp_path, 0.5)}, "generation": {"temperature": 1.0},
           "output_dir": str(tmp_path / "val"), "tracking": {"enabled": False}}
    (tmp_path / "val.yaml").write_text(yaml.safe_dump(val))
    assert cli.main(["validate", "--config", str(tmp_path / "val.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith(
        "mdboost validate: error: generation.temperature is 1.0 but the ranking predicts at temperature 0.5")
    assert err.endswith("(--debug shows the traceback)")
    assert not (tmp_path / "val").exists()
    with pytest.raises(ValueError, match="generation.temperature is 1.0"):  # --debug: the traceback
        cli.main(["validate", "--debug", "--config", str(tmp_path / "val.yaml")])


def test_validate_plan_takes_the_rankings_temperature(tmp_path):
    from pipelines import validate_pairs
    from pipelines.loader import from_dict
    from pipelines.validate_config import ValidateConfig

    cfg = from_dict(ValidateConfig, {"ranking": {"ranking_dir": _ranking_dir(tmp_path, 0.5), "cells": 4},
                                     "tracking": {"enabled": False}})
    plan = validate_pairs.plan(cfg)
    assert plan.sampling == {"temperatures": [0.5], "top_k": None, "top_p": None}
    assert len(plan.cells) == 5 and {float(c["temperature"]) for c in plan.cells} == {0.5}


@pytest.mark.parametrize("source, ranked, generated, expected", [
    ("sampled", 64, 64, None),
    ("sampled", 32, 64, "predicts for 32-token generations"),
    ("reference", 64, 64, "reference text .*not the 64 tokens this validation generates"),
])
def test_generation_length_note(source, ranked, generated, expected):
    """Predictions made for another generation length, or on reference texts of their own
    lengths, are flagged before the runs."""
    import re
    from types import SimpleNamespace

    from pipelines.validate_pairs import generation_length_note

    cache = SimpleNamespace(acceptance_source=source, acceptance_max_new_tokens=ranked)
    note = generation_length_note(SimpleNamespace(config=SimpleNamespace(cache=cache)), generated)
    assert (note is None) if expected is None else re.search(expected, note)


def test_cells_span_the_rules_and_the_recommendation_of_another_rule_is_the_first_cell():
    """Every rule's rows are cells (the engine runs each rule, docs/ranking.md "Rules and engines");
    the cells spread over the rules, and the recommendation's row comes first whatever its rule."""
    md = ranking_rows()
    others = [dict(r, rule="threshold", drafting="greedy", predicted_speedup=9.0, predicted_speedup_lo=8.0)
              for r in md]
    rows = others + [dict(r, rule="mentored", drafting="sampled") for r in md]
    rec = recommend(rows).to_dict()
    assert rec["rule"] == "threshold"
    cells = select_cells(rows, rec, cells=5)
    assert cell_key(cells[0]) == cell_key(rec)
    assert {c["rule"] for c in cells} == {"threshold", "mentored"}
    assert len({cell_key(c) for c in cells}) == 6
    # the same row under two rules is two cells
    assert cell_key(others[0]) != cell_key(dict(md[0], rule="mentored", drafting="sampled"))


def test_a_row_predicted_to_draft_nowhere_is_no_cell():
    """A draft floor above every confidence: the process predicts no drafted step (engine
    acceptance NaN, tokens per call 1); such a row is skipped, an i.i.d.-only row is not."""
    from mdboost.validation.cells import select_cells

    base = {"drafter": "d", "target": "t", "temperature": "1.0", "divergence": "none", "max_divergence": "0.0",
            "gamma": "2", "predicted_speedup": "1.0", "rank": "1", "quality_ok": "True", "rule": "match",
            "drafting": "greedy", "md_acceptance": "0.4"}
    nowhere = dict(base, draft_p_min="0.75", engine_acceptance="nan", engine_tokens_per_call="1.0")
    drafts = dict(base, draft_p_min="0.0", engine_acceptance="0.4", engine_tokens_per_call="1.3", rank="2")
    iid = dict(base, drafter="e", engine_acceptance="nan", engine_tokens_per_call="nan", rank="3")
    chosen = select_cells([nowhere, drafts, iid], cells=5)
    assert [(r["drafter"], r["draft_p_min"] if "draft_p_min" in r else None) for r in chosen] == [("d", "0.0"), ("e", None)]
