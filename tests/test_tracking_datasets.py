"""mdboost.tracking.datasets: records as an MLflow dataset, its source, name and digest."""

from __future__ import annotations

import hashlib
import json

import pytest

from mdboost.data import TextSource
from mdboost.tracking.datasets import DIGEST_CHARS, records_dataset

RECORDS = [{"id": "a", "prompt": "def f():", "reference": " return 1", "extra": 3},
           {"id": "b", "prompt": "x =", "reference": " 2"}]


def _sha(records):
    return hashlib.sha256(json.dumps([[r["id"], r["prompt"], r["reference"]] for r in records],
                                     ensure_ascii=False).encode()).hexdigest()


def test_a_local_file_is_the_source_and_the_digest_is_the_content_fingerprint(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    ds = records_dataset(RECORDS, TextSource(source=str(path)), "cache")
    assert ds.name == "prompts:cache" and ds.digest == _sha(RECORDS)[:DIGEST_CHARS]
    assert ds.source._get_source_type() == "local" and ds.source.uri == path.resolve().as_uri()
    assert list(ds.df.columns) == ["id", "prompt", "reference"] and ds.df["id"].tolist() == ["a", "b"]
    assert records_dataset(RECORDS[::-1], TextSource(source=str(path)), "cache").digest != ds.digest  # order matters


def test_a_hub_name_is_a_hugging_face_source():
    ds = records_dataset(RECORDS, TextSource(source="openai/openai_humaneval", split="heldout"), "heldout")
    assert ds.source._get_source_type() == "hugging_face" and ds.source.path == "openai/openai_humaneval"
    assert ds.name == "openai/openai_humaneval:heldout"


@pytest.mark.parametrize("records, split, name", [([], "cache", "records"), (RECORDS, "", "split"),
                                                  (RECORDS, None, "split")])
def test_bad_input_names_the_argument(records, split, name):
    with pytest.raises(ValueError, match=name):
        records_dataset(records, TextSource(), split)
