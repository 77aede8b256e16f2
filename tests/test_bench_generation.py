"""The resumable generation benchmark (``bench/generation.py``) on tiny random models.

Checks the grid plan against an independent enumeration, same-process references, resume,
interrupted runs and the time cap. Nothing is timed here: only the bookkeeping is asserted.
"""

import itertools
import json
import re

import pytest
import torch

from bench import generation as gen

TINY = ["--target", "tiny", "--drafters", "ngram:3,early_exit:2", "--gammas", "2", "--budgets", "0.05",
        "--temperatures", "1.0", "--prompts", "1", "--new-tokens", "4", "--no-write"]


def test_full_grid_plan_matches_the_generation_grid():
    chunks = gen.plan_chunks(gen.DEFAULT_DRAFTERS, [2, 4, 6], [0.01, 0.05, 0.2], [1.0, 0.7])
    cells = [spec for chunk in chunks for spec in chunk.cells]
    expected = {gen.Spec(mode, t, d, g, b) for d, g, t in itertools.product(gen.DEFAULT_DRAFTERS, [2, 4, 6], [1.0, 0.7])
                for mode, b in [("sd", 0.0), ("md", 0.01), ("md", 0.05), ("md", 0.2)]}
    expected |= {gen.Spec("hf_ar", 0.0), gen.Spec("hf_lookup", 0.0, "ngram:3", 4), gen.Spec("sd", 0.0, "ngram:3", 4, 0.0),
                 gen.Spec("hf_assisted", 0.0, "tuned:12", 4), gen.Spec("sd", 0.0, "tuned:12", 4, 0.0)}
    assert len(cells) == len(set(cells)) == len(expected) == 245
    assert set(cells) == expected
    assert chunks[0].temperature == 0.0 and {s.mode for s in chunks[0].cells} >= set(gen.HF_MODES)
    names = [c.name for c in chunks[1:]]
    assert names[0] == "ngram:3 T=1.0"
    kinds = [gen.parse_drafter(n.split()[0])[0] for n in names]
    assert kinds.index("int8") > max(i for i, k in enumerate(kinds) if k in ("ngram", "tuned"))
    tier0 = [n for n in names if n.startswith(("ngram", "tuned"))]
    assert all(n.endswith("T=1.0") for n in tier0[:5]) and all(n.endswith("T=0.7") for n in tier0[5:])


def test_chunk_specs_put_references_first():
    chunk = gen.Chunk("x", 1.0, (gen.Spec("md", 1.0, "int8", 4, 0.05), gen.Spec("hf_lookup", 0.0, "ngram:3", 4)))
    specs = gen.chunk_specs(chunk)
    assert specs[0] == gen.Spec("ar", 1.0) and len(specs) == len(set(specs))
    for spec in chunk.cells:
        assert all(specs.index(dep) < specs.index(spec) for _, dep in gen.dependencies(spec))


def test_run_interleaved_stops_at_deadline():
    calls = []

    def fn(ids, max_new):
        calls.append(ids)
        return torch.tensor([1, 2]), None

    configs = [("a", fn), ("b", fn)]
    assert gen.run_interleaved(configs, [0, 1, 2], torch.device("cpu"), deadline=0.0) is None
    assert calls == [0, 0]  # abandoned after the first prompt
    res = gen.run_interleaved(configs, [0, 1], torch.device("cpu"))
    assert res["a"]["tokens"] == 4 and res["b"]["outs"] == [[1, 2], [1, 2]]


def numbers(pattern: str, text: str) -> list[float]:
    """The groups of the first match of ``pattern`` in ``text``, as numbers."""
    match = re.search(pattern, text)
    assert match, (pattern, text)
    return [float(g) for g in match.groups()]


def markdown_rows(text: str) -> list[dict[str, str]]:
    """Every body row of every markdown table in ``text``, keyed by its table's header."""
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(line) <= set("|-"):
            rows.append(dict(zip(header, cells)))
    return rows


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    path = tmp_path_factory.mktemp("cells") / "cells.json"
    gen.main(TINY + ["--cells", str(path)])
    return path


def test_cells_have_same_process_references(measured):
    cells = gen.load_cells(measured)
    assert {c["mode"] for c in cells.values()} == {"hf_ar", "hf_lookup", "hf_assisted", "sd", "md"}
    assert len(cells) == 5 + 4  # peer chunk + (SD, MD) for each drafter at T=1.0
    for cell in cells.values():
        ar = cell["references"]["ar"]
        assert cell["speedup_vs_ar"] == pytest.approx(cell["tok_s"] / ar["tok_s"])
        assert cell["torch_threads"] == 1 and cell["prompts"] == 1 and cell["new_tokens"] == 4
        if cell["mode"] == "md":
            assert "sd" in cell["references"] and cell["mean_kl"] <= cell["max_kl"] <= 0.05 + 1e-6
        if cell["mode"] in ("sd", "md"):
            rates = [r for r in cell["acceptance_rate_per_position"] if r is not None]
            assert all(0 <= r <= 1 for r in rates) and cell["time_target"] <= cell["seconds"]
        if cell["mode"] in gen.HF_MODES:
            assert cell["identical_to_engine"] is True  # greedy lossless decoding equals greedy AR


def test_resume_measures_only_missing_cells(measured, tmp_path, monkeypatch):
    path = tmp_path / "cells.json"
    path.write_text(measured.read_text())
    before = gen.load_cells(path)
    gen.main(TINY + ["--cells", str(path), "--resume", "--budgets", "0.05,0.2"])
    after = gen.load_cells(path)
    new = set(after) - set(before)
    assert {(after[k]["mode"], after[k]["budget"]) for k in new} == {("md", 0.2)} and len(new) == 2
    assert all(after[k] == before[k] for k in before)  # measured cells are kept as they were
    assert all(after[k]["run_id"] != next(iter(before.values()))["run_id"] for k in new)
    text = path.read_text()
    monkeypatch.setattr(gen, "build_pool", lambda *a, **k: pytest.fail("resume rebuilt the pool"))
    gen.main(TINY + ["--cells", str(path), "--resume", "--budgets", "0.05,0.2"])
    assert path.read_text() == text


def test_interrupted_run_keeps_finished_chunks(tmp_path, monkeypatch):
    path, real, calls = tmp_path / "cells.json", gen.measure_chunk, []

    def flaky(chunk, *args, **kwargs):
        calls.append(chunk.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(chunk, *args, **kwargs)

    monkeypatch.setattr(gen, "measure_chunk", flaky)
    with pytest.raises(KeyboardInterrupt):
        gen.main(TINY + ["--cells", str(path)])
    cells = gen.load_cells(path)
    assert {c["chunk"] for c in cells.values()} == {calls[0]}
    assert [p.name for p in tmp_path.iterdir()] == ["cells.json"]  # no temporary file left behind


def test_report_uses_embedded_references(measured):
    cells = gen.load_cells(measured)
    args = gen.parse_args(TINY + ["--cells", str(measured)])
    sd = next(c for c in cells.values() if c["mode"] == "sd" and c["drafter"] == "ngram:3" and c["temperature"] == 1.0)
    md = next(c for c in cells.values() if c["mode"] == "md" and c["drafter"] == "ngram:3")
    sd["tok_s"] = 1e9  # another process's SD must not enter the MD / SD ratio
    text = gen.report(cells, args)
    row = next(r for r in markdown_rows(text) if r["drafter"] == "ngram:3" and r["gamma"] == "2")
    assert float(row["MD 0.05 / SD"].rstrip("x")) == pytest.approx(md["tok_s"] / md["references"]["sd"]["tok_s"], abs=0.005)
    # grid cells among the 9: hf_ar, hf_lookup + its greedy SD, ngram:3 SD and MD at T=1.0, gamma 2
    assert numbers(r"grid coverage at [^:]*: \*\*(\d+)/(\d+)\*\* cells", text) == [5, 245]


def test_bad_inputs_raise(tmp_path):
    with pytest.raises(ValueError, match="--threads"):
        gen.parse_args(TINY + ["--threads", "0"])
    with pytest.raises(ValueError, match="--gammas"):
        gen.parse_args(TINY + ["--gammas", "0"])
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="bad.json"):
        gen.load_cells(bad)
    bad.write_text(json.dumps({"format": "other", "cells": []}))
    with pytest.raises(ValueError, match="format"):
        gen.load_cells(bad)


def test_merge_cells_keeps_other_writers_cells(tmp_path):
    path = tmp_path / "cells.json"
    gen.save_cells(path, {"a": {"key": "a", "v": 1}})
    other = {"b": {"key": "b", "v": 2}}
    merged = gen.merge_cells(path, other)  # written by a second process meanwhile
    assert gen.load_cells(path) == merged == {"a": {"key": "a", "v": 1}, "b": {"key": "b", "v": 2}}
    assert gen.merge_cells(path, {"a": {"key": "a", "v": 3}})["a"]["v"] == 3  # same key: the new cell wins
    assert [p.name for p in tmp_path.iterdir()] == ["cells.json"]


def test_shards_partition_the_chunks():
    chunks = gen.plan_chunks(gen.DEFAULT_DRAFTERS, [2, 4, 6], [0.05], [1.0, 0.7])
    parts = [gen.shard(chunks, gen.parse_shard(f"{i}/3")) for i in range(3)]
    assert sorted((c.name for part in parts for c in part), key=[c.name for c in chunks].index) == [c.name for c in chunks]
    assert parts[0][0] == chunks[0] and gen.shard(chunks, None) == chunks
    for bad in ("3/3", "1", "a/b", "-1/2"):
        with pytest.raises(ValueError, match="--shard must be I/N"):
            gen.parse_args([f"--shard={bad}"])


def test_report_counts_cells_measured_under_load(measured):
    cells = gen.load_cells(measured)
    args = gen.parse_args(TINY + ["--cells", str(measured)])
    assert all(c["loadavg"] >= 0 and c["shards"] == 1 for c in cells.values())
    assert all(c["commit"] is None or isinstance(c["commit"], str) for c in cells.values())
    first, second, third, *rest = cells
    cells[first]["loadavg"], cells[second]["loadavg"], cells[third]["shards"] = 1.9, 0.2, 2
    for key in rest:
        cells[key]["loadavg"] = 0.5
    del cells[rest[0]]["loadavg"], cells[rest[0]]["shards"]
    text = gen.report(cells, args)
    assert numbers(r"_Load: (\d+) of the (\d+) cells", text) == [2, len(cells) - 1]
    assert numbers(r"(\d+) older cells have no record", text) == [1]


def test_md_vs_sd_line_counts_wins_and_geometric_means_per_kind():
    from bench._generation_report import md_vs_sd_line

    def cell(drafter, md_tok_s, sd_tok_s, budget=0.05):
        return {"mode": "md", "budget": budget, "drafter": drafter, "tok_s": md_tok_s,
                "references": {"sd": {"tok_s": sd_tok_s}}}

    cells = [cell("ngram:3", 2.0, 1.0), cell("early_exit:12", 1.0, 2.0), cell("early_exit:18", 4.0, 2.0),
             cell("ngram:3", 9.0, 1.0, budget=0.2), {"mode": "sd", "budget": 0.0, "drafter": "ngram:3"}]
    # ratios 2, 0.5, 2: geometric mean (2 * 0.5 * 2) ** (1/3) = 2 ** (1/3) = 1.260; early exits: 1.000
    line = md_vs_sd_line(cells)
    wins, n, mean = numbers(r"\*\*faster in (\d+) of (\d+), geometric mean ([\d.]+)x\*\*", line)
    assert (wins, n) == (2, 3) and mean == pytest.approx(2 ** (1 / 3), abs=5e-4)
    by_kind = line[line.index("(by drafter kind:"):]
    kinds = {kind: (int(w), int(k), float(m))
             for kind, w, k, m in re.findall(r"(\w+): faster in (\d+) of (\d+), geometric mean ([\d.]+)x", by_kind)}
    assert list(kinds) == ["ngram", "early_exit"]  # drafter priority order
    assert kinds["ngram"] == (1, 1, 2.0) and kinds["early_exit"] == (1, 2, 1.0)
    assert numbers(r"lowest ([\d.]+)x", line) == [0.5]
    assert md_vs_sd_line(cells[3:]) is None
