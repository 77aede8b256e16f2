"""``ranking.html`` (mdboost.ranking.page) and the reason line of the verdict (mdboost.ranking.breakeven)."""

from __future__ import annotations

import html
import re

import pytest

from mdboost.ranking.breakeven import reason_line
from mdboost.ranking.page import TOP_COLUMNS, write_report


def _row(rank: int, drafter: str, speedup: float, **kw) -> dict:
    return {"rank": str(rank), "drafter": drafter, "temperature": "0.7", "rule": "mentored", "drafting": "sampled",
            "divergence": "kl", "max_divergence": "0.2", "gamma": "4", "predicted_speedup": str(speedup),
            "predicted_speedup_lo": str(speedup - 0.1), "predicted_speedup_hi": str(speedup + 0.1),
            "engine_acceptance": "0.61", "engine_tokens_per_call": "2.5", "cost_ratio": "0.3", "verify_cost": "1.4",
            "quality_ok": "True", **kw}


def _page(tmp_path, rows, **kw):
    args = dict(title="mdboost ranking: t", verdict="recommended: int8 -> t <b>", reason="int8 at gamma 4 makes ...",
                costs="costs measured on CPU X", snippet="print('<hi>')", rows=rows, top=2, n_points=len(rows),
                plots={"Predicted speedup per drafter": "plots/speedup_by_drafter.png", "Acceptance": "plots/a.png"},
                full_table="ranking_full.html")
    return write_report(tmp_path / "ranking.html", **{**args, **kw}).read_text()


def test_the_page_leads_with_the_verdict_and_shows_the_top_points_with_a_glossary(tmp_path):
    rows = [_row(1, "int8", 1.4), _row(2, "ngram:3", 1.1, max_divergence="0", divergence="none"),
            _row(3, "early_exit:12", 0.9)]
    text = _page(tmp_path, rows)
    order = [text.index(s) for s in ("class='verdict'", "Why:", "Run it", "speedup_by_drafter.png", "class='points'",
                                     "ranking_full.html", "class='glossary'", "plots/a.png")]
    assert order == sorted(order)
    table = text[text.index("<table"):text.index("</table>")]
    assert table.count("<tr>") == 3  # header + top 2
    assert "int8" in table and "ngram:3" in table and "early_exit:12" not in table
    assert "1.40x [1.30, 1.50]" in table and "0 (lossless)" in table and "kl &lt;= 0.2" in table
    headers = re.findall(r"<th title='[^']+'>([^<]+)</th>", table)
    assert headers == [html.escape(label) for label, _ in TOP_COLUMNS.values()]
    assert all(f"<dt>{html.escape(label)}</dt>" in text for label, _ in TOP_COLUMNS.values())
    assert "recommended: int8 -&gt; t &lt;b&gt;" in text and "print(&#x27;&lt;hi&gt;&#x27;)" in text  # escaped


def test_the_page_refuses_a_bad_top(tmp_path):
    with pytest.raises(ValueError, match="top must be a positive int, got 0"):
        _page(tmp_path, [_row(1, "int8", 1.4)], top=0)


def test_the_reason_adds_up_the_measured_costs_of_a_call():
    row = {"drafter": "early_exit:12", "gamma": "2", "engine_tokens_per_call": "1.9", "engine_acceptance": "0.55",
           "cost_ratio": "0.62", "verify_cost": "2.54", "md_overhead": "0.08", "max_divergence": "0"}
    line = reason_line(row)
    assert "1.90 tokens per target call" in line and "0.55 of its drafts accepted" in line
    assert "a drafted call costs 3.78 target steps: verifying 3 tokens 2.54, drafting 2 x 0.62" in line
    assert "solving MD" not in line  # lossless: no solve
    assert "solving MD 0.08" in reason_line(dict(row, max_divergence="0.2"))
    assert "3.86 target steps" in reason_line(dict(row, max_divergence="0.2"))
