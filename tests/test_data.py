"""Data loading: bundled HumanEval, local files, deterministic held-out split, encoding."""

import json
import re

import pytest
import torch

from mdboost.data import (dataset_fingerprint, encode_prompt, encode_record, format_prompt, is_heldout, load_texts,
                          sample_order, sample_summary, split_records, TextSource)
from mdboost.models.tiny import tiny_tokenizer


@pytest.fixture(scope="module")
def humaneval():
    return load_texts("humaneval")


def test_humaneval_records(humaneval):
    assert len(humaneval) == 164
    first = humaneval[0]
    assert first["id"] == "HumanEval/0" and first["prompt"].startswith("from typing import List")
    assert "return False" in first["reference"] and first["entry_point"] == "has_close_elements"
    assert len({r["id"] for r in humaneval}) == 164


def test_split_is_a_deterministic_partition(humaneval):
    cache, held = load_texts(split="cache"), load_texts(split="heldout")
    ids_c, ids_h = {r["id"] for r in cache}, {r["id"] for r in held}
    assert not ids_c & ids_h and ids_c | ids_h == {r["id"] for r in humaneval}
    assert 0.1 < len(held) / 164 < 0.4  # fraction 0.25 (a hash split, so approximately)
    assert [r["id"] for r in split_records(humaneval)[1]] == [r["id"] for r in held]
    assert is_heldout("HumanEval/3") == is_heldout("HumanEval/3")
    assert is_heldout("x", 1.0) and not is_heldout("x", 0.0)
    assert [r["id"] for r in load_texts(split="cache", limit=3)] == [r["id"] for r in cache[:3]]


def test_local_jsonl_and_text(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"task_id": f"t{i}", "question": f"q{i}", "answer": f"a{i}"}) for i in range(3)))
    recs = load_texts(str(path), prompt_field="question", reference_field="answer")
    assert recs == [{"id": f"t{i}", "prompt": f"q{i}", "reference": f"a{i}"} for i in range(3)]
    text = tmp_path / "t.txt"
    text.write_text("hello world\nsecond line\n")
    assert [r["reference"] for r in load_texts(str(text))] == ["hello world", "second line"]
    with pytest.raises(ValueError, match="reference_field"):
        load_texts(str(path), prompt_field="question", reference_field="nope")


def test_an_empty_or_unreadable_file_names_the_source(tmp_path):
    for name, text in (("e.jsonl", ""), ("e.txt", ""), ("h.csv", "prompt,reference\n"), ("bad.jsonl", "{not json\n")):
        path = tmp_path / name
        path.write_text(text)  # were StopIteration, DatasetGenerationError, "Instruction 'train' corresponds to no data"
        with pytest.raises(ValueError, match=f"^source {re.escape(repr(str(path)))} (is an empty file|cannot be read|holds no)"):
            load_texts(str(path))


@pytest.mark.parametrize("field, value", [("limit", 0), ("limit", 2.5), ("max_tokens", 1), ("max_tokens", None),
                                          ("heldout_fraction", 2), ("heldout_fraction", "x")])
def test_text_source_checks_its_fields_when_built(field, value):
    # were accepted, failing (or, for heldout_fraction with split "all", never) only when a build loaded the records
    with pytest.raises(ValueError, match=f"^{field} must be .*got {re.escape(repr(value))}$"):
        TextSource(**{field: value})


def test_bad_arguments():
    with pytest.raises(ValueError, match="split"):
        load_texts(split="train")
    with pytest.raises(ValueError, match="limit"):
        load_texts(limit=0)
    for bad in (float("nan"), float("inf"), True, "3"):  # were int()'s ValueError / OverflowError, True one record
        with pytest.raises(ValueError, match=f"^limit must be a positive integer or None, got {re.escape(repr(bad))}$"):
            load_texts(limit=bad)
    assert len(load_texts(limit=2.0)) == 2  # was a slice TypeError after the check let 2.0 through
    with pytest.raises(ValueError, match="source"):
        load_texts("/no/such/dataset-name-for-sure")
    with pytest.raises(ValueError, match="fraction"):
        is_heldout("a", 1.5)


def test_encode_record_boundary_and_truncation():
    tok = tiny_tokenizer()
    record = {"id": "a", "prompt": "def f(x):\n", "reference": "    return x\n"}
    ids, start = encode_record(tok, record)
    assert tok.decode(ids[:start]) == record["prompt"] and tok.decode(ids[start:]) == record["reference"]
    ids, start = encode_record(tok, record, max_tokens=12)  # prompt keeps its last 6 tokens
    assert ids.numel() == 12 and tok.decode(ids[:start]) == "f(x):\n" and tok.decode(ids[start:]) == "    re"
    ids, start = encode_record(tok, {"id": "b", "prompt": "", "reference": "abc"})
    assert start == 1 and ids.tolist() == tok("abc")["input_ids"]
    with pytest.raises(ValueError, match="max_tokens"):
        encode_record(tok, record, max_tokens=1)
    with pytest.raises(ValueError, match="^max_tokens must be an integer >= 2 or None, got nan$"):
        encode_record(tok, record, max_tokens=float("nan"))  # was int()'s "cannot convert float NaN to integer"
    assert torch.equal(encode_record(tok, record, max_tokens=12.0)[0], encode_record(tok, record, max_tokens=12)[0])


def test_chat_template_formatting():
    tok = tiny_tokenizer()
    assert format_prompt(tok, "hi") == "hi"
    assert format_prompt(tok, "hi", chat_template=True) == "<s>user: hi\n<s>assistant: "
    assert format_prompt(tok, "hi", chat_template=True, system="be brief").startswith("<s>system: be brief\n")
    ids = encode_prompt(tok, "hi", chat_template=True)
    assert ids.dtype == torch.long and ids[0] == tok.bos_token_id


def test_dataset_fingerprint_tracks_content():
    a = [{"id": "1", "prompt": "p", "reference": "r"}]
    b = [{"id": "1", "prompt": "p", "reference": "s"}]
    assert dataset_fingerprint(a) == dataset_fingerprint([dict(a[0])]) != dataset_fingerprint(b)


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


CATEGORIES = [("writing", 30), ("math", 10), ("coding", 20)]  # a file sorted by category, as MT-bench's is
SORTED = [{"id": f"{c}-{i}", "prompt": f"{c} question {i}", "reference": "answer", "category": c}
          for c, n in CATEGORIES for i in range(n)]


def test_limit_is_a_seeded_random_sample_not_the_head(tmp_path):
    path = _write(tmp_path / "sorted.jsonl", SORTED)
    head = load_texts(path, limit=10, sample="head")
    assert [r["id"] for r in head] == [f"writing-{i}" for i in range(10)]  # the head: one category
    assert TextSource(source=path, limit=10).sample == "random"  # a run's default
    sample = load_texts(path, limit=10, sample="random")
    assert len({r["category"] for r in sample}) > 1
    again = lambda **kw: [r["id"] for r in load_texts(path, sample="random", **kw)]  # noqa: E731
    assert [r["id"] for r in sample] == again(limit=20)[:10]  # any prefix is a sample
    assert [r["id"] for r in sample] == again(limit=10)  # seeded
    assert {r["id"] for r in sample} != set(again(limit=10, seed=1))
    # the order is the records' (by id), not the file's: a shuffled file gives the same sample
    shuffled = _write(tmp_path / "shuffled.jsonl", [SORTED[i] for i in torch.randperm(60).tolist()])
    assert [r["id"] for r in load_texts(shuffled, limit=10, sample="random")] == [r["id"] for r in sample]
    # a record added to the file never reorders the others
    grown = _write(tmp_path / "grown.jsonl", SORTED + [{"id": "new", "prompt": "p", "reference": "r", "category": "math"}])
    assert [r["id"] for r in load_texts(grown, sample="random") if r["id"] != "new"] == again()


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_every_prefix_of_a_stratified_sample_keeps_each_category_s_share(tmp_path, seed):
    path = _write(tmp_path / "sorted.jsonl", SORTED)
    order = load_texts(path, sample="random", stratify="category", seed=seed)
    assert sorted(r["id"] for r in order) == sorted(r["id"] for r in SORTED)
    for n in range(1, len(order) + 1):
        for category, size in CATEGORIES:
            count = sum(r["category"] == category for r in order[:n])
            assert abs(count - n * size / len(SORTED)) < 1, (n, category, count)
    # the sample within a category is the unstratified rank order of its records
    within = [r["id"] for r in order if r["category"] == "math"]
    ranked = [SORTED[i]["id"] for i in sample_order(SORTED, seed) if SORTED[i]["category"] == "math"]
    assert within == ranked


def test_stratified_prefixes_stay_near_their_shares_for_any_strata():
    rng = torch.Generator().manual_seed(0)
    worst = 0.0
    for trial in range(300):
        sizes = (torch.randint(1, 25, (int(torch.randint(1, 9, (1,), generator=rng)),), generator=rng)).tolist()
        records = [{"id": f"{s}-{i}", "k": s} for s, size in enumerate(sizes) for i in range(size)]
        kinds = [records[i]["k"] for i in sample_order(records, trial, "k")]
        for n in range(1, len(kinds) + 1):
            for s, size in enumerate(sizes):
                worst = max(worst, abs(kinds[:n].count(s) - n * size / len(records)))
    assert worst < 2  # within about one record (greedy turns do not always stay below one)


def test_the_split_comes_before_the_sample_and_the_summary_names_it(tmp_path):
    path = _write(tmp_path / "sorted.jsonl", SORTED)
    source = TextSource(source=path, limit=12, stratify="category")
    records = source.load()
    assert not any(is_heldout(r["id"]) for r in records)
    held = source.load("heldout", 5)
    assert all(is_heldout(r["id"]) for r in held)
    summary = sample_summary(records, source)
    assert summary == {"split": "cache", "sample": "random", "seed": 0, "stratify": "category",
                       "ids": [r["id"] for r in records],
                       "strata": {c: sum(r["category"] == c for r in records) for c, _ in sorted(CATEGORIES)}}
    assert sample_summary(held, source, split="heldout")["split"] == "heldout"


def test_sampling_arguments_are_checked(tmp_path):
    path = _write(tmp_path / "sorted.jsonl", SORTED[:3] + [{"id": "x", "prompt": "p", "reference": "r"}])
    with pytest.raises(ValueError, match=r"stratify='category' is not a field of record 'x'"):
        load_texts(path, sample="random", stratify="category")
    with pytest.raises(ValueError, match=r"sample must be one of \('random', 'head'\), got 'first'"):
        load_texts(path, sample="first")
    with pytest.raises(ValueError, match=r"stratify='category' needs sample='random'"):
        load_texts(path, sample="head", stratify="category")
    with pytest.raises(ValueError, match=r"sample must be one of"):
        TextSource(sample="all")
    with pytest.raises(ValueError, match=r"stratify must be a field name"):
        TextSource(sample="head", stratify="category")
