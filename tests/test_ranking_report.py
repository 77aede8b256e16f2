"""Cache folder keys, pair selection and the report writers (no models needed)."""

import pytest

from mdboost.cache.pool_cache import PoolCache
from mdboost.ranking.rows import select_pairs
from pipelines.loader import from_dict
from pipelines.config import RankConfig
from mdboost.ranking.report import COLUMNS, TABLE_COLUMNS, format_table, read_csv, write_csv, write_html


def test_member_cache_dir_keys():
    base = from_dict(RankConfig, {"pool": {"target": "tiny", "drafters": ["ngram:2"]}})
    more = from_dict(RankConfig, {"pool": {"target": "tiny", "drafters": ["ngram:2", "int8"]}})
    rescored = from_dict(RankConfig, {"pool": {"target": "tiny", "drafters": ["ngram:2"]},
                                      "md": {"budgets": [0.3]}, "ranking": {"nll_tolerance": 1.0},
                                      "cache": {"n_jobs": 2}})
    other_k = from_dict(RankConfig, {"pool": {"target": "tiny", "drafters": ["ngram:2"]}, "cache": {"k": 7}})
    for name in ("tiny", "ngram:2"):
        assert base.cache_spec().member_dir(name) == more.cache_spec().member_dir(name) == rescored.cache_spec().member_dir(name)
        assert base.cache_spec().member_dir(name) != other_k.cache_spec().member_dir(name)
    assert base.cache_spec().member_dir("tiny") != base.cache_spec().member_dir("ngram:2")
    assert base.cache_spec().member_dir("ngram:2").name.startswith("ngram_2-")


def test_acceptance_cache_dir_keys():
    base = from_dict(RankConfig, {"pool": {"target": "tiny", "drafters": ["ngram:2"]}})
    sampled = from_dict(RankConfig, {"pool": {"target": "tiny", "drafters": ["ngram:2"]},
                                     "cache": {"acceptance_source": "sampled"}})
    longer = from_dict(RankConfig, {"pool": {"target": "tiny", "drafters": ["ngram:2"]},
                                    "cache": {"acceptance_source": "sampled", "acceptance_max_new_tokens": 32}})
    same = from_dict(RankConfig, {"pool": {"target": "tiny", "drafters": ["ngram:2"]},
                                  "cache": {"source": "sampled", "max_new_tokens": 64}})
    for name in ("tiny", "ngram:2"):
        # the switch never moves the main folders; the acceptance folder is a sampled cache
        assert base.cache_spec().member_dir(name) == sampled.cache_spec().member_dir(name)
        assert sampled.cache_spec().member_dir(name, acceptance=True) != sampled.cache_spec().member_dir(name)
        assert sampled.cache_spec().member_dir(name, acceptance=True) != longer.cache_spec().member_dir(name, acceptance=True)
        assert sampled.cache_spec().member_dir(name, acceptance=True) == same.cache_spec().member_dir(name)


class _Cache:
    def __init__(self, kind, fp):
        self._kind, self.manifest = kind, {"tokenizer_fingerprint": fp}

    def kind(self, name):
        return self._kind


def test_select_pairs():
    pc = PoolCache({"t": _Cache("hf", "v"), "e": _Cache("early_exit", "v"), "n": _Cache("ngram", "v"),
                    "x": _Cache("hf", "other")}, "t")
    assert select_pairs(pc, "target") == [("e", "t"), ("n", "t")]
    assert set(select_pairs(pc, "all")) == {("e", "t"), ("n", "t"), ("t", "e"), ("n", "e")}
    with pytest.raises(ValueError, match="mode"):
        select_pairs(pc, "some")


def _html_rows(page: str) -> list[list[str]]:
    """The cell texts of every ``<tr>`` of an HTML table, header row included."""
    from html.parser import HTMLParser

    class Rows(HTMLParser):
        def __init__(self):
            super().__init__()
            self.rows, self.cell = [], None

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.rows.append([])
            elif tag in ("td", "th"):
                self.cell = ""

        def handle_endtag(self, tag):
            if tag in ("td", "th"):
                self.rows[-1].append(self.cell)
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    parser = Rows()
    parser.feed(page)
    return parser.rows


def _fixed_width_rows(text: str) -> list[list[str]]:
    """Header and body cells of a fixed-width table, cut at the column spans of its dashes line."""
    lines = text.splitlines()
    spans, start = [], None
    for i, ch in enumerate(lines[1] + " "):
        if ch == "-" and start is None:
            start = i
        elif ch != "-" and start is not None:
            spans.append((start, i))
            start = None
    return [[line[a:b].strip() for a, b in spans] for line in [lines[0]] + lines[2:]]


def test_writers_round_trip(tmp_path):
    rows = [{"rank": 1, "drafter": "a", "target": "t", "md_acceptance": 0.5, "extra": float("inf"), "quality_ok": True},
            {"rank": 2, "drafter": "b", "target": "t", "md_acceptance": 0.25, "extra": 1.0, "quality_ok": False}]
    path = write_csv(rows, tmp_path / "r.csv")
    back = read_csv(path)
    assert list(back[0]) == ["rank", "drafter", "target", "md_acceptance", "quality_ok", "extra"]
    assert [float(r["md_acceptance"]) for r in back] == [0.5, 0.25]
    assert [float(r["extra"]) for r in back] == [float("inf"), 1.0] and [int(r["rank"]) for r in back] == [1, 2]
    assert not list(tmp_path.glob(".*tmp"))  # atomic write leaves no temp file
    head, *body = _html_rows(write_html(rows, tmp_path / "r.html").read_text())
    assert head == list(back[0]) and len(body) == 2
    assert [dict(zip(head, r))["drafter"] for r in body] == ["a", "b"]
    assert [float(dict(zip(head, r))["md_acceptance"]) for r in body] == [0.5, 0.25]
    head, *body = _fixed_width_rows(format_table(rows, top=1))
    assert head == [label for _, label in TABLE_COLUMNS] and len(body) == 1
    shown = dict(zip(head, body[0]))
    assert int(shown["rank"]) == 1 and shown["drafter"] == "a" and float(shown["MD acc"]) == 0.5
    assert COLUMNS[:4] == ["batch_size", "rank", "drafter", "target"]
