"""Build the top-k logit cache of a model pool over a dataset (parallel, resumable, atomic).

For every pool member and every cached position (each token of the reference / sampled
continuation, predicted from its prefix) the cache stores: the top-``k`` token ids and logits,
the full-vocabulary ``logsumexp`` (so kept probabilities are exact), the true next token's
logit and the full-vocabulary logit sum (boosting's ``y^T h = h_true - (S - h_true)/(n - 1)``,
``docs/boosting.md``, "Label coding"); optionally the full logits (fp16); for ``ngram`` members their
proposals. Logits are those of temperature 1; ``temperatures`` adds the exact
``logsumexp(logits / T)`` per temperature (the top-k set is the same for every ``T > 0``).

Layout: ``manifest.json``, ``tokens.safetensors`` (the token sequences and per-row targets,
shared by all members) and one ``<member>-<shard>.safetensors`` per member and shard of
``shard_size`` sequences. Jobs (member, shard) run through joblib with a configurable backend;
process-based backends (loky, dask) rebuild members in the workers from ``pool.recipe``.

Shared sampled continuations: :func:`sample_sequences` samples the target's continuations once
into a token file; ``build_cache(..., sequences=<that file>)`` then teacher-forces a member on
exactly those sequences (one forward pass per sequence, no sampling) and records the file's
SHA-256 in the manifest, so folders built on other sequences never pass as the same build.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import torch

from mdboost.data import dataset_fingerprint, encode_prompt, encode_record

from .manifest import (FORMAT, TOKENS, atomic_save_tensors, code_version, finished_digest, lse_key, read_manifest,
                       shard_name, write_manifest)

SOURCES = ("reference", "sampled")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_WORKER_MEMBERS: dict = {}


def _check_args(k, dtype, source, shard_size, temperatures):
    if int(k) != k or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    if int(shard_size) != shard_size or shard_size < 1:
        raise ValueError(f"shard_size must be a positive integer, got {shard_size!r}")
    for t in temperatures:
        if not t > 0:
            raise ValueError(f"temperatures must be > 0 (logits are cached at temperature 1), got {t!r}")


def sample_continuation(model, prompt: torch.Tensor, max_new_tokens: int, temperature: float,
                        generator: torch.Generator, eos_token_id: int | None = None) -> torch.Tensor:  # [P] -> [N]
    """Sample up to ``max_new_tokens`` tokens from ``model`` after ``prompt`` (stops after EOS).

    The engine's AR loop (:func:`mdboost.engine.generate` without a drafter): KV-cached, one
    multinomial draw per token from ``generator`` (a CPU generator draws on the CPU whatever
    the model's device); ``temperature=0`` is greedy and draws nothing.
    """
    from mdboost.engine import GenerationSettings, generate

    device = next(model.parameters()).device
    settings = GenerationSettings(max_new_tokens=max_new_tokens, temperature=temperature, eos_token_id=eos_token_id)
    out = generate(model, prompt.to(device)[None], settings, generator=generator)
    return out.sequences[0, prompt.numel(): prompt.numel() + int(out.num_new_tokens[0])].cpu()


def _record_seed(seed: int, record_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{record_id}".encode()).digest()[:8], "big") >> 1


def build_sequences(pool, records, *, source, chat_template, system, max_tokens, max_new_tokens,
                    sample_temperature, seed) -> dict:
    """The token tensors shared by every member (``tokens.safetensors``)."""
    tok = pool.target.tokenizer
    seqs, starts = [], []
    for record in records:
        if source == "reference":
            ids, start = encode_record(tok, record, chat_template, system, max_tokens)
        else:
            prompt = encode_prompt(tok, record["prompt"], chat_template, system)
            if prompt.numel() == 0:
                raise ValueError(f"record {record['id']!r} has an empty prompt; source='sampled' needs one")
            prompt = prompt[-max(max_tokens - max_new_tokens, max_tokens // 2):]  # room for the continuation
            gen = torch.Generator().manual_seed(_record_seed(seed, record["id"]))
            cont = sample_continuation(pool.target.model, prompt, max_new_tokens, sample_temperature, gen, tok.eos_token_id)
            ids, start = torch.cat([prompt, cont])[:max_tokens], prompt.numel()
        seqs.append(ids)
        starts.append(min(start, ids.numel()))
    lengths = torch.tensor([s.numel() for s in seqs], dtype=torch.long)
    rows = torch.tensor([s.numel() - st for s, st in zip(seqs, starts)], dtype=torch.long)
    zero = torch.zeros(1, dtype=torch.long)
    true_next = [s[st:] for s, st in zip(seqs, starts)]
    return {
        "ids": torch.cat(seqs) if seqs else torch.empty(0, dtype=torch.long),
        "seq_offsets": torch.cat([zero, lengths.cumsum(0)]),
        "starts": torch.tensor(starts, dtype=torch.long),
        "row_offsets": torch.cat([zero, rows.cumsum(0)]),
        "true_next": torch.cat(true_next) if true_next else torch.empty(0, dtype=torch.long),
    }


def sample_sequences(pool, records, path: str | os.PathLike, *, chat_template: bool = False, system=None,
                     max_tokens: int = 512, max_new_tokens: int = 128, sample_temperature: float = 1.0,
                     seed: int = 0, progress: bool = False) -> tuple[Path, str]:
    """Sample the target's continuations of ``records`` once into the token file ``path``.

    The file holds the shared token tensors of :func:`build_sequences` with ``source="sampled"``
    (record ``i`` sampled with a ``torch.Generator`` seeded from ``seed`` and its id), written
    atomically with a ``.sha256`` sidecar. A finished file is reused as is.

    Returns
    -------
    (Path, str)
        ``path`` and the file's SHA-256 (pass ``sequences=path`` to :func:`build_cache`).
    """
    from tqdm.auto import tqdm

    path = Path(path)
    digest = finished_digest(path)
    if digest is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        bar = tqdm(records, desc="sampling continuations", disable=not progress or bool(os.environ.get("TQDM_DISABLE")))
        tokens = build_sequences(pool, bar, source="sampled", chat_template=chat_template, system=system,
                                 max_tokens=max_tokens, max_new_tokens=max_new_tokens,
                                 sample_temperature=sample_temperature, seed=seed)
        digest = atomic_save_tensors(tokens, path)
    return path, digest


def _load_sequences(path, records) -> dict:
    from safetensors.torch import load_file

    tokens = load_file(str(path))
    if tokens["seq_offsets"].numel() - 1 != len(records):
        raise ValueError(f"sequences {str(path)!r} holds {tokens['seq_offsets'].numel() - 1} sequences, "
                         f"records has {len(records)}")
    return tokens


def split_sequences(tokens: dict) -> list[tuple[torch.Tensor, int]]:
    """``[(ids [T], start), ...]`` from the shared token tensors."""
    off = tokens["seq_offsets"].tolist()
    return [(tokens["ids"][a:b], int(s)) for a, b, s in zip(off[:-1], off[1:], tokens["starts"].tolist())]


def _logits_kwargs(model, keep: int) -> dict:
    import inspect

    return {"logits_to_keep": keep} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


@torch.no_grad()
def member_logits(model, ids: torch.Tensor, start: int) -> torch.Tensor:  # [T] -> [T - start, V]
    """Float32 logits predicting ``ids[start:]`` from their prefixes, as the engine computes them.

    One forward pass over the sequence, except for models whose outputs at a position depend
    on the other tokens of the same forward (:func:`mdboost.models.drafters.mixes_positions`:
    dynamically quantized layers take one activation scale per input tensor). Those are run
    the way the engine's drafter runs them: the prefix ``ids[:start]`` in one forward, then one
    token per forward on a KV cache (:func:`_stepwise_logits`).
    """
    from mdboost.models.drafters import mixes_positions

    rows = ids.numel() - start
    if mixes_positions(model) and rows:
        return _stepwise_logits(model, ids, start)
    device = next(model.parameters()).device
    out = model(input_ids=ids[None].to(device), use_cache=False, **_logits_kwargs(model, rows + 1)).logits[0]
    return out[-rows - 1:-1].float() if rows else out[:0].float()


def _stepwise_logits(model, ids: torch.Tensor, start: int) -> torch.Tensor:  # [T] -> [T - start, V]
    """The prefix in one forward, then one token per forward (the engine's drafting path)."""
    from mdboost.engine.kv import CachedLM

    device = next(model.parameters()).device
    ids = ids.to(device)
    lm = CachedLM(model, 1, device)
    out = [lm.forward(ids[None, :start], logits_to_keep=1)[0, -1]]
    for t in range(start, ids.numel() - 1):
        out.append(lm.forward(ids[None, t:t + 1], logits_to_keep=1)[0, -1])
    return torch.stack(out).float()


@torch.no_grad()
def compute_shard(member, seqs, settings: dict) -> dict:
    """The tensors of one member shard over ``seqs = [(ids, start), ...]``."""
    if member.kind == "ngram":
        lookahead = settings["ngram_lookahead"]
        props = [member.ngram.propose_all(ids, lookahead)[start - 1: ids.numel() - 1] for ids, start in seqs]
        return {"proposals": torch.cat(props).int() if props else torch.empty(0, lookahead, dtype=torch.int32)}
    parts = {name: [] for name in ("topk_ids", "topk_logits", "true_logit", "logit_sum", "full_logits")}
    lse_parts = {t: [] for t in settings["temperatures"]}
    store = DTYPES[settings["dtype"]]
    for ids, start in seqs:
        logits = member_logits(member.model, ids, start).cpu()  # [r, V]
        values, index = logits.topk(min(settings["k"], logits.shape[-1]), dim=-1)
        parts["topk_ids"].append(index.int())
        parts["topk_logits"].append(values.to(store))
        parts["true_logit"].append(logits.gather(1, ids[start:, None]).squeeze(1))
        parts["logit_sum"].append(logits.sum(-1))
        for t in lse_parts:
            lse_parts[t].append(torch.logsumexp(logits / t, dim=-1))
        if settings["keep_full"]:
            parts["full_logits"].append(logits.half())
    out = {name: torch.cat(chunks) for name, chunks in parts.items() if chunks}
    out.update({lse_key(t): torch.cat(chunks) for t, chunks in lse_parts.items()})
    return out


def _job(member, seqs, settings, path) -> tuple[str, str]:
    return path.name, atomic_save_tensors(compute_shard(member, seqs, settings), path)


def _recipe_job(recipe, name, seqs, settings, path) -> tuple[str, str]:
    from mdboost.models.pool import rebuild_member

    if os.getpid() != settings["parent_pid"]:  # a worker process (in-process dask workers share our threads)
        torch.set_num_threads(settings["threads"])
    key = (repr(sorted(recipe.items())), name)
    if key not in _WORKER_MEMBERS:
        _WORKER_MEMBERS[key] = rebuild_member(recipe, name)[0]
    return _job(_WORKER_MEMBERS[key], seqs, settings, path)


def _config(pool, records, members, settings, source_opts) -> dict:
    tok_fp = pool.target.vocab_fingerprint
    return {
        "format": FORMAT, "code_version": code_version(), "target": pool.target.name,
        "members": [{k: v for k, v in pool[m].describe().items() if not k.startswith("cost")} for m in members],
        "member_costs": {m: [pool[m].cost_ratio, pool[m].cost_method] for m in members},
        "tokenizer_fingerprint": tok_fp, "vocab_size": int(pool.target.model.config.vocab_size), "dataset_fingerprint": dataset_fingerprint(records),
        "record_ids": [r["id"] for r in records], "k": settings["k"], "dtype": settings["dtype"],
        "keep_full": settings["keep_full"], "temperatures": settings["temperatures"],
        "ngram_lookahead": settings["ngram_lookahead"], "shard_size": settings["shard_size"], **source_opts,
    }


def _same_build(old: dict, new: dict) -> bool:
    skip = {"member_costs", "shards", "complete", "num_rows", "num_sequences", "code_version", "speed_profile"}
    return {k: v for k, v in old.items() if k not in skip} == {k: v for k, v in new.items() if k not in skip}


def build_cache(
    pool,
    records: list[dict],
    out_dir: str | os.PathLike,
    *,
    k: int = 32,
    dtype: str = "float16",
    source: str = "reference",
    keep_full: bool = False,
    temperatures=(1.0,),
    members: list[str] | None = None,
    shard_size: int = 16,
    backend: str = "loky",
    n_jobs: int = 1,
    chat_template: bool = False,
    system: str | None = None,
    max_tokens: int = 512,
    max_new_tokens: int = 128,
    sample_temperature: float = 1.0,
    seed: int = 0,
    ngram_lookahead: int = 4,
    overwrite: bool = False,
    progress: bool = True,
    sequences: str | os.PathLike | None = None,
    member_costs: dict | None = None,
) -> Path:
    """Build (or resume) the logit cache of ``pool`` over ``records`` in ``out_dir``.

    Parameters
    ----------
    pool : mdboost.models.pool.Pool
    records : list of dict
        ``{"id", "prompt", "reference"}`` records (see :func:`mdboost.data.load_texts`).
    out_dir : path
        Cache folder (created). An existing cache with the same configuration is resumed
        (finished shards are skipped, damaged ones rebuilt); a different configuration raises
        ``ValueError`` unless ``overwrite=True``.
    k : int, default=32
        Top-k entries kept per position and member.
    dtype : {"float16", "bfloat16", "float32"}, default="float16"
        Storage dtype of the top-k logits (logsumexp, true logit and logit sum stay float32).
        float16 keeps 11 significant bits: a logit of magnitude ``|l|`` is off by at most
        ``|l| * 2**-11`` (0.016 at ``|l| = 32``), a relative probability error below 1.6%.
    source : {"reference", "sampled"}
        Teacher-forced reference continuations, or continuations sampled from the target at
        ``sample_temperature`` (up to ``max_new_tokens``, seeded per record from ``seed``).
    keep_full : bool, default=False
        Also keep full-vocabulary logits (fp16): exact NLL of mixtures, for small samples.
    temperatures : sequence of float, default=(1.0,)
        Temperatures whose exact full-vocabulary ``logsumexp(logits / T)`` is stored.
    members : list of str or None
        Pool members to cache (default: all).
    shard_size : int, default=16
        Sequences per shard.
    backend, n_jobs : joblib backend name (``"loky"``, ``"threading"``, ``"dask"``, ...) and
        number of jobs. With ``n_jobs == 1`` everything runs in this process. Process-based
        backends rebuild members from ``pool.recipe`` in the workers.
    chat_template, system, max_tokens : prompt formatting and sequence truncation.
    ngram_lookahead : int, default=4
        Tokens kept of each ``ngram`` proposal (``-1`` padded).
    progress : bool, default=True
        Show a tqdm bar (``TQDM_DISABLE=1`` silences it).
    sequences : path, optional
        A finished token file from :func:`sample_sequences` (over the same ``records``) to use
        instead of building the sequences here; its SHA-256 joins the build configuration
        (``sequences_sha256``).
    member_costs : dict, optional
        ``{member: (cost_ratio, method)}`` measured by the caller for the manifest's
        ``member_costs``; other members record their ``PoolMember.cost_ratio`` / ``cost_method``.

    Returns
    -------
    Path
        ``out_dir``.
    """
    from joblib import Parallel, delayed, parallel_config
    from tqdm.auto import tqdm

    temperatures = sorted({1.0, *map(float, temperatures)})
    _check_args(k, dtype, source, shard_size, temperatures)
    members = list(pool.names if members is None else members)
    for name in members:
        pool.check_compatible(pool[name], pool.target)
    out_dir = Path(out_dir)
    settings = {"k": int(k), "dtype": dtype, "keep_full": bool(keep_full), "temperatures": temperatures,
                "ngram_lookahead": int(ngram_lookahead), "shard_size": int(shard_size),
                "threads": max(1, (os.cpu_count() or 1) // max(1, n_jobs)), "parent_pid": os.getpid()}
    source_opts = {"source": source, "chat_template": bool(chat_template), "system": system, "max_tokens": max_tokens}
    if source == "sampled":
        source_opts.update(max_new_tokens=max_new_tokens, sample_temperature=sample_temperature, seed=seed)
    if sequences is not None:
        source_opts["sequences_sha256"] = finished_digest(sequences)
        if source_opts["sequences_sha256"] is None:
            raise ValueError(f"sequences must be a finished token file (with its .sha256), got {str(sequences)!r}")
    config = _config(pool, records, members, settings, source_opts)
    config["member_costs"].update({m: list(c) for m, c in (member_costs or {}).items() if m in members})
    config["shards"], config["complete"] = {}, False
    if (out_dir / "manifest.json").is_file():
        old = read_manifest(out_dir)
        if not _same_build(old, config):
            if not overwrite:
                raise ValueError(f"out_dir {str(out_dir)!r} holds a cache built with another configuration; pass overwrite=True")
            shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(out_dir, config)

    tokens_path = out_dir / TOKENS
    from safetensors.torch import load_file

    if finished_digest(tokens_path) is None and sequences is not None:
        atomic_save_tensors(_load_sequences(sequences, records), tokens_path)
    elif finished_digest(tokens_path) is None:
        tokens = build_sequences(pool, records, chat_template=chat_template, system=system, max_tokens=max_tokens,
                                 source=source, max_new_tokens=max_new_tokens,
                                 sample_temperature=sample_temperature, seed=seed)
        atomic_save_tensors(tokens, tokens_path)
    tokens = load_file(str(tokens_path))
    seqs = split_sequences(tokens)
    shards = [seqs[i:i + shard_size] for i in range(0, len(seqs), shard_size)]

    digests, pending = {TOKENS: finished_digest(tokens_path)}, []
    for name in members:
        for index, shard in enumerate(shards):
            path = out_dir / shard_name(name, index)
            digest = finished_digest(path)
            if digest is None:
                pending.append((name, shard, path))
            else:
                digests[path.name] = digest
    in_process = n_jobs == 1 or backend in ("threading", "sequential")
    if not in_process and pool.recipe is None:
        raise ValueError(f"backend {backend!r} with n_jobs={n_jobs} needs a pool from build_pool (pool.recipe is None)")
    jobs = [delayed(_job)(pool[name], shard, settings, path) if in_process
            else delayed(_recipe_job)(pool.recipe, name, shard, settings, path) for name, shard, path in pending]
    # parallel_config (unlike Parallel(backend=...)) also registers the "dask" backend on demand
    with parallel_config(backend=backend if n_jobs != 1 else "sequential", n_jobs=n_jobs):
        runner = Parallel(return_as="generator")
        for file_name, digest in tqdm(runner(jobs), total=len(jobs), desc="logit cache",
                                      disable=not progress or bool(os.environ.get("TQDM_DISABLE"))):
            digests[file_name] = digest

    config["shards"] = {name: {"sha256": digest, "bytes": (out_dir / name).stat().st_size} for name, digest in sorted(digests.items())}
    config["num_rows"] = int(tokens["row_offsets"][-1])
    config["num_sequences"] = len(seqs)
    config["complete"] = True
    write_manifest(out_dir, config)
    return out_dir
