"""End to end with every default rule (md.rules), and MD on greedy drafts, on target-sampled text: the
rule columns, SGLang's thresholds within their budgets, MD on the same greedy drafts above them, and
the recommendation per engine."""

import json
import math

import pytest

from mdboost.md.rules import ENGINES
from mdboost.ranking.report import read_csv
from pipelines.config import MDConfig, RankConfig
from pipelines.loader import from_dict, to_dict
from tests.test_rank_pipeline_sampled import _config

RULES = {("mentored", "sampled", 0.0), ("rejection", "greedy", 0.0), ("rejection", "sampled", 0.0),
         ("block", "sampled", 0.0), ("threshold", "greedy", 0.0), ("match", "greedy", 0.0), ("match", "greedy", 0.25),
         ("match", "greedy", 0.5), ("match", "greedy", 0.75), ("mentored", "greedy", 0.0)}


def _key(r: dict) -> tuple:
    """A ranking.csv row's point: drafter, rule, drafting, draft floor, divergence, budget."""
    return r["drafter"], r["rule"], r["drafting"], float(r["draft_p_min"]), r["divergence"], float(r["max_divergence"])


@pytest.fixture(scope="module")
def rules_run(tmp_path_factory):
    from pipelines.rank_pool import run

    tmp_path = tmp_path_factory.mktemp("rank_rules")
    rules = to_dict(MDConfig())["rules"] + [{"rule": "mentored", "drafting": "greedy"}]
    cfg = _config(tmp_path, md={"rules": rules, "temperatures": [1.0], "budgets": [0.0, 0.1, 0.5]},
                  ranking={"frontier_rows": 16})
    return tmp_path, cfg, run(cfg)


def test_default_rules_are_the_documented_list():
    assert [(r.rule, r.drafting, r.draft_p_min) for r in MDConfig().rules] == [
        ("mentored", "sampled", 0.0), ("rejection", "greedy", 0.0), ("rejection", "sampled", 0.0), ("block", "sampled", 0.0),
        ("threshold", "greedy", 0.0), ("match", "greedy", 0.0), ("match", "greedy", 0.25), ("match", "greedy", 0.5),
        ("match", "greedy", 0.75)]
    with pytest.raises(ValueError, match=r"invalid cache.k \(a rule with draft_p_min .*\): 8"):
        from_dict(RankConfig, {"md": {"rules": [{"rule": "match", "draft_p_min": 0.5}]}, "cache": {"k": 8},
                               "tracking": {"enabled": False}})
    from_dict(RankConfig, {"md": {"rules": [{"rule": "match"}]}, "cache": {"k": 8}, "tracking": {"enabled": False}})
    small = from_dict(RankConfig, {"cache": {"k": 8}, "tracking": {"enabled": False}})  # the default list
    assert [r.draft_p_min for r in small.md.rules] == [0.0] * 6
    with pytest.raises(ValueError, match="draft_p_min=0.5 needs drafting='greedy'"):
        from_dict(RankConfig, {"md": {"rules": [{"rule": "rejection", "drafting": "sampled", "draft_p_min": 0.5}]},
                               "tracking": {"enabled": False}})
    with pytest.raises(ValueError, match=r"md.rules\[1\].rule': expected one of"):
        from_dict(RankConfig, {"md": {"rules": [{"rule": "mentored"}, {"rule": "lenient"}]},
                               "tracking": {"enabled": False}})


def test_rule_columns_bounds_and_md_above_sglang(rules_run):
    tmp_path, cfg, summary = rules_run
    rows = read_csv(tmp_path / "out" / "ranking.csv")
    assert {(r["rule"], r["drafting"], float(r["draft_p_min"])) for r in rows} == RULES | {("alone", "none", 0.0)}
    alone = [r for r in rows if r["rule"] == "alone"]  # the model drafter alone, once per batch size
    assert [(r["drafter"], r["engines"], r["gamma"]) for r in alone] == [("early_exit:2", "mdboost", "0")] * len(
        cfg.speed.batch_sizes)
    points = {}
    for r in (r for r in rows if r["rule"] != "alone"):
        assert set(r["engines"].split()) <= set(ENGINES) and {"mdboost", "hf"} <= set(r["engines"].split())
        points.setdefault(_key(r), r)
    # budget 0 once per rule; SGLang's and MD's (sampled, greedy) rules once per (f, D > 0); 2 drafters,
    # the floored match (3 floors) only for the model drafter: prompt lookup has no confidence
    per_drafter = 10 + 3 * 2 * 2
    assert len(points) == len(cfg.pool.drafters) * per_drafter - 3 == summary["n_points"] - 1
    assert not any(floor for (drafter, _, _, floor, _, _) in points if drafter.startswith("ngram"))
    for (drafter, rule, drafting, floor, f, budget), r in points.items():
        mean, worst = float(r["achieved_divergence_mean"]), float(r["achieved_divergence_max"])
        assert 0 <= mean <= worst + 1e-12
        if budget == 0:
            assert worst < 1e-9 and f == "none" and math.isclose(float(r["nll_mentored"]), float(r["nll_target"]))
        if rule == "threshold" and budget > 0:
            assert worst <= budget + 1e-9, r  # every cached position within its budget
            # MD on the same greedy drafts accepts at least as often at every position (docs/theory.md
            # section 11); MD on sampled drafts proposes other tokens: no order (reported, not asserted)
            md = points[(drafter, "mentored", "greedy", 0.0, f, budget)]
            assert float(md["md_acceptance"]) >= float(r["md_acceptance"]) - 1e-12
            assert float(md["achieved_divergence_max"]) <= budget + 1e-9
            assert float(r["threshold_acc"]) == pytest.approx(math.exp(-budget) if f == "kl" else 1 - budget)
            assert "sglang" in r["engines"].split() and "vllm" not in r["engines"].split()
        if rule != "threshold":
            assert r["threshold_acc"] == "nan"
        if rule != "mentored" and budget == 0 and drafting == "greedy":
            assert r["engines"].split() == (list(ENGINES) if floor == 0 else ["mdboost", "hf", "llamacpp"])
        if floor:  # a floor changes where the drafter drafts, not the law of a drafted position
            plain = points[(drafter, rule, drafting, 0.0, f, budget)]
            assert r["md_acceptance"] == plain["md_acceptance"]
            speed, plain_speed = float(r["predicted_speedup"]), float(plain["predicted_speedup"])
            if floor == 0.75:  # the tiny random drafter is never that confident: no step drafts
                assert float(r["engine_tokens_per_call"]) == 1.0 < float(plain["engine_tokens_per_call"])
                assert speed != plain_speed
    at = {(r["drafter"], r["rule"], r["drafting"], int(r["gamma"])): r for r in rows
          if r["divergence"] == "none" and float(r["draft_p_min"]) == 0}
    for (drafter, rule, drafting, gamma), r in at.items():  # block verification: its accepted length >= SD's
        if rule == "block":
            sd = at[(drafter, "rejection", "sampled", gamma)]
            assert float(r["md_acceptance"]) == pytest.approx(float(sd["md_acceptance"]))
            assert float(r["engine_mean_accepted_length"]) >= float(sd["engine_mean_accepted_length"]) - 0.01


def test_recommendations_per_engine(rules_run):
    tmp_path, _, summary = rules_run
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    recs = saved["recommendations"]
    assert list(recs) == list(ENGINES) and saved["recommendation"] == summary["recommendation"]
    rows = [r for r in read_csv(tmp_path / "out" / "ranking.csv") if r["batch_size"] == "1"]  # the engines' picks
    for engine, entry in recs.items():
        rec = entry["recommendation"]
        assert rec is not None and entry["reason"] is None  # every engine runs a lossless greedy rule
        match = [r for r in rows if r["drafter"] == rec["drafter"] and r["rule"] == rec["rule"]
                 and r["drafting"] == rec["drafting"] and float(r["draft_p_min"]) == rec["draft_p_min"]
                 and r["divergence"] == rec["divergence"]
                 and float(r["max_divergence"]) == rec["max_divergence"] and int(r["gamma"]) == rec["gamma"]]
        assert len(match) == 1 and engine in match[0]["engines"].split()
        assert rec["predicted_speedup"] == pytest.approx(float(match[0]["predicted_speedup"]))
        assert {"predicted_speedup_lo", "predicted_speedup_hi", "threshold_acc", "verdict"} <= set(rec)
        mine = [r for r in rows if engine in r["engines"].split() and r["quality_ok"] == "True"]
        assert rec["predicted_speedup"] <= max(float(r["predicted_speedup"]) for r in mine) + 1e-12
    # the overall pick is the best of all rows: no engine's is ahead of it when it beats plain decoding
    if summary["recommendation"]["beats_plain_decoding"]:
        assert all(e["recommendation"]["predicted_speedup"] <= summary["recommendation"]["predicted_speedup"] + 1e-12
                   for e in recs.values())


def test_mlflow_child_runs_name_and_tag_their_rule(rules_run):
    from mlflow.tracking import MlflowClient

    tmp_path, cfg, summary = rules_run
    client = MlflowClient(cfg.tracking.tracking_uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    children = [r for r in client.search_runs([exp.experiment_id], max_results=1000)
                if r.data.tags.get("mlflow.parentRunId") == summary["run_id"]]
    assert len(children) == summary["n_points"] == len({c.info.run_name for c in children})  # one name per point
    rows = {_key(r): r for r in read_csv(tmp_path / "out" / "ranking.csv")
            if r["is_best_gamma"] == "True" and r["batch_size"] == "1"}  # nested runs: batch size 1's points
    for child in children:
        prm = child.data.params
        row = rows[_key(prm)]
        assert prm["engines"] == row["engines"]
        assert child.data.metrics["predicted_speedup"] == pytest.approx(float(row["predicted_speedup"]))
        floor = float(prm["draft_p_min"])
        label = f"{prm['rule']}:{prm['drafting']}" + (f":p{floor:g}" if floor else "")
        if prm["rule"] == "alone":
            assert child.info.run_name == f"{prm['drafter']} alone T{float(prm['temperature']):g}"
            continue
        assert child.info.run_name.endswith(label) == ((prm["rule"], prm["drafting"]) != ("mentored", "sampled"))


def test_an_engine_names_its_own_rule_among_equal_lossless_rows():
    from mdboost.ranking.recommend import recommend_engines

    row = {"drafter": "d", "target": "t", "temperature": 1.0, "divergence": "none", "max_divergence": 0.0,
           "gamma": 2, "predicted_speedup": 1.5, "predicted_speedup_lo": 1.2, "predicted_speedup_hi": 1.8,
           "quality_ok": True, "nll_target": 1.0, "nll_mentored": 1.0, "drafting": "greedy",
           "engines": "mdboost hf vllm sglang llamacpp"}
    rows = [dict(row, rule=rule, predicted_speedup=1.5 + 1e-12 * i) for i, rule in
            enumerate(("rejection", "threshold", "match"))]
    rows.append(dict(row, rule="mentored", drafting="sampled", engines="mdboost hf vllm", predicted_speedup=1.4))
    recs = recommend_engines(rows)
    assert {e: recs[e]["recommendation"]["rule"] for e in recs} == {
        "mdboost": "match", "hf": "match", "vllm": "rejection", "sglang": "threshold", "llamacpp": "match"}


def test_frontier_csv_html_and_plots(rules_run):
    """ranking.frontier_rows: every pair and divergence has a frontier of every heuristic, each
    point at least matched by MD at its own per-position divergence (gap >= 0); the HTML report has
    its table; the recommendation's pair has one plot per divergence."""
    tmp_path, cfg, summary = rules_run
    out = summary["paths"]["csv"].parent
    rows = read_csv(out / "frontier.csv")
    pairs = {(r["drafter"], r["target"]) for r in read_csv(out / "ranking.csv")}
    assert {(r["drafter"], r["target"]) for r in rows} == pairs
    assert {r["divergence"] for r in rows} == set(cfg.md.divergences)
    heuristics = {r["rule"] for r in rows if r["gap"] not in ("", "nan")}
    assert {"lenient", "typical", "fuzzy", "threshold", "fly"} <= heuristics
    assert all(float(r["gap"]) >= -1e-9 for r in rows if r["gap"] not in ("", "nan"))
    assert "Frontier" in (out / "ranking.html").read_text()
    rec = summary["recommendation"]
    for div in cfg.md.divergences:
        assert (out / "plots" / f"frontier_{div}.png").is_file(), (rec, div)


def test_drafter_share_of_md_points(rules_run):
    tmp_path, _, _ = rules_run
    by_point = {}
    for r in read_csv(tmp_path / "out" / "ranking.csv"):
        share = float(r["drafter_share"])
        if r["rule"] == "alone":  # every token is the drafter's
            assert share == 1.0
            continue
        if (r["rule"], r["drafting"]) != ("mentored", "sampled"):  # other rules, MD on greedy drafts
            assert math.isnan(share)
            continue
        assert 0 <= share <= 1
        # where the budget covers D_f(p || q) every draft is accepted: the mean acceptance is at least the share
        assert float(r["md_acceptance"]) >= share - 1e-9
        by_point.setdefault((r["drafter"], r["drafting"], r["divergence"]), {})[float(r["max_divergence"])] = share
    assert any(len(shares) > 1 for shares in by_point.values())
    for shares in by_point.values():  # a larger budget covers D_f(p || q) at more positions
        ordered = [shares[b] for b in sorted(shares)]
        assert ordered == sorted(ordered)
