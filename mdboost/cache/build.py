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
``shard_size`` sequences. What is stored and how the sequences are made are two small settings
objects (:class:`~mdboost.cache.settings.StoreSettings`,
:class:`~mdboost.cache.settings.SequenceSettings`), both recorded in the manifest. Jobs (member,
shard) run through joblib with a configurable backend
(:class:`~mdboost.cache.settings.RunOptions`); process-based backends (loky, dask) rebuild
members in the workers from ``pool.recipe``. ``dask`` submits to the default
``distributed.Client`` (:func:`mdboost.cluster.dask_client` makes one, ``docs/scale_out.md``).

Shared sampled continuations: :func:`sample_sequences` samples the target's continuations once
into a token file; ``build_cache(..., tokens_file=<that file>)`` then teacher-forces a member on
exactly those sequences (one forward pass per sequence, no sampling) and records the file's
SHA-256 in the manifest, so folders built on other sequences never pass as the same build.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm.auto import tqdm

from mdboost._io import file_lock, lock_path, remove_stale_temps, sha256_file
from mdboost.cluster import _distributed
from mdboost.data import dataset_fingerprint, encode_prompt, encode_record

from .manifest import (FORMAT, MANIFEST, TOKENS, CacheCorruptionError, atomic_save_tensors, check_layout, code_version,
                       finished_digest, lse_key, read_manifest, shard_name, trusted_digest, verify_shards,
                       write_manifest)
from .options import joblib_backends  # torch-free (a config checks its backend before torch loads)
from .settings import DTYPES, SOURCES, RunOptions, SequenceSettings, StoreSettings

__all__ = ["build_cache", "sample_sequences", "joblib_backends", "build_sequences", "split_sequences", "member_logits", "compute_shard",
           "sample_continuation", "DTYPES", "SOURCES"]
_WORKER_MEMBERS: dict = {}


def sample_continuation(model, prompt: torch.Tensor, max_new_tokens: int, temperature: float,
                        generator: torch.Generator, eos_token_id: int | None = None) -> torch.Tensor:  # [P] -> [N]
    """Sample up to ``max_new_tokens`` tokens from ``model`` after ``prompt`` (stops after EOS).

    The engine's AR loop (:func:`mdboost.engine.generate` without a drafter): KV-cached, one
    multinomial draw per token from ``generator`` (a CPU generator draws on the CPU whatever
    the model's device); ``temperature=0`` is greedy and draws nothing.
    """
    # deferred: mdboost.engine imports transformers (seconds); a cache opens without it
    from mdboost.engine import GenerationSettings, generate

    device = next(model.parameters()).device
    settings = GenerationSettings(max_new_tokens=max_new_tokens, temperature=temperature, eos_token_id=eos_token_id)
    out = generate(model, prompt.to(device)[None], settings, generator=generator)
    return out.sequences[0, prompt.numel(): prompt.numel() + int(out.num_new_tokens[0])].cpu()


def _check_dask_client() -> None:
    """A default ``distributed.Client`` is there for joblib's ``dask`` backend, else ``ValueError``."""
    try:
        _distributed().get_client()
    except ValueError:
        raise ValueError("backend 'dask' needs a running distributed.Client: build inside "
                         "`with mdboost.cluster.dask_client('local' or an address):`") from None


def _record_seed(seed: int, record_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{record_id}".encode()).digest()[:8], "big") >> 1


def build_sequences(pool, records, sequences: SequenceSettings) -> dict:
    """The token tensors shared by every member (``tokens.safetensors``), made as ``sequences`` says."""
    tok, opts = pool.target.tokenizer, sequences
    seqs, starts = [], []
    for record in records:
        if not opts.sampled:
            ids, start = encode_record(tok, record, opts.chat_template, opts.system, opts.max_tokens)
        else:
            prompt = encode_prompt(tok, record["prompt"], opts.chat_template, opts.system)
            if prompt.numel() == 0:
                raise ValueError(f"record {record['id']!r} has an empty prompt; source='sampled' needs one")
            prompt = prompt[-max(opts.max_tokens - opts.max_new_tokens, opts.max_tokens // 2):]  # room for the continuation
            gen = torch.Generator().manual_seed(_record_seed(opts.seed, record["id"]))
            cont = sample_continuation(pool.target.model, prompt, opts.max_new_tokens, opts.sample_temperature, gen,
                                       tok.eos_token_id)
            ids, start = torch.cat([prompt, cont])[:opts.max_tokens], prompt.numel()
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


def sample_sequences(pool, records, path: str | os.PathLike, sequences: SequenceSettings, *,
                     progress: bool = False) -> tuple[Path, str]:
    """Sample the target's continuations of ``records`` once into the token file ``path``.

    The file holds the shared token tensors of :func:`build_sequences` (record ``i`` sampled
    with a ``torch.Generator`` seeded from ``sequences.seed`` and its id), written atomically
    with a ``.sha256`` sidecar. A finished file is reused as is.

    Parameters
    ----------
    pool : mdboost.models.pool.Pool
    records : list of dict
    path : path
        The token file (its folder is created).
    sequences : SequenceSettings
        How the sequences are made, with ``source="sampled"``.
    progress : bool, default=False
        Show a tqdm bar (``TQDM_DISABLE=1`` silences it).

    Returns
    -------
    (Path, str)
        ``path`` and the file's SHA-256 (pass ``tokens_file=path`` to :func:`build_cache`).
    """
    if not sequences.sampled:
        raise ValueError(f"sequences.source must be 'sampled' to sample continuations, got {sequences.source!r}")
    if not len(records):
        raise ValueError("records must hold at least one record, got none")
    path = Path(path)
    digest = finished_digest(path)
    if digest is None:
        with file_lock(lock_path(path)):
            digest = finished_digest(path)  # another process may have sampled it while we waited
            if digest is None:
                remove_stale_temps(path.parent, prefix=path.name)
                bar = tqdm(records, desc="sampling continuations",
                           disable=not progress or bool(os.environ.get("TQDM_DISABLE")))
                digest = atomic_save_tensors(build_sequences(pool, bar, sequences), path)
    return path, digest


def _load_sequences(path, records) -> dict:
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
    # deferred: mdboost.models imports transformers (seconds); a cache opens without it
    from mdboost.models.drafters import mixes_positions

    rows = ids.numel() - start
    if mixes_positions(model) and rows:
        return _stepwise_logits(model, ids, start)
    device = next(model.parameters()).device
    out = model(input_ids=ids[None].to(device), use_cache=False, **_logits_kwargs(model, rows + 1)).logits[0]
    return out[-rows - 1:-1].float() if rows else out[:0].float()


def _stepwise_logits(model, ids: torch.Tensor, start: int) -> torch.Tensor:  # [T] -> [T - start, V]
    """The prefix in one forward, then one token per forward (the engine's drafting path)."""
    # deferred: mdboost.engine imports transformers (seconds); a cache opens without it
    from mdboost.engine.kv import CachedLM

    device = next(model.parameters()).device
    ids = ids.to(device)
    lm = CachedLM(model, 1, device)
    out = [lm.forward(ids[None, :start], logits_to_keep=1)[0, -1]]
    for t in range(start, ids.numel() - 1):
        out.append(lm.forward(ids[None, t:t + 1], logits_to_keep=1)[0, -1])
    return torch.stack(out).float()


@torch.no_grad()
def compute_shard(member, seqs, store: StoreSettings) -> dict:
    """The tensors of one member shard over ``seqs = [(ids, start), ...]``."""
    if member.kind == "ngram":
        lookahead = store.ngram_lookahead
        props = [member.ngram.propose_all(ids, lookahead)[start - 1: ids.numel() - 1] for ids, start in seqs]
        return {"proposals": torch.cat(props).int() if props else torch.empty(0, lookahead, dtype=torch.int32)}
    parts = {name: [] for name in ("topk_ids", "topk_logits", "true_logit", "logit_sum", "full_logits")}
    lse_parts = {t: [] for t in store.temperatures}
    for ids, start in seqs:
        logits = member_logits(member.model, ids, start).cpu()  # [r, V]
        values, index = logits.topk(min(store.k, logits.shape[-1]), dim=-1)
        parts["topk_ids"].append(index.int())
        parts["topk_logits"].append(values.to(store.torch_dtype))
        parts["true_logit"].append(logits.gather(1, ids[start:, None]).squeeze(1))
        parts["logit_sum"].append(logits.sum(-1))
        for t in lse_parts:
            lse_parts[t].append(torch.logsumexp(logits / t, dim=-1))
        if store.keep_full:
            parts["full_logits"].append(logits.half())
    out = {name: torch.cat(chunks) for name, chunks in parts.items() if chunks}
    out.update({lse_key(t): torch.cat(chunks) for t, chunks in lse_parts.items()})
    return out


def _job(member, seqs, store, path) -> tuple[str, str]:
    return path.name, atomic_save_tensors(compute_shard(member, seqs, store), path)


def _recipe_job(recipe, name, seqs, store, path, parent_pid: int, threads: int) -> tuple[str, str]:
    # deferred: mdboost.models imports transformers (seconds); a cache opens without it
    from mdboost.models.pool import rebuild_member

    if os.getpid() != parent_pid:  # a worker process (in-process dask workers share our threads)
        torch.set_num_threads(threads)
    key = (repr(sorted(recipe.items())), name)
    if key not in _WORKER_MEMBERS:
        _WORKER_MEMBERS[key] = rebuild_member(recipe, name)[0]
    return _job(_WORKER_MEMBERS[key], seqs, store, path)


def _config(pool, records, members, store: StoreSettings, source_opts: dict) -> dict:
    tok_fp = pool.target.vocab_fingerprint
    return {
        "format": FORMAT, "code_version": code_version(), "target": pool.target.name,
        "members": [{k: v for k, v in pool[m].describe().items() if not k.startswith("cost")} for m in members],
        "member_costs": {m: [pool[m].cost_ratio, pool[m].cost_method] for m in members},
        "tokenizer_fingerprint": tok_fp, "vocab_size": int(pool.target.model.config.vocab_size), "dataset_fingerprint": dataset_fingerprint(records),
        "record_ids": [r["id"] for r in records], **store.manifest_entries(), **source_opts,
    }


def _same_build(old: dict, new: dict) -> bool:
    skip = {"member_costs", "shards", "complete", "num_rows", "num_sequences", "code_version", "speed_profile",
            "manifest_sha256"}
    return {k: v for k, v in old.items() if k not in skip} == {k: v for k, v in new.items() if k not in skip}


def build_cache(
    pool,
    records: list[dict],
    out_dir: str | os.PathLike,
    store: StoreSettings = StoreSettings(),
    sequences: SequenceSettings = SequenceSettings(),
    *,
    members: list[str] | None = None,
    tokens_file: str | os.PathLike | None = None,
    run: RunOptions = RunOptions(),
) -> Path:
    """Build (or resume) the logit cache of ``pool`` over ``records`` in ``out_dir``.

    Parameters
    ----------
    pool : mdboost.models.pool.Pool
    records : list of dict
        ``{"id", "prompt", "reference"}`` records (see :func:`mdboost.data.load_texts`).
    out_dir : path
        Cache folder (created). An existing cache with the same configuration (``store``,
        ``sequences``, the pool members, the records, ...) is resumed (finished shards are
        skipped, damaged ones rebuilt; a finished, intact one is left untouched); a different
        configuration raises ``ValueError`` unless ``run.overwrite``.
    store : StoreSettings
        What each shard stores (top-``k``, dtype, full logits, temperatures, shard size).
    sequences : SequenceSettings
        How the token sequences are made (reference or sampled, formatting, truncation).
    members : list of str or None
        Pool members to cache (default: all).
    tokens_file : path, optional
        A finished token file from :func:`sample_sequences` (over the same ``records``) to use
        instead of building the sequences here; its SHA-256 joins the build configuration
        (``sequences_sha256``).
    run : RunOptions
        joblib backend and jobs, progress bar, overwrite; never part of the configuration.

    Returns
    -------
    Path
        ``out_dir``.

    Notes
    -----
    One build writes a folder at a time (a lock file next to it, :func:`~mdboost._io.file_lock`):
    a concurrent call waits, then finds the folder finished and leaves it as it is. A resumed
    build first removes the temporary files a killed one left, keeps a file only when it matches
    its manifest entry (or, for one finished after the last manifest write, its ``.sha256``
    sidecar) and rebuilds the rest; a damaged or edited manifest starts the folder over with
    ``run.overwrite`` and raises :class:`~mdboost.cache.manifest.CacheCorruptionError` without.
    """
    records = list(records)
    if not records:  # a folder of no rows would be "complete" yet unreadable (every member tensor empty)
        raise ValueError("records must hold at least one record, got none")
    members = list(pool.names if members is None else members)
    for name in members:
        pool.check_compatible(pool[name], pool.target)
    if run.backend == "dask" and not run.in_process:
        _check_dask_client()
    out_dir = Path(out_dir)
    source_opts = sequences.manifest_entries()
    if tokens_file is not None:
        source_opts["sequences_sha256"] = finished_digest(tokens_file)
        if source_opts["sequences_sha256"] is None:
            raise ValueError(f"tokens_file must be a finished token file (with its .sha256), got {str(tokens_file)!r}")
    config = _config(pool, records, members, store, source_opts)
    config["shards"], config["complete"] = {}, False
    with file_lock(lock_path(out_dir)):  # one writer per folder; others wait, then find it finished
        trusted = _prepare_folder(out_dir, config, run)
        if trusted is None:
            return out_dir  # finished with this configuration (by us before, or by another process)
        _fill_folder(pool, records, out_dir, config, trusted, store, sequences, members, tokens_file, run)
    return out_dir


def _prepare_folder(out_dir: Path, config: dict, run: RunOptions) -> dict | None:
    """Make ``out_dir`` ready to (re)build ``config``; return the manifest entries a resume may
    keep (:func:`~mdboost.cache.manifest.trusted_digest`), or None when the folder is already a
    finished, verified cache of ``config``. Called while holding the folder's lock."""
    trusted = {}
    remove_stale_temps(out_dir)  # left by a killed writer (we hold the lock: no writer is live)
    if (out_dir / MANIFEST).is_file():
        try:
            old = read_manifest(out_dir)
        except CacheCorruptionError:
            if not run.overwrite:
                raise
            old = None  # a damaged manifest vouches for nothing: start over
        if old is not None and _same_build(old, config):
            if old.get("complete") and _finished_cache(out_dir, old):
                return None
            trusted = dict(old.get("shards", {}))
        else:
            if old is not None and not run.overwrite:
                raise ValueError(f"out_dir {str(out_dir)!r} holds a cache built with another configuration; "
                                 "pass run=RunOptions(overwrite=True)")
            shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(out_dir, config)
    return trusted


def _finished_cache(out_dir: Path, manifest: dict) -> bool:
    """Every file of a complete manifest matches its entry and the layout holds."""
    if verify_shards(out_dir, manifest):
        return False
    try:
        check_layout(out_dir, manifest, load_file(str(out_dir / TOKENS)))
    except CacheCorruptionError:
        return False
    return True


def _fill_folder(pool, records, out_dir: Path, config: dict, trusted: dict, store, sequences, members, tokens_file,
                 run: RunOptions) -> None:
    """Compute what is missing; the manifest records every finished file as it lands."""
    from joblib import Parallel, delayed, parallel_config  # deferred: joblib: only a parallel build needs it

    tokens_path = out_dir / TOKENS
    if trusted_digest(tokens_path, trusted.get(TOKENS)) is None:
        tokens = build_sequences(pool, records, sequences) if tokens_file is None else _load_sequences(tokens_file, records)
        atomic_save_tensors(tokens, tokens_path)
    tokens = load_file(str(tokens_path))
    seqs = split_sequences(tokens)
    shards = [seqs[i:i + store.shard_size] for i in range(0, len(seqs), store.shard_size)]

    def record(name: str, digest: str) -> None:
        config["shards"][name] = {"sha256": digest, "bytes": (out_dir / name).stat().st_size}

    record(TOKENS, sha256_file(tokens_path))
    pending = []
    for name in members:
        for index, shard in enumerate(shards):
            path = out_dir / shard_name(name, index)
            digest = trusted_digest(path, trusted.get(path.name))
            if digest is None:
                pending.append((name, shard, path))
            else:
                record(path.name, digest)
    write_manifest(out_dir, config)
    if not run.in_process and pool.recipe is None:
        raise ValueError(f"backend {run.backend!r} with n_jobs={run.n_jobs} needs a pool from build_pool "
                         "(pool.recipe is None)")
    threads = max(1, (os.cpu_count() or 1) // run.n_jobs)
    jobs = [delayed(_job)(pool[name], shard, store, path) if run.in_process
            else delayed(_recipe_job)(pool.recipe, name, shard, store, path, os.getpid(), threads)
            for name, shard, path in pending]
    # parallel_config (unlike Parallel(backend=...)) also registers the "dask" backend on demand
    with parallel_config(backend=run.backend if run.n_jobs != 1 else "sequential", n_jobs=run.n_jobs):
        runner = Parallel(return_as="generator")
        for file_name, digest in tqdm(runner(jobs), total=len(jobs), desc="logit cache",
                                      disable=not run.progress or bool(os.environ.get("TQDM_DISABLE"))):
            record(file_name, digest)
            write_manifest(out_dir, config)  # a kill from here on keeps this shard (its entry is the proof)

    config["shards"] = dict(sorted(config["shards"].items()))
    config["num_rows"] = int(tokens["row_offsets"][-1])
    config["num_sequences"] = len(seqs)
    config["complete"] = True
    write_manifest(out_dir, config)
