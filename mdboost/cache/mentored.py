"""Continuations sampled by a lossy rule itself, for drafters that read the text.

The acceptance cache's continuations are sampled from the target ``q``: exact for SD, whose
output is the target's. With a budget the engine emits ``pi``, which leans towards the drafts,
and a prompt-lookup drafter reads the text it drafts on: an accepted copy makes the text repeat
its context, so later lookups match more (``docs/ranking.md``, "The text is the target's").
This module samples, for one lookup drafter and one lossy point ``(rule, f, D)`` at one
temperature, the text the engine emits, and stores the rows the draft-start process needs on it.

Two rules have such points (:data:`RULES`): mentored decoding (``"mentored"``) and SGLang's
lossy threshold at the threshold ``(f, D)`` maps to (``"threshold"``,
:meth:`mdboost.md.rules.Threshold.for_budget`). On a one-hot draft ``x`` both accept ``x`` with
a probability ``t`` that depends on ``q_x`` alone and, at a rejection, draw from ``q`` without
``x``: MD's ``t = pi_x`` is the closed-form one-hot optimum
(:func:`mdboost.md.onehot.one_hot_primal`, ``docs/theory.md`` section 4), the threshold's
``t = min(1, q_x / c)`` (its law on the two slots ``{x, not x}``, which is the full law grouped).

The sampler (:data:`SAMPLERS`) continues the same prompts as the shared target continuations
(``PoolCacheSpec.continuations_path``), one KV-cached target step per token and point: at each
position the drafter's own lookup on the text so far proposes ``x`` (one-hot ``p``), and the
token is ``x`` with probability ``t``, else a draw from ``q`` without ``x``; without a proposal
it is drawn from ``q``. This is what the engine emits at a drafted position whose chain draft is
that position's own lookup; it differs from the engine at the bonus token after a fully accepted
step (drawn from ``q``) and where a chain's copy differs from a fresh lookup, so the text does
not depend on gamma. Every (record, point) has its own ``torch.Generator`` (seeded from the data
seed, the record id and the point), so a file never depends on which other points were sampled
with it; the points of one record share one prefill.

Each point's rows go to ``<cache.dir>/mentored-<key>/rows.safetensors`` (atomic, ``.sha256``
sidecar, :func:`mentored_path`): the token sequences (``ids``, ``seq_offsets``, ``starts``),
then per continuation position the target's top-``k`` ids and temperature-1 logits, its
``logsumexp`` at the temperature, the logit of the emitted token and the drafter's proposals
(``width`` tokens, ``-1`` padded). The key covers the shared continuations' key (text, target,
temperature, token count, weights), the drafter, the point, ``k``, ``width`` and the rule's sampler.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm.auto import tqdm

from mdboost._io import file_lock, lock_path, remove_stale_temps
from mdboost.md.divergences import resolve
from mdboost.md.onehot import one_hot_primal
from mdboost.md.rules import Threshold

from .build import split_sequences
from .keys import PoolCacheSpec, fingerprint
from .manifest import CacheCorruptionError, atomic_save_tensors, finished_digest

__all__ = ["RULES", "SAMPLERS", "MENTORED_SAMPLER", "mentored_path", "sample_mentored", "open_or_sample_mentored", "load_mentored",
           "attach_mentored"]

MENTORED_SAMPLER = ("mentored/v1: own lookup per position, one_hot_primal, x w.p. t else q without x; "
                    "generator per (record, point) seeded by sha256(seed:id:drafter:f:D)")
RULES = ("mentored", "threshold")
SAMPLERS = {
    "mentored": MENTORED_SAMPLER,
    "threshold": ("threshold/v1: own lookup per position, Threshold.for_budget(D, f) law on {x, not x}, x w.p. t "
                  "else q without x; generator per (record, point) seeded by sha256(seed:id:drafter:f:D:threshold)"),
}
FILE = "rows.safetensors"


def _check_rule(rule: str) -> str:
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    return rule


def mentored_path(spec: PoolCacheSpec, drafter: str, divergence: str, max_divergence: float, width: int,
                  rule: str = "mentored") -> Path:
    """The rows file of ``drafter``'s continuations emitted by ``rule`` at ``(divergence, max_divergence)``."""
    n = spec.acceptance_max_new_tokens
    key = fingerprint(spec.continuations_key(n), drafter, divergence, float(max_divergence), spec.folders.k,
                      int(width), SAMPLERS[_check_rule(rule)])
    return Path(spec.dir) / f"mentored-{key}" / FILE


def _point_seed(seed: int, record_id: str, drafter: str, rule: str, divergence: str, max_divergence: float) -> int:
    text = f"{seed}:{record_id}:{drafter}:{divergence}:{float(max_divergence)!r}"
    if rule != "mentored":  # MD's seeds (and so its stored texts) are those of before the rule dimension
        text += f":{rule}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def _acceptor(rule: str, budget: float, div):
    """``q_x -> t``: the probability that ``rule`` at ``(div, budget)`` accepts a one-hot draft
    whose target probability is ``q_x`` (0-d float64; module docstring)."""
    if _check_rule(rule) == "mentored":
        bound = torch.tensor([budget], dtype=torch.float64)
        return lambda q_x: float(one_hot_primal(q_x.reshape(1), bound, div).acceptance[0])
    law = Threshold.for_budget(budget, div).law  # the threshold is solved once per point
    draft = torch.tensor([1.0, 0.0], dtype=torch.float64)
    return lambda q_x: float(law(draft, torch.stack([q_x, 1 - q_x])).acceptance)  # {x, not x}: t needs q_x alone


def _emit(logits: torch.Tensor, proposal: int, temperature: float, accept, generator) -> int:
    """One token of a rule's text from the target's logits [V], ``accept`` its :func:`_acceptor`
    (module docstring)."""
    q = torch.softmax(logits.double() / temperature, dim=-1)  # [V]
    if proposal >= 0:
        t = accept(q[proposal])
        if float(torch.rand((), generator=generator, dtype=torch.float64)) < t:
            return proposal
        q = q.clone()
        q[proposal] = 0.0
        if float(q.sum()) <= 0:  # q is one-hot on the proposal: t = 1 above
            return proposal
    return int(torch.multinomial(q.float(), 1, generator=generator))


def sample_mentored(model, prompt: torch.Tensor, drafter, points, temperature: float, max_new_tokens: int,
                    generators, *, eos_token_id: int | None = None, k: int = 128, width: int = 8) -> list[dict]:
    """Continuations of one prompt emitted by each point's rule, one per point (module docstring).

    Parameters
    ----------
    model : causal LM
        The target.
    prompt : LongTensor [P]
    drafter : mdboost.models.ngram.NgramDrafter
    points : list of (str, str, float)
        ``(rule, divergence, max_divergence)`` per continuation, ``rule`` one of :data:`RULES`.
    temperature : float, > 0
    max_new_tokens : int
    generators : list of torch.Generator
        One per point (CPU).
    eos_token_id : int, optional
        A continuation stops after it.
    k, width : int
        Top-k of the target rows (all ``V`` where ``k > V``, as in the logit cache), proposals kept per row.

    Returns
    -------
    list of dict
        Per point: ``tokens`` [N], ``topk_ids`` [N, min(k, V)], ``topk_logits`` [N, min(k, V)] (temperature 1),
        ``lse`` [N] (``logsumexp(logits / temperature)``), ``true_logit`` [N], ``proposals`` [N, width].
    """
    # deferred: mdboost.models imports transformers (seconds); a cache opens without it
    from mdboost.models.loading import cache_kwarg

    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for mentored continuations, got {temperature!r}")
    if len(generators) != len(points):
        raise ValueError(f"generators must have one generator per point ({len(points)}), got {len(generators)}")
    accept = [_acceptor(rule, float(b), resolve(d)) for rule, d, b in points]
    n = len(points)
    device = next(model.parameters()).device
    kw = cache_kwarg(model)
    with torch.no_grad():
        from transformers import DynamicCache  # deferred: transformers: seconds to import; a cache opens without it

        past = DynamicCache(config=model.config)
        out = model(prompt.to(device)[None], use_cache=True, **{kw: past})
        past.batch_repeat_interleave(n)  # one prefill, shared by the points
        logits = out.logits[:, -1].float().expand(n, -1).cpu()  # [n, V]
        texts = [prompt.tolist() for _ in range(n)]
        rows = [{"tokens": [], "topk_ids": [], "topk_logits": [], "lse": [], "true_logit": [], "proposals": []}
                for _ in range(n)]
        done = [False] * n
        for _ in range(max_new_tokens):
            nxt = []
            for i in range(n):
                if done[i]:
                    nxt.append(texts[i][-1])
                    continue
                ids = torch.tensor(texts[i])
                props = drafter.propose(ids, width)
                props = torch.cat([props.long(), props.new_full((width - props.numel(),), -1).long()])
                token = _emit(logits[i], int(props[0]), temperature, accept[i], generators[i])
                top = torch.topk(logits[i], min(k, logits.shape[-1]))  # k above V keeps all (as the cache build)
                r = rows[i]
                r["tokens"].append(token)
                r["topk_ids"].append(top.indices)
                r["topk_logits"].append(top.values)
                r["lse"].append(torch.logsumexp(logits[i].double() / temperature, -1))
                r["true_logit"].append(logits[i, token])
                r["proposals"].append(props)
                texts[i].append(token)
                done[i] = eos_token_id is not None and token == eos_token_id
                nxt.append(token)
            if all(done):
                break
            step = model(torch.tensor(nxt, device=device)[:, None], use_cache=True, **{kw: past})
            logits = step.logits[:, -1].float().cpu()
    out = []
    for r in rows:
        out.append({"tokens": torch.tensor(r["tokens"], dtype=torch.long),
                    "topk_ids": torch.stack(r["topk_ids"]).int(), "topk_logits": torch.stack(r["topk_logits"]),
                    "lse": torch.stack(r["lse"]).double(), "true_logit": torch.stack(r["true_logit"]).float(),
                    "proposals": torch.stack(r["proposals"]).long()})
    return out


def _sequences(spec: PoolCacheSpec) -> list[tuple[torch.Tensor, int]]:
    path = spec.continuations_path(spec.acceptance_max_new_tokens)
    if finished_digest(path) is None:
        raise ValueError(f"the shared continuations {str(path)!r} are missing: build the acceptance cache first")
    return split_sequences(load_file(str(path)))


def _pack(prompts: list[torch.Tensor], parts: list[dict]) -> dict:
    seqs = [torch.cat([p, part["tokens"]]) for p, part in zip(prompts, parts)]
    zero = torch.zeros(1, dtype=torch.long)
    lengths = torch.tensor([s.numel() for s in seqs], dtype=torch.long)
    out = {"ids": torch.cat(seqs), "seq_offsets": torch.cat([zero, lengths.cumsum(0)]),
           "starts": torch.tensor([p.numel() for p in prompts], dtype=torch.long)}
    for name in ("topk_ids", "topk_logits", "lse", "true_logit", "proposals"):
        out[name] = torch.cat([part[name] for part in parts])
    return out


def open_or_sample_mentored(spec: PoolCacheSpec, drafter: str, points, width: int, *, model=None, tokenizer=None,
                            progress: bool = False) -> dict:
    """The rows file of every ``(rule, divergence, max_divergence)`` in ``points``, sampling the missing ones.

    Parameters
    ----------
    spec : PoolCacheSpec
        The pool's spec at one temperature (> 0), with its shared continuations built.
    drafter : str
        A prompt-lookup member of the pool (``ngram:<n>``).
    points : list of (str, str, float)
        Lossy points ``(rule, divergence, max_divergence)``: ``rule`` one of :data:`RULES`, a budget > 0.
    width : int
        Proposals kept per row (the largest gamma).
    model, tokenizer : optional
        The target and its tokenizer (default: loaded from ``spec`` on first need).
    progress : bool
        A progress bar over records.

    Returns
    -------
    dict
        ``(rule, divergence, max_divergence) -> Path`` of each point's finished rows file.
    """
    # deferred: mdboost.models imports transformers (seconds); a cache opens without it
    from mdboost.models.ngram import NgramDrafter
    from mdboost.models.specs import parse_drafter

    kind, n = parse_drafter(drafter)
    if kind != "ngram":
        raise ValueError(f"drafter must be a prompt-lookup member (ngram:<n>), got {drafter!r}")
    points = [(_check_rule(r), str(d), float(b)) for r, d, b in points]
    if any(b <= 0 for *_, b in points):
        raise ValueError(f"points must have budgets > 0 (budget 0 is SD: the target's text), got {points!r}")
    paths = {(r, d, b): mentored_path(spec, drafter, d, b, width, rule=r) for r, d, b in points}
    missing = [pt for pt, path in paths.items() if finished_digest(path) is None]
    if not missing:
        return paths
    folder = Path(spec.dir)
    folder.mkdir(parents=True, exist_ok=True)
    with file_lock(lock_path(folder / f"mentored-{drafter.replace(':', '_')}")):
        missing = [pt for pt in missing if finished_digest(paths[pt]) is None]  # another process may have
        if not missing:
            return paths
        if model is None:
            # deferred: mdboost.models imports transformers (seconds); a cache opens without it
            from mdboost.models.pool import build_pool

            pool = build_pool(spec.target, [], device=spec.device, home=spec.home)
            model, tokenizer = pool.target.model, pool.target.tokenizer
        records = spec.text.load()
        seqs = _sequences(spec)
        prompts = [ids[:start] for ids, start in seqs]
        parts = {pt: [] for pt in missing}
        bar = tqdm(list(zip(records, prompts)), desc=f"mentored continuations ({drafter}, T={spec.temperature:g})",
                   disable=not progress or bool(os.environ.get("TQDM_DISABLE")))
        seed = spec.text.seed
        for record, prompt in bar:
            gens = [torch.Generator().manual_seed(_point_seed(seed, record["id"], drafter, *pt)) for pt in missing]
            out = sample_mentored(model, prompt, NgramDrafter(n), missing, spec.temperature,
                                  spec.acceptance_max_new_tokens, gens, eos_token_id=tokenizer.eos_token_id,
                                  k=spec.folders.k, width=width)
            for pt, part in zip(missing, out):
                parts[pt].append(part)
        for pt in missing:
            paths[pt].parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temps(paths[pt].parent, prefix=FILE)
            atomic_save_tensors(_pack(prompts, parts[pt]), paths[pt])
    return paths


def load_mentored(path: str | os.PathLike) -> dict:
    """The tensors of a finished rows file (its bytes checked against the sidecar)."""
    path = Path(path)
    if finished_digest(path) is None:
        raise CacheCorruptionError(f"mentored rows {str(path)!r} are missing or do not match their .sha256")
    return load_file(str(path))


def attach_mentored(spec: PoolCacheSpec, pc, divergences, budgets, width: int, *, rules=("mentored",),
                    progress: bool = False, sample: bool = True):
    """``pc`` with the rows files of every prompt-lookup drafter at every lossy point of ``rules``.

    Every ``(rule, divergence, budget > 0)`` of ``rules`` x ``divergences`` x ``budgets`` gets a
    file per ``ngram`` member (:func:`open_or_sample_mentored`; ``rules`` of :data:`RULES`),
    stored in ``pc.mentored`` (``drafter -> {(rule, divergence, budget): path}``). Nothing is
    sampled at temperature 0 (no budget there), without a sampled acceptance cache (no shared
    prompts to continue) or without a lookup drafter. ``sample=False``: a missing file is a
    ``ValueError`` (re-scoring reads finished files only).
    """
    points = [(_check_rule(r), d, float(b)) for r in rules for d in divergences for b in budgets if b > 0]
    lookup = [m for m in pc.names if m != pc.target and pc.kind(m) == "ngram"]
    if spec.temperature <= 0 or not spec.sampled_acceptance or not points or not lookup:
        return pc
    model = tokenizer = None
    mentored = {}
    for drafter in lookup:
        missing = [(r, d, b) for r, d, b in points
                   if finished_digest(mentored_path(spec, drafter, d, b, width, rule=r)) is None]
        if missing and not sample:
            raise ValueError(f"the {' and '.join(sorted({r for r, *_ in missing}))} continuations of {drafter!r} at "
                             f"{[(d, b) for _, d, b in missing]} (T={spec.temperature:g}) are missing in "
                             f"{spec.dir!r}: run `mdboost rank` on this config first")
        if model is None and missing:
            # deferred: mdboost.models imports transformers (seconds); a cache opens without it
            from mdboost.models.pool import build_pool

            target = build_pool(spec.target, [], device=spec.device, home=spec.home).target
            model, tokenizer = target.model, target.tokenizer
        mentored[drafter] = open_or_sample_mentored(spec, drafter, points, width, model=model, tokenizer=tokenizer,
                                                    progress=progress)
    return dataclasses.replace(pc, mentored=mentored)
