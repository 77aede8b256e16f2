"""The generation loop: autoregressive, speculative and mentored decoding from one code path.

One engine step (Leviathan et al. 2023; Chen et al. 2023; the paper's Section 5 for MD):

1. the drafter proposes up to ``K`` tokens with distributions ``p`` (none without a drafter,
   or when prompt lookup finds nothing);
2. ONE target forward over ``[pending tokens, d_1..d_K]`` gives ``q`` at the ``K + 1``
   positions (both through :func:`mdboost.logits_to_probs` with the same settings);
3. :func:`mdboost.md.verify.verify` accepts a prefix of the drafts with the MD clamp
   (budget 0: standard SD) and emits one more token (correction or bonus); with ``K = 0``
   the token is sampled from ``q`` directly;
4. both KV caches are rolled back to the accepted prefix (:class:`mdboost.engine.kv.CachedLM`,
   the drafter's :meth:`~mdboost.engine.drafting.DraftSession.commit`), and the drafter's
   schedule sees the outcome (:meth:`~mdboost.engine.drafting.DraftSession.update`).

Modes follow from the arguments: no drafter is AR (target only); a drafter with no budget in
the settings is lossless SD (output distributed exactly as the target's, and identical to
target greedy decoding at temperature 0); a drafter with ``max_divergence > 0`` or
``min_acceptance`` is MD, and so is one with a ``mentor`` (an explicit emitted distribution per
drafted position, e.g. the boosted member of the TV optimal set).
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from mdboost.engine.drafting import Drafter, sample
from mdboost.engine.hooks import context_ids, process_logits, stop_lengths
from mdboost.engine.kv import LMBackend, left_pad, open_lm
from mdboost.engine.settings import GenerationSettings
from mdboost.engine.stats import GenerationStats
from mdboost.md.probs import logits_to_probs
from mdboost.md.verify import verify
from mdboost.models.loading import synchronize

DEFAULT_SETTINGS = GenerationSettings()


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
        self.device = device

    def now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()


def _prompts(input_ids, attention_mask) -> list[list[int]]:
    if not torch.is_tensor(input_ids) or input_ids.ndim != 2 or input_ids.shape[1] < 1:
        got = tuple(input_ids.shape) if torch.is_tensor(input_ids) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a LongTensor [B, T] with T >= 1, got {got}")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.shape[0] < 1:
        raise ValueError(f"input_ids must hold at least one row, got shape {tuple(input_ids.shape)}")
    if attention_mask is not None and not torch.is_tensor(attention_mask):
        raise TypeError(f"attention_mask must be a tensor [B, T] or None, got {type(attention_mask).__name__}")
    if attention_mask is None:
        return input_ids.tolist()
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must have shape {tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}")
    rows = [ids[m.bool()].tolist() for ids, m in zip(input_ids, attention_mask)]
    if min(len(r) for r in rows) < 1:
        raise ValueError("attention_mask leaves a row without any token")
    return rows


def generate(
    target,
    input_ids: torch.Tensor,  # [B, T]
    settings: GenerationSettings = DEFAULT_SETTINGS,
    *,
    drafter: Drafter | None = None,
    attention_mask: torch.Tensor | None = None,  # [B, T]
    generator: torch.Generator | None = None,
    on_tokens=None,
) -> GenerationOutput:
    """Generate with ``target``, drafted by ``drafter`` (SD or MD) or alone (AR).

    Parameters
    ----------
    target : transformers PreTrainedModel or LMBackend
        The causal LM whose distribution ``q`` is reproduced (SD) or approximated (MD): a
        transformers model, or a model that runs its own forward passes
        (:class:`~mdboost.engine.llamacpp.LlamaCppModel`: llama.cpp, batch size 1).
    input_ids : torch.LongTensor of shape (B, T)
        Prompts; rows may be left-padded (pass ``attention_mask``).
    settings : GenerationSettings, default=GenerationSettings()
        Sampling, MD budget, draft length, new tokens, EOS / pad ids (validated when built).
        Without a drafter the budget does not apply (the same settings serve an AR baseline).
    drafter : Drafter or None
        A :class:`~mdboost.engine.drafting.ModelDrafter`, an
        :class:`~mdboost.engine.drafting.NgramAdapter` or any :class:`Drafter` (convert a pool
        member with :func:`~mdboost.engine.drafting.as_drafter`); it must share the target's
        vocabulary. ``None``: AR decoding. It is not changed: its state for this call comes
        from its ``start``.
    attention_mask : torch.Tensor of shape (B, T) or None
        1 for prompt tokens, 0 for padding.
    generator : torch.Generator or None
        The only source of randomness (same seed, same output).
    on_tokens : callable or None
        Called after each step with one list per row of the tokens it emitted in that step
        (empty for rows already done), e.g. to stream them.

    Returns
    -------
    GenerationOutput
    """
    if not isinstance(target, (PreTrainedModel, LMBackend)):
        raise TypeError(f"target must be a transformers PreTrainedModel (a causal LM, e.g. from "
                        f"mdboost.models.load_model) or an LMBackend (e.g. mdboost.engine.llamacpp.LlamaCppModel), "
                        f"got {type(target).__name__}")
    if not isinstance(settings, GenerationSettings):
        raise TypeError(f"settings must be a GenerationSettings, got {type(settings).__name__}")
    if drafter is not None and not isinstance(drafter, Drafter):
        raise TypeError(f"drafter must be a Drafter or None (convert a model or n-gram drafter with as_drafter), "
                        f"got {type(drafter).__name__}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if on_tokens is not None and not callable(on_tokens):
        raise TypeError(f"on_tokens must be a callable or None, got {on_tokens!r}")
    prompts = _prompts(input_ids, attention_mask)
    vocab = target.vocab_size if isinstance(target, LMBackend) else getattr(getattr(target, "config", None),
                                                                           "vocab_size", None)
    if vocab is not None and prompts:
        lo, hi = min(min(r) for r in prompts), max(max(r) for r in prompts)
        if lo < 0 or hi >= vocab:
            raise ValueError(f"input_ids holds token id {lo if lo < 0 else hi} outside the target's vocabulary "
                             f"[0, {vocab})")
    # the settings checked them >= 0. EOS must be a token the target can emit; the pad id only fills
    # finished rows (transformers allows one outside the vocabulary, e.g. an added [PAD] without
    # resized embeddings), unless a logits processor indexes the scores with the padded rows
    checked = ("eos_token_id", "pad_token_id") if settings.logits_processor is not None else ("eos_token_id",)
    for name in checked:
        value = getattr(settings, name)
        if vocab is not None and value is not None and value >= vocab:
            raise ValueError(f"settings.{name}={value} is outside the target's vocabulary [0, {vocab})"
                             + (" (the logits processor reads the pad-filled rows)" if name == "pad_token_id" else ""))
    device = input_ids.device
    mode = "ar" if drafter is None else ("md" if settings.lossy else "sd")
    stats = GenerationStats(mode=mode, budget=settings.max_divergence if mode == "md" and settings.max_divergence > 0 else None)
    timer = _Timer(device)
    start = timer.now()

    state = _State(prompts, settings.max_new_tokens, settings.eos_token_id, settings.stopping_criteria, settings.pad_id,
                   device)
    lm = open_lm(target, len(prompts), device)
    session = drafter.start(prompts, lm, settings) if drafter is not None else None
    # deterministic decoding (greedy, no budget): an undrafted step takes the argmax directly
    greedy = settings.temperature == 0 and mode != "md"
    sampling, md_args = settings.sampling, settings.verify_args
    # inference mode, not just no_grad: no version counters or view tracking on the cache
    # tensors (about 6% per CPU forward of SmolLM2-135M); nothing created here leaks out
    with torch.inference_mode():
        while state.active_rows():
            limit = 0 if session is None else state.max_remaining() - 1
            _step(lm, session, state, limit, sampling, md_args, generator, stats, timer, greedy,
                  settings.logits_processor, settings.pad_id)
            if stats.num_target_calls == 1:
                stats.time_first_step = timer.now() - start
            if on_tokens is not None:
                on_tokens(state.last_emitted)

    stats.time_total = timer.now() - start
    return state.output(input_ids, settings.pad_id, stats)


def _step(lm, session, state, limit, sampling, md_args, generator, stats, timer, greedy=False,
          processor=None, pad_id=0) -> None:
    """One draft / score / verify / roll back step; ``limit`` caps the drafts (0: none).

    ``processor``: the settings' ``logits_processor``, applied to the target's logits at each
    scored position (:mod:`mdboost.engine.hooks`) before anything reads them.

    ``greedy``: the output is deterministic (temperature 0, no budget), so a step without
    drafts takes the target's argmax (what sampling its one-hot ``q`` gives) without building
    ``q`` or drawing from the generator (nothing later depends on the generator then).
    """
    batch = len(state.pending)
    t0 = timer.now()
    if limit:
        drafts, draft_probs, lengths = session.propose(state.contexts(), limit, generator)
    else:
        drafts, draft_probs, lengths = None, None, [0] * batch
    t1 = timer.now()
    if limit:  # after the drafter's time: the check is the engine's
        _check_proposal(drafts, draft_probs, lengths, batch, limit, lm.vocab_size)
    width = drafts.shape[1] if drafts is not None else 0

    chunk, valid = left_pad(state.pending, 0, lm.device)
    if width:
        chunk = torch.cat([chunk, drafts], dim=1)
        valid = torch.cat([valid, torch.ones_like(drafts, dtype=torch.bool)], dim=1)
    logits = lm.forward(chunk, valid, logits_to_keep=width + 1)  # [B, width + 1, V]
    if processor is not None:
        logits = process_logits(processor, context_ids(state.contexts(), pad_id, lm.device), drafts, logits)
    if not greedy:
        target_probs = logits_to_probs(logits, **sampling)
    t2 = timer.now()

    verified = None  # per row: (divergences, acceptance probabilities, accepted by the budget) per position
    if greedy:  # the argmax on which logits_to_probs(temperature=0) puts its one-hot
        num_accepted, new_tokens, verified = _verify_greedy(drafts, logits, lengths)
    elif width:
        num_accepted, new_tokens, verified = _verify(drafts, draft_probs, target_probs, lengths, md_args, generator)
    else:
        num_accepted, new_tokens = [0] * batch, sample(target_probs[:, 0], generator).tolist()
    t3 = timer.now()

    lm.keep([chunk.shape[1] - width + n for n in num_accepted])
    if session is not None:
        session.commit(num_accepted, new_tokens)
    stats.num_target_calls += 1
    stats.time_drafter += t1 - t0
    stats.time_target += t2 - t1
    stats.time_verify += t3 - t2
    draft_rows = drafts.tolist() if width else [[]] * batch
    stats.num_new_tokens += state.append(draft_rows, num_accepted, new_tokens, lengths, stats, verified)
    if limit:
        session.update([num_accepted[b] for b in state.last_active], [lengths[b] for b in state.last_active])


def _check_proposal(drafts, draft_probs, lengths, batch, limit, vocab) -> None:
    """A drafter session's ``propose`` output, checked before the target reads it (any ``DraftSession`` may be user code)."""
    if not torch.is_tensor(drafts) or drafts.ndim != 2 or drafts.shape[0] != batch or drafts.shape[1] > limit:
        got = tuple(drafts.shape) if torch.is_tensor(drafts) else type(drafts).__name__
        raise ValueError(f"drafter propose must return tokens [B={batch}, w] with w <= max_tokens={limit}, got {got}")
    if drafts.is_floating_point() or drafts.is_complex() or drafts.dtype == torch.bool:
        raise TypeError(f"drafter propose must return integer token ids, got dtype {drafts.dtype}")
    width = drafts.shape[1]
    if not torch.is_tensor(draft_probs) or tuple(draft_probs.shape) != (batch, width, vocab):
        got = tuple(draft_probs.shape) if torch.is_tensor(draft_probs) else type(draft_probs).__name__
        raise ValueError(f"drafter propose must return probs [B, w, V] = {(batch, width, vocab)} (V: the target's "
                         f"vocab_size), got {got}")
    outside = (drafts < 0) | (drafts >= vocab)
    if width and bool(outside.any()):
        raise ValueError(f"drafter propose returned token id {drafts[outside][0].item()} outside the target's "
                         f"vocabulary [0, {vocab})")
    if len(lengths) != batch or not all(isinstance(k, numbers.Integral) and not isinstance(k, bool) and 0 <= k <= width
                                        for k in lengths):
        raise ValueError(f"drafter propose must return lengths: {batch} ints in [0, {width}], got {lengths!r}")


def _verify_greedy(drafts, logits, lengths):  # [B, K] or None, [B, K+1, V]
    """Lossless verification of greedy decoding (temperature 0, no budget) without building ``q``.

    With one-hot ``q`` (the target's argmax) SD accepts a draft iff it equals the argmax, and
    the correction/bonus token is the argmax at the first mismatch (or at the row's draft
    length): exactly :func:`verify` at budget 0 on these inputs, without its ``[B, K+1, V]``
    probabilities or random draws. Per-position stats (as :func:`_verify`'s): acceptance
    probability 1 on a match, 0 otherwise; divergence 0.
    """
    if torch.isnan(logits).any():  # logits_to_probs's check
        raise ValueError("logits contains NaN")
    best = logits.argmax(dim=-1).tolist()  # [B][K + 1]
    rows = drafts.tolist() if drafts is not None else [[] for _ in best]
    num_accepted, new_tokens, verified = [], [], []
    for b, (row, top) in enumerate(zip(rows, best)):
        match = [float(x == y) for x, y in zip(row[: lengths[b]], top)]
        n = match.index(0.0) if 0.0 in match else len(match)
        num_accepted.append(n)
        new_tokens.append(top[n])
        verified.append(([0.0] * len(match), match, [False] * len(match)))
    return num_accepted, new_tokens, verified


def _verify(drafts, draft_probs, target_probs, lengths, md_args, generator):
    """Run ``verify``; rows with fewer valid drafts than the width stop at their length.

    A row with ``lengths[b] < K`` that accepted all its valid drafts takes its next token
    from ``q`` at position ``lengths[b]`` instead (what a length-``lengths[b]`` draft would
    give: the bonus token of SD and MD is always drawn from ``q``).

    Returns ``num_accepted``, ``new_tokens`` and per row the stats of its verified positions
    (its first ``lengths[b]``): realized divergence (NaN where the clamp was not solved, see
    ``md_solve``), MD acceptance probability, and whether the budget alone accepted the draft.
    """
    if md_args.get("mentor") is not None:  # GenerationSettings.mentor: the emitted distribution per position
        md_args = dict(md_args)
        md_args["mentored_probs"] = md_args.pop("mentor")(draft_probs, target_probs[:, :drafts.shape[1]])
    if md_args.get("rule") is not None:  # GenerationSettings.rule (mdboost.md.rules)
        result = md_args["rule"].verify(drafts, draft_probs, target_probs, generator=generator, validate=False,
                                        divergence=md_args["divergence"])
    else:
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
    columns = (result.divergence.tolist(), result.acceptance_probability.tolist(), result.accepted_by_budget.tolist())
    verified = [tuple(col[b][: lengths[b]] for col in columns) for b in range(len(lengths))]  # [B, K] each
    return num_accepted, new_tokens, verified


class _State:
    """Per-row token lists: prompt, generated tokens, target-pending tokens, activity."""

    def __init__(self, prompts, max_new_tokens, eos_token_id, stopping_criteria=None, pad_id=0, device="cpu"):
        self.prompts = prompts
        self.generated = [[] for _ in prompts]
        self.pending = [list(p) for p in prompts]  # tokens not yet in the target cache
        self.active = [True] * len(prompts)
        self.max_new = max_new_tokens
        self.eos = eos_token_id
        self.stop, self.pad, self.device = stopping_criteria, pad_id, device
        self.last_active: list[int] = []
        self.last_emitted: list[list[int]] = [[] for _ in prompts]
        self.last_accepted: list[int] = []

    def active_rows(self) -> list[int]:
        return [b for b, a in enumerate(self.active) if a]

    def max_remaining(self) -> int:
        return max(self.max_new - len(self.generated[b]) for b in self.active_rows())

    def contexts(self) -> list[list[int]]:
        return [p + g for p, g in zip(self.prompts, self.generated)]

    def append(self, drafts, num_accepted, new_tokens, lengths, stats, verified=None) -> int:
        """Record one step's emitted tokens; returns how many count as new (active rows only).

        ``verified``: per row, the stats of its verified positions (see :func:`_verify`), or
        None (no drafts): counted for the positions whose token the row emits.
        """
        self.last_active, self.last_accepted = self.active_rows(), num_accepted
        emitted = {}
        for b in self.last_active:
            row = drafts[b][: num_accepted[b]] + [new_tokens[b]]
            if self.eos is not None and self.eos in row:
                row = row[: row.index(self.eos) + 1]
                self.active[b] = False
            emitted[b] = row[: self.max_new - len(self.generated[b])]
        if self.stop is not None:
            for b, n in stop_lengths(self.stop, self.contexts(), emitted, self.pad, self.device).items():
                emitted[b], self.active[b] = emitted[b][:n], False
        # the per-position and verified-position stats of what the row emits (position j's
        # distribution gave its j-th token): where EOS, max_new_tokens or a stopping criterion cut
        # the row inside its accepted drafts, the drafts after the cut are discarded and not counted
        drafted, accepted = [], []
        for b in self.last_active:
            n = len(emitted[b])
            cut = n < num_accepted[b] + 1
            drafted.append(n if cut else lengths[b])
            accepted.append(min(num_accepted[b], n))
            if verified is not None and lengths[b]:
                used = min(n, lengths[b])  # every drafted position up to the first rejection, or the cut
                divergences, acc_probs, by_budget = verified[b]
                stats.add_verified(divergences[:used], acc_probs[:used], sum(by_budget[: accepted[-1]]))
        stats.add_position_counts(drafted, accepted)
        self.last_emitted = [emitted.get(b, []) for b in range(len(self.generated))]
        for b, row in emitted.items():
            self.generated[b] += row
            if len(self.generated[b]) >= self.max_new:
                self.active[b] = False
        self.pending = [[t] for t in new_tokens]
        return sum(len(row) for row in emitted.values())

    def output(self, input_ids, pad, stats) -> GenerationOutput:
        width = max(len(g) for g in self.generated)
        new = torch.full((len(self.generated), width), pad, dtype=torch.long)
        for b, g in enumerate(self.generated):
            new[b, : len(g)] = torch.tensor(g, dtype=torch.long)
        counts = torch.tensor([len(g) for g in self.generated], dtype=torch.long)
        sequences = torch.cat([input_ids, new.to(input_ids.device)], dim=1)
        return GenerationOutput(sequences=sequences, num_new_tokens=counts.to(input_ids.device), stats=stats)
