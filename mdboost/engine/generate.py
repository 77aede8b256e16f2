"""The generation loop: autoregressive, speculative and mentored decoding from one code path.

One engine step (Leviathan et al. 2023; Chen et al. 2023; the paper's Section 5 for MD):

1. the drafter proposes ``K`` tokens with distributions ``p`` (``K = 0`` in ``ar`` mode, or
   when prompt lookup finds nothing);
2. ONE target forward over ``[pending tokens, d_1..d_K]`` gives ``q`` at the ``K + 1``
   positions (both through :func:`mdboost.logits_to_probs` with the same settings);
3. :func:`mdboost.md.verify.verify` accepts a prefix of the drafts with the MD clamp
   (``max_divergence = 0``: standard SD) and emits one more token (correction or bonus);
   with ``K = 0`` the token is sampled from ``q`` directly;
4. both KV caches are rolled back to the accepted prefix (:class:`mdboost.engine.kv.CachedLM`).

Modes: ``ar`` target only; ``sd`` lossless (budget 0: output distributed exactly as the
target's, and identical to target greedy decoding at temperature 0); ``md`` a divergence
budget ``max_divergence`` or an acceptance floor ``min_acceptance``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from mdboost.engine.drafting import SharedLayersDrafter, as_drafter, sample, shares_layers
from mdboost.engine.kv import CachedLM, left_pad
from mdboost.engine.stats import GenerationStats
from mdboost.md.probs import logits_to_probs
from mdboost.md.verify import SOLVE

MODES = ("ar", "sd", "md")


@dataclass
class GenerationOutput:
    """Result of :func:`generate`.

    Attributes
    ----------
    sequences : torch.LongTensor of shape (B, T + N)
        Each input row (as given, padding included) followed by its new tokens, right-padded
        with the pad token to the longest row. ``N <= max_new_tokens``.
    num_new_tokens : torch.LongTensor of shape (B,)
        New tokens per row (an EOS token included).
    stats : GenerationStats
    """

    sequences: torch.Tensor
    num_new_tokens: torch.Tensor
    stats: GenerationStats


class _Timer:
    """Accumulates wall time into a stats field; synchronizes CUDA only at the boundaries."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def _prompts(input_ids, attention_mask) -> list[list[int]]:
    if not torch.is_tensor(input_ids) or input_ids.ndim != 2 or input_ids.shape[1] < 1:
        got = tuple(input_ids.shape) if torch.is_tensor(input_ids) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a LongTensor [B, T] with T >= 1, got {got}")
    if attention_mask is None:
        return input_ids.tolist()
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must have shape {tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}")
    rows = [ids[m.bool()].tolist() for ids, m in zip(input_ids, attention_mask)]
    if min(len(r) for r in rows) < 1:
        raise ValueError("attention_mask leaves a row without any token")
    return rows


def _check_args(mode, drafter, gamma, max_new_tokens, max_divergence, min_acceptance):
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode != "ar" and drafter is None:
        raise ValueError(f"mode={mode!r} needs a drafter, got drafter=None")
    if int(gamma) != gamma or gamma < 1:
        raise ValueError(f"gamma must be a positive integer, got {gamma!r}")
    if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if max_divergence is None or not max_divergence >= 0:
        raise ValueError(f"max_divergence must be >= 0, got {max_divergence!r}")
    if min_acceptance is not None and not 0 <= min_acceptance <= 1:
        raise ValueError(f"min_acceptance must be in [0, 1] or None, got {min_acceptance!r}")
    lossy = max_divergence > 0 or min_acceptance is not None
    if mode == "sd" and lossy:
        raise ValueError(f"mode='sd' is lossless: max_divergence must be 0 and min_acceptance None, got {max_divergence!r}, {min_acceptance!r}")
    if mode == "md" and not lossy:
        raise ValueError("mode='md' needs max_divergence > 0 or min_acceptance (use mode='sd' for budget 0)")


def generate(
    target,
    input_ids: torch.Tensor,  # [B, T]
    *,
    drafter=None,
    mode: str = "ar",
    max_new_tokens: int = 32,
    gamma: int = 4,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    max_divergence: float = 0.0,
    min_acceptance: float | None = None,
    divergence="kl",
    md_top_k: int | None = None,
    md_solve: str = "needed",
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    attention_mask: torch.Tensor | None = None,  # [B, T]
    generator: torch.Generator | None = None,
    adaptive_gamma: bool = False,
    max_gamma: int | None = None,
    share_kv: bool = True,
    draft_confidence: float | None = None,
) -> GenerationOutput:
    """Generate with ``target``, optionally drafted by ``drafter`` (AR, SD or MD).

    Parameters
    ----------
    target : transformers causal LM
        The model whose distribution ``q`` is reproduced (``sd``) or approximated (``md``).
    input_ids : torch.LongTensor of shape (B, T)
        Prompts; rows may be left-padded (pass ``attention_mask``).
    drafter : causal LM, n-gram drafter (``propose(ids, k)``), drafter adapter, or None
        Must share the target's vocabulary. Ignored in ``ar`` mode.
    mode : {"ar", "sd", "md"}
    max_new_tokens : int
        New tokens per row, ``>= 1``.
    gamma : int, default=4
        Draft length per step (the initial one when ``adaptive_gamma``).
    temperature, top_k, top_p
        Sampling settings for both models (:func:`mdboost.logits_to_probs`); ``temperature=0``
        is greedy (one-hot ``p`` and ``q``; SD then accepts exactly the matching drafts).
    max_divergence : float, default=0.0
        MD budget ``D`` on ``D_f(pi || q)`` per position (``md`` mode).
    min_acceptance : float or None
        MD acceptance floor (the dual problem) instead of a budget.
    divergence : str or callable, default="kl"
        The f-divergence of the budget (see :mod:`mdboost.md.divergences`).
    md_top_k : int or None
        Solve MD on the target's top-k tokens only (Lemma 6.1); ``md`` mode only (ignored in
        ``sd``, where it would make verification lossy).
    md_solve : {"needed", "reached", "all"}, default="needed"
        Where ``md`` mode computes the clamp (:func:`mdboost.md.verify.verify`'s ``solve``):
        ``"needed"`` only at drafts SD would reject (fastest; the same tokens), ``"reached"``
        at every verified position (exact per-position stats: realized divergence and MD
        acceptance probability everywhere), ``"all"`` also after the first rejection.
    eos_token_id, pad_token_id : int or None
        A row stops after emitting ``eos_token_id``; shorter rows are padded with
        ``pad_token_id`` (default: ``eos_token_id``, else 0).
    attention_mask : torch.Tensor of shape (B, T) or None
        1 for prompt tokens, 0 for padding.
    generator : torch.Generator or None
        The only source of randomness (same seed, same output).
    adaptive_gamma : bool, default=False
        After each drafted step: ``gamma += 2`` if every row accepted every draft, else
        ``gamma = max(1, gamma - 1)`` (Hugging Face's "heuristic" schedule), capped at
        ``max_gamma`` (default ``4 * gamma``).
    share_kv : bool, default=True
        When the drafter's embeddings and layers are the target's own modules (an early-exit
        drafter of the pool), draft on top of the target's KV cache instead of a private one
        (:class:`mdboost.engine.drafting.SharedLayersDrafter`).
    draft_confidence : float or None
        Model drafters only: a row stops drafting in a step after a token whose probability
        under the drafter's raw softmax is below this value (Hugging Face's
        ``assistant_confidence_threshold``, 0.4 by default there); ``None`` (default) always
        drafts ``gamma`` tokens. Lossless: the stop depends on the drafter's outputs only.

    Returns
    -------
    GenerationOutput
    """
    _check_args(mode, drafter, gamma, max_new_tokens, max_divergence, min_acceptance)
    if md_solve not in SOLVE:
        raise ValueError(f"md_solve must be one of {SOLVE}, got {md_solve!r}")
    if draft_confidence is not None and not 0 <= draft_confidence <= 1:
        raise ValueError(f"draft_confidence must be in [0, 1] or None, got {draft_confidence!r}")
    if max_gamma is not None and (int(max_gamma) != max_gamma or max_gamma < 1):
        raise ValueError(f"max_gamma must be a positive integer or None, got {max_gamma!r}")
    prompts = _prompts(input_ids, attention_mask)
    device = input_ids.device
    vocab = target.config.get_text_config().vocab_size
    draft = as_drafter(drafter, vocab) if mode != "ar" else None
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    # md_top_k only in md mode: in sd it would replace q by its top-k (lossy)
    md_args = dict(max_divergence=max_divergence, min_acceptance=min_acceptance, divergence=divergence,
                   top_k=md_top_k if mode == "md" else None, solve=md_solve)
    stats = GenerationStats(mode=mode, budget=max_divergence if mode == "md" and max_divergence > 0 else None)
    timer = _Timer(device)
    start = timer.now()

    state = _State(prompts, max_new_tokens, eos_token_id)
    lm = CachedLM(target, len(prompts), device)
    if draft is not None and draft.kind == "model":
        if share_kv and shares_layers(draft.model, target):
            draft = SharedLayersDrafter(draft.model, lm, draft.stop_below)
        if draft_confidence is not None:  # else keep a given adapter's own setting
            draft.stop_below = draft_confidence
    if draft is not None:
        draft.start(prompts, device)
    k_now, k_cap = int(gamma), int(max_gamma or 4 * gamma)
    # deterministic decoding (greedy, no budget): an undrafted step takes the argmax directly
    greedy = temperature == 0 and max_divergence == 0 and min_acceptance is None
    # inference mode, not just no_grad: no version counters or view tracking on the cache
    # tensors (about 6% per CPU forward of SmolLM2-135M); nothing created here leaks out
    with torch.inference_mode():
        while state.active_rows():
            k = 0 if draft is None else min(k_now, state.max_remaining() - 1)
            lengths = _step(lm, draft, state, k, sampling, md_args, generator, stats, timer, greedy)
            if adaptive_gamma and k:
                full = all(state.last_accepted[b] == k == lengths[b] for b in state.last_active)
                k_now = min(k_now + 2, k_cap) if full else max(1, k_now - 1)

    stats.time_total = timer.now() - start
    pad = pad_token_id if pad_token_id is not None else (eos_token_id if eos_token_id is not None else 0)
    return state.output(input_ids, pad, stats)


def _step(lm, draft, state, k, sampling, md_args, generator, stats, timer, greedy=False) -> list[int]:
    """One draft / score / verify / roll back step; returns the per-row draft lengths.

    ``greedy``: the output is deterministic (temperature 0, no budget), so a step without
    drafts takes the target's argmax (what sampling its one-hot ``q`` gives) without building
    ``q`` or drawing from the generator (nothing later depends on the generator then).
    """
    batch = len(state.pending)
    t0 = timer.now()
    if k:
        drafts, draft_probs, lengths = draft.propose(k, sampling, generator, state.contexts())
    else:
        drafts, draft_probs, lengths = None, None, [0] * batch
    width = drafts.shape[1] if drafts is not None else 0
    t1 = timer.now()

    chunk, valid = left_pad(state.pending, 0, lm.valid.device)
    if width:
        chunk = torch.cat([chunk, drafts], dim=1)
        valid = torch.cat([valid, torch.ones_like(drafts, dtype=torch.bool)], dim=1)
    logits = lm.forward(chunk, valid, logits_to_keep=width + 1)  # [B, width + 1, V]
    if not greedy:
        target_probs = logits_to_probs(logits, **sampling)
    t2 = timer.now()

    if greedy:  # the argmax on which logits_to_probs(temperature=0) puts its one-hot
        num_accepted, new_tokens = _verify_greedy(drafts, logits, lengths, stats, state)
    elif width:
        num_accepted, new_tokens = _verify(drafts, draft_probs, target_probs, lengths, md_args, generator, stats, state)
    else:
        num_accepted, new_tokens = [0] * batch, sample(target_probs[:, 0], generator).tolist()
    t3 = timer.now()

    lm.keep([chunk.shape[1] - width + n for n in num_accepted])
    if draft is not None:
        draft.commit(num_accepted, new_tokens)
    stats.num_target_calls += 1
    stats.time_drafter += t1 - t0
    stats.time_target += t2 - t1
    stats.time_verify += t3 - t2
    draft_rows = drafts.tolist() if width else [[]] * batch
    stats.num_new_tokens += state.append(draft_rows, num_accepted, new_tokens, lengths, stats)
    return lengths


def _verify_greedy(drafts, logits, lengths, stats, state):  # [B, K] or None, [B, K+1, V]
    """Lossless verification of greedy decoding (temperature 0, no budget) without building ``q``.

    With one-hot ``q`` (the target's argmax) SD accepts a draft iff it equals the argmax, and
    the correction/bonus token is the argmax at the first mismatch (or at the row's draft
    length): exactly :func:`verify` at budget 0 on these inputs, without its ``[B, K+1, V]``
    probabilities or random draws. Stats: acceptance probability 1 on a match, 0 otherwise;
    divergence 0.
    """
    if torch.isnan(logits).any():  # logits_to_probs's check
        raise ValueError("logits contains NaN")
    best = logits.argmax(dim=-1).tolist()  # [B][K + 1]
    rows = drafts.tolist() if drafts is not None else [[] for _ in best]
    num_accepted, new_tokens = [], []
    for b, (row, top) in enumerate(zip(rows, best)):
        match = [float(x == y) for x, y in zip(row[: lengths[b]], top)]
        n = match.index(0.0) if 0.0 in match else len(match)
        num_accepted.append(n)
        new_tokens.append(top[n])
        if state.active[b] and lengths[b]:
            visited = min(n + 1, lengths[b])
            stats.add_verified([0.0] * visited, match[:visited])
    return num_accepted, new_tokens


def _verify(drafts, draft_probs, target_probs, lengths, md_args, generator, stats, state):
    """Run ``verify``; rows with fewer valid drafts than the width stop at their length.

    A row with ``lengths[b] < K`` that accepted all its valid drafts takes its next token
    from ``q`` at position ``lengths[b]`` instead (what a length-``lengths[b]`` draft would
    give: the bonus token of SD and MD is always drawn from ``q``).
    """
    from mdboost.md.verify import verify

    result = verify(drafts, draft_probs, target_probs, generator=generator, validate=False, **md_args)
    tokens = result.tokens.tolist()
    num_accepted = result.num_accepted.tolist()
    new_tokens = [row[n] for row, n in zip(tokens, num_accepted)]
    width = drafts.shape[1]
    short = [b for b, (n, k) in enumerate(zip(num_accepted, lengths)) if k < width and n >= k]
    if short:
        index = torch.tensor(short, device=target_probs.device)
        at = torch.tensor([lengths[b] for b in short], device=target_probs.device)
        resampled = sample(target_probs[index, at], generator).tolist()
        for b, tok in zip(short, resampled):
            num_accepted[b], new_tokens[b] = lengths[b], tok
    _divergence_stats(result, num_accepted, lengths, stats, state)
    return num_accepted, new_tokens


def _divergence_stats(result, num_accepted, lengths, stats, state) -> None:
    """Realized divergence, MD acceptance probability and budget-only acceptances at the
    verified positions of active rows (divergence and probability where the clamp was solved)."""
    divergence = result.divergence.tolist()  # [B, K]; NaN where not solved (md_solve)
    acc_prob = result.acceptance_probability.tolist()  # [B, K]
    by_budget = result.accepted_by_budget.tolist()  # [B, K]
    for b in state.active_rows():
        visited = min(num_accepted[b] + 1, lengths[b])  # positions whose distribution was used
        stats.add_verified(divergence[b][:visited], acc_prob[b][:visited], sum(by_budget[b][: num_accepted[b]]))


class _State:
    """Per-row token lists: prompt, generated tokens, target-pending tokens, activity."""

    def __init__(self, prompts, max_new_tokens, eos_token_id):
        self.prompts = prompts
        self.generated = [[] for _ in prompts]
        self.pending = [list(p) for p in prompts]  # tokens not yet in the target cache
        self.active = [True] * len(prompts)
        self.max_new = max_new_tokens
        self.eos = eos_token_id
        self.last_active: list[int] = []
        self.last_accepted: list[int] = []

    def active_rows(self) -> list[int]:
        return [b for b, a in enumerate(self.active) if a]

    def max_remaining(self) -> int:
        return max(self.max_new - len(self.generated[b]) for b in self.active_rows())

    def contexts(self) -> list[list[int]]:
        return [p + g for p, g in zip(self.prompts, self.generated)]

    def append(self, drafts, num_accepted, new_tokens, lengths, stats) -> int:
        """Record one step's emitted tokens; returns how many count as new (active rows only)."""
        self.last_active, self.last_accepted = self.active_rows(), num_accepted
        stats.add_position_counts([lengths[b] for b in self.last_active], [num_accepted[b] for b in self.last_active])
        added = 0
        for b in self.last_active:
            emitted = drafts[b][: num_accepted[b]] + [new_tokens[b]]
            if self.eos is not None and self.eos in emitted:
                emitted = emitted[: emitted.index(self.eos) + 1]
                self.active[b] = False
            emitted = emitted[: self.max_new - len(self.generated[b])]
            self.generated[b] += emitted
            added += len(emitted)
            if len(self.generated[b]) >= self.max_new:
                self.active[b] = False
        self.pending = [[t] for t in new_tokens]
        return added

    def output(self, input_ids, pad, stats) -> GenerationOutput:
        width = max(len(g) for g in self.generated)
        new = torch.full((len(self.generated), width), pad, dtype=torch.long)
        for b, g in enumerate(self.generated):
            new[b, : len(g)] = torch.tensor(g, dtype=torch.long)
        counts = torch.tensor([len(g) for g in self.generated], dtype=torch.long)
        sequences = torch.cat([input_ids, new.to(input_ids.device)], dim=1)
        return GenerationOutput(sequences=sequences, num_new_tokens=counts.to(input_ids.device), stats=stats)
