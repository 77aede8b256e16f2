"""Cache folder keys, pair selection and the report writers (no models needed)."""

import pytest

from mdboost.cache.pool_cache import PoolCache
from mdboost.ranking.rows import select_pairs
from pipelines.config import RankConfig, from_dict
from mdboost.ranking.report import COLUMNS, format_table, read_csv, write_csv, write_html


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


def test_writers_round_trip(tmp_path):
    rows = [{"rank": 1, "drafter": "a", "target": "t", "md_acceptance": 0.5, "extra": float("inf"), "quality_ok": True},
            {"rank": 2, "drafter": "b", "target": "t", "md_acceptance": 0.25, "extra": 1.0, "quality_ok": False}]
    path = write_csv(rows, tmp_path / "r.csv")
    back = read_csv(path)
    assert list(back[0]) == ["rank", "drafter", "target", "md_acceptance", "quality_ok", "extra"]
    assert back[1]["md_acceptance"] == "0.25" and back[0]["extra"] == "inf"
    assert not list(tmp_path.glob(".*tmp"))  # atomic write leaves no temp file
    html = write_html(rows, tmp_path / "r.html").read_text()
    assert html.count("<tr>") == 3 and "<td>a</td>" in html
    table = format_table(rows, top=1).splitlines()
    assert len(table) == 3 and "MD acc" in table[0] and table[2].split()[0] == "1"
    assert COLUMNS[:3] == ["rank", "drafter", "target"]
