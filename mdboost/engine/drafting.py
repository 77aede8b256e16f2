"""Drafters: how the engine gets draft tokens and their distribution ``p``.

The interface has two halves, so that a drafter passed to :func:`mdboost.engine.generate` is
never changed by it:

- a :class:`Drafter` is configuration (a model, its schedule), frozen; its ``start`` makes
- a :class:`DraftSession`, the state of one generation (caches, pending tokens, current draft
  length), with ``propose`` (drafts ``[B, w]``, their distributions ``[B, w, V]``, per-row
  lengths), ``commit`` (keep what the target accepted, roll back the rest) and ``update``
  (after each verification: the schedule adapts the draft length, as transformers'
  ``CandidateGenerator.update_candidate_strategy``).

Two drafters:

- :class:`ModelDrafter` wraps a causal LM of the pool (a smaller model, an early-exit or
  int8 drafter). It samples each draft token from ``p = logits_to_probs(drafter logits)``
  with the target's sampling settings, so ``p`` and ``q`` are comparable (``docs/theory.md``
  section 1). Where its KV cache lives follows one rule: a drafter whose embeddings and
  decoder layers are the target's first layers (:func:`shares_layers`, the pool's
  ``early_exit:N`` and ``tuned:N``) drafts on the target's own cache
  (:meth:`mdboost.engine.kv.CachedLM.layer_view`), unless built with ``share_kv=False``;
  any other drafter has a private cache.
- :class:`NgramAdapter` wraps the model-free prompt-lookup drafter: one-hot draft
  distributions, no cache, possibly fewer tokens than asked per row (``lengths``).

:func:`as_drafter` converts a pool member (a transformers model or an
:class:`~mdboost.models.ngram.NgramDrafter`) into one of them.

A private drafter cache holds every token of a row except its "pending" ones (at most two:
the last accepted draft when every draft was accepted, and the token the target emitted).
The next ``propose`` feeds the pending tokens in one forward, then one token per draft step.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import PreTrainedModel

from mdboost.engine.hooks import context_ids, process_at
from mdboost.engine.kv import CachedLM, LMBackend, left_pad, model_vocab_size, open_lm
from mdboost.engine.schedule import ConfidenceStop, DraftSchedule, FixedDraftLength
from mdboost.md._checks import check_positive_int
from mdboost.md.drafting import draft_confidence
from mdboost.md.probs import logits_to_probs
from mdboost.models.ngram import NgramDrafter
from mdboost.models.pool import PoolMember


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:  # [B, V] -> [B]
    """One token per row from ``probs``, drawn on the generator's device.

    A CPU generator with probabilities on another device draws from a CPU copy (the same
    draws as for a CPU model); otherwise the draw stays where ``probs`` is.
    """
    if generator is not None and generator.device.type == "cpu" and probs.device.type != "cpu":
        return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(probs.device)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class DraftSession(abc.ABC):
    """The per-generation state of a drafter, made by :meth:`Drafter.start`."""

    @abc.abstractmethod
    def propose(self, contexts: list[list[int]], max_tokens: int, generator: torch.Generator | None
                ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Draft at most ``max_tokens`` (``>= 1``) tokens per row after ``contexts``.

        ``contexts[b]``: row ``b``'s prompt and generated tokens so far.

        Returns
        -------
        tokens : torch.LongTensor of shape (B, w)
            ``w <= max_tokens``, the longest row's draft; shorter rows are padded.
        probs : torch.Tensor of shape (B, w, V)
            The distribution ``p`` each token was drawn from.
        lengths : list of int
            Valid drafts per row (``<= w``).
        """

    @abc.abstractmethod
    def commit(self, num_accepted: list[int], new_tokens: list[int]) -> None:
        """After verification: row ``b`` kept ``num_accepted[b]`` drafts, then ``new_tokens[b]``."""

    @abc.abstractmethod
    def update(self, num_accepted: list[int], lengths: list[int]) -> None:
        """After a drafted step, per row still generating: accepted drafts and draft lengths."""


class Drafter(abc.ABC):
    """A drafter: settings only. Each generation gets its state from :meth:`start`."""

    @abc.abstractmethod
    def start(self, prompts: list[list[int]], target: CachedLM, settings) -> DraftSession:
        """Begin a generation of ``prompts`` for ``target`` (whose cache is still empty).

        ``settings`` is the call's :class:`~mdboost.engine.settings.GenerationSettings`
        (sampling of ``p``, initial draft length ``gamma``).
        """


class _ScheduledSession(DraftSession):
    """A session whose draft length follows a :class:`~mdboost.engine.schedule.DraftSchedule`."""

    def __init__(self, schedule: DraftSchedule, gamma: int):
        self._schedule, self._gamma = schedule, gamma
        first = getattr(schedule, "first_length", None)  # optional: a schedule whose cap may be below gamma
        self._length = gamma if first is None else self._checked(first(gamma), "first_length")
        self._drafted = 0

    def _checked(self, length, method: str) -> int:  # a schedule may be user code: named here, not deep in a draft
        return check_positive_int(f"the draft length from {type(self._schedule).__name__}.{method}", length,
                                  allow_none=False)

    def _draft_length(self, max_tokens: int) -> int:
        self._drafted = min(self._length, max_tokens)
        return self._drafted

    def update(self, num_accepted: list[int], lengths: list[int]) -> None:
        self._length = self._checked(self._schedule.next_length(self._length, self._gamma, self._drafted, lengths,
                                                                num_accepted), "next_length")


def _check_schedule(schedule) -> None:
    if not callable(getattr(schedule, "next_length", None)):
        raise TypeError(f"schedule must be a DraftSchedule (an object with next_length), e.g. FixedDraftLength(), "
                        f"got {schedule!r}")


def shares_layers(drafter, target) -> bool:
    """True when ``drafter``'s embeddings and decoder layers are the target's first ones (same modules)."""
    try:
        d, t = drafter.model, target.model
        return d.embed_tokens is t.embed_tokens and len(d.layers) < len(t.layers) and all(
            a is b for a, b in zip(d.layers, t.layers))
    except AttributeError:
        return False


@dataclass(frozen=True, eq=False)
class ModelDrafter(Drafter):
    """A causal LM drafter.

    Parameters
    ----------
    model : transformers causal LM or LMBackend
        Must share the target's vocabulary (same logits width); an
        :class:`~mdboost.engine.kv.LMBackend` (a llama.cpp GGUF,
        :class:`~mdboost.engine.llamacpp.LlamaCppModel`) drafts with its own cache.
    schedule : DraftSchedule, default=FixedDraftLength()
        Draft length per step (e.g. :class:`~mdboost.engine.schedule.AdaptiveDraftLength`).
    confidence_stop : ConfidenceStop or None, default=None
        Rows stop drafting after an unconfident token (``None``: always the full length).
    share_kv : bool, default=True
        Draft on the target's own KV cache when ``model``'s embeddings and decoder layers are
        the target's first ones (:func:`shares_layers`); ``False``: always a private cache.
        The drafts are the same either way.
    """

    model: object
    schedule: DraftSchedule = field(default_factory=FixedDraftLength)
    confidence_stop: ConfidenceStop | None = None
    share_kv: bool = True

    def __post_init__(self):  # named here, not as an AttributeError in the first step
        config = getattr(self.model, "config", None)
        if not (isinstance(self.model, LMBackend)
                or (callable(self.model) and callable(getattr(config, "get_text_config", None)))):
            raise TypeError(f"model must be a transformers causal LM (a module with a config) or an LMBackend "
                            f"(e.g. mdboost.engine.llamacpp.LlamaCppModel), got {type(self.model).__name__}")
        _check_schedule(self.schedule)
        if self.confidence_stop is not None and not callable(getattr(self.confidence_stop, "stops", None)):
            raise TypeError(f"confidence_stop must be a ConfidenceStop or None, got {self.confidence_stop!r}")
        if not isinstance(self.share_kv, (bool, np.bool_)):
            raise TypeError(f"share_kv must be True or False, got {self.share_kv!r}")

    def start(self, prompts, target, settings) -> DraftSession:
        width = model_vocab_size(self.model)
        if width != target.vocab_size:
            raise ValueError(f"drafter vocab_size ({width}) must equal the target's ({target.vocab_size})")
        if self.share_kv and isinstance(target, CachedLM) and shares_layers(self.model, target.model):
            return _SharedCacheSession(self, target, settings)
        return _PrivateCacheSession(self, prompts, target.device, settings)


class _PrivateCacheSession(_ScheduledSession):
    """A model drafter with its own KV cache."""

    def __init__(self, drafter: ModelDrafter, prompts, device, settings):
        super().__init__(drafter.schedule, settings.gamma)
        self._stop, self._sampling = drafter.confidence_stop, settings.sampling
        self._processor, self._pad, self._greedy = settings.logits_processor, settings.pad_id, settings.greedy_drafts
        self._floor = settings.draft_p_min
        self._lm = open_lm(drafter.model, len(prompts), device)
        self._pending = [list(p) for p in prompts]  # tokens not yet in the drafter cache
        self._fed_pending = 0  # width of the pending chunk fed by the last propose (0: none)
        self._drafts: list[list[int]] = []

    def propose(self, contexts, max_tokens, generator):
        k = self._draft_length(max_tokens)
        base = None if self._processor is None else context_ids(contexts, self._pad, self._lm.device)
        tokens, probs, self._fed_pending, lengths = _draft(self._lm, self._pending, k, self._sampling, generator,
                                                           self._stop, self._processor, base, self._greedy,
                                                           self._floor)
        self._drafts = tokens.tolist()
        return tokens, probs, lengths

    def commit(self, num_accepted, new_tokens) -> None:
        """Keep each row's pending tokens and accepted drafts; drop the rest."""
        if not self._fed_pending:  # nothing was fed: the new token just joins the pending ones
            for row, tok in zip(self._pending, new_tokens):
                row.append(tok)
            return
        fed_drafts = max(len(self._drafts[0]) - 1, 0)  # the last draft token was sampled but never fed
        self._lm.keep([self._fed_pending + min(n, fed_drafts) for n in num_accepted])
        self._pending = [drafts[min(n, fed_drafts): n] + [tok]
                         for drafts, n, tok in zip(self._drafts, num_accepted, new_tokens)]
        self._fed_pending = 0


class _SharedCacheSession(_ScheduledSession):
    """An early-exit drafter drafting on the target's own KV cache.

    Its embeddings and first ``N`` layers ARE the target's, so the target's cache of those
    layers at accepted positions is exactly what the drafter would compute. Each ``propose``
    drafts through :meth:`~mdboost.engine.kv.CachedLM.layer_view` and gives the entries back
    before the target's verification forward; the target's rollback is then the drafter's,
    so ``commit`` has nothing to keep. No drafter prefill, no drafter cache memory.
    """

    def __init__(self, drafter: ModelDrafter, target: CachedLM, settings):
        super().__init__(drafter.schedule, settings.gamma)
        self._model, self._target = drafter.model, target
        self._stop, self._sampling = drafter.confidence_stop, settings.sampling
        self._processor, self._pad, self._greedy = settings.logits_processor, settings.pad_id, settings.greedy_drafts
        self._floor = settings.draft_p_min

    def propose(self, contexts, max_tokens, generator):
        k = self._draft_length(max_tokens)
        view = self._target.layer_view(self._model)
        seen = self._target.valid.sum(dim=1).tolist()  # tokens of each row in the target cache
        pending = [c[n:] for c, n in zip(contexts, seen)]
        base = None if self._processor is None else context_ids(contexts, self._pad, view.device)
        tokens, probs, _, lengths = _draft(view, pending, k, self._sampling, generator, self._stop,
                                           self._processor, base, self._greedy, self._floor)
        view.keep([0] * view.batch_size)  # crop the draft entries off the target's layers
        return tokens, probs, lengths

    def commit(self, num_accepted, new_tokens) -> None:
        """The target's rollback already rolled back the shared layers."""


def _draft(lm: CachedLM, pending, k, sampling, generator, stop: ConfidenceStop | None = None,
           processor=None, base: torch.Tensor | None = None, greedy: bool = False, floor: float = 0.0):
    """Feed the pending tokens, then sample up to ``k >= 1`` drafts one by one (feeding all but the last).

    With ``stop``, a row's drafts end at the first token that ``stop`` flags (that token
    included); drafting ends when every row has ended. With ``processor`` (the settings'
    ``logits_processor``), each draft's logits are processed first, after the rows' contexts
    ``base`` (``[B, L]``, :func:`mdboost.engine.hooks.context_ids`) and the drafts before it.
    ``greedy`` (or temperature 0): each draft is the argmax of its logits (a rule's
    ``drafting="greedy"``); ``probs`` stay the drafter's distributions. ``floor`` (a greedy
    rule's ``draft_p_min``): a row's drafts end *before* the first position whose
    :func:`~mdboost.md.drafting.draft_confidence` (of the processed logits) is below it.
    Returns ``(tokens [B, w], probs [B, w, V], width of the fed pending chunk, lengths)``
    with ``w <= k`` the longest row's length (0 when the floor stops every row at once).
    """
    batch, device = len(pending), lm.device
    tokens = torch.empty(batch, k, dtype=torch.long, device=device)
    chunk, valid = left_pad(pending, 0, device)
    logits = lm.forward(chunk, valid, logits_to_keep=1)[:, -1]  # [B, V]
    greedy = greedy or sampling["temperature"] == 0
    lengths = torch.full((batch,), k, dtype=torch.long, device=device)
    probs = []
    for j in range(k):
        if j:
            logits = lm.forward(tokens[:, j - 1: j], logits_to_keep=1)[:, -1]
        if processor is not None:
            logits = process_at(processor, base, tokens, j, logits)
        if floor > 0:  # llama.cpp: the position is not drafted (common/speculative.cpp:363-371)
            lengths = torch.where((draft_confidence(logits) < floor) & (lengths == k), j, lengths)
        probs.append(logits_to_probs(logits, **sampling))
        # greedy: the argmax on which the one-hot sits (what multinomial would return), cheaper
        tokens[:, j] = logits.argmax(-1) if greedy else sample(probs[-1], generator)
        if stop is not None:
            lengths = torch.where(stop.stops(logits, tokens[:, j]) & (lengths == k), j + 1, lengths)
        if (stop is not None or floor > 0) and bool((lengths <= j + 1).all()):
            break
    width = int(lengths.max()) if floor > 0 else len(probs)
    return tokens[:, :width], torch.stack(probs, dim=1)[:, :width], chunk.shape[1], lengths.tolist()


@dataclass(frozen=True, eq=False)
class NgramAdapter(Drafter):
    """Prompt lookup as a drafter: one-hot ``p``, no cache, ``0..k`` tokens per row.

    Parameters
    ----------
    ngram : mdboost.models.ngram.NgramDrafter
        ``propose(input_ids [T], num_tokens) -> LongTensor [k <= num_tokens]``.
    schedule : DraftSchedule, default=FixedDraftLength()
        Draft length asked per step.
    """

    ngram: NgramDrafter
    schedule: DraftSchedule = field(default_factory=FixedDraftLength)

    def __post_init__(self):
        if not callable(getattr(self.ngram, "propose", None)):
            raise TypeError(f"ngram must be an NgramDrafter (an object with propose), got {self.ngram!r}")
        _check_schedule(self.schedule)

    def start(self, prompts, target, settings) -> DraftSession:
        return _NgramSession(self.ngram, target.vocab_size, target.device, self.schedule, settings.gamma)


class _NgramSession(_ScheduledSession):
    def __init__(self, ngram, vocab_size: int, device, schedule, gamma):
        super().__init__(schedule, gamma)
        self._ngram, self._vocab_size, self._device = ngram, int(vocab_size), device

    def propose(self, contexts, max_tokens, generator):
        """Up to ``k`` prompt-lookup tokens per row, padded with token 0 (see ``lengths``)."""
        k = self._draft_length(max_tokens)
        drafts = [self._ngram.propose(torch.tensor(c, dtype=torch.long), k).tolist() for c in contexts]
        lengths = [len(d) for d in drafts]
        width = max(lengths, default=0)
        tokens = torch.zeros(len(contexts), width, dtype=torch.long)
        for i, d in enumerate(drafts):
            tokens[i, : len(d)] = torch.tensor(d, dtype=torch.long)
        tokens = tokens.to(self._device)
        probs = torch.zeros(len(contexts), width, self._vocab_size, device=self._device)
        probs.scatter_(-1, tokens.unsqueeze(-1), 1.0)
        return tokens, probs, lengths

    def commit(self, num_accepted, new_tokens) -> None:
        """Prompt lookup reads the context afresh each time: nothing to keep."""


def as_drafter(drafter) -> Drafter:
    """The :class:`Drafter` for a pool member: a ``Drafter`` as is, a transformers model as a
    :class:`ModelDrafter`, an :class:`~mdboost.models.ngram.NgramDrafter` as an :class:`NgramAdapter`,
    a :class:`~mdboost.models.pool.PoolMember` (``pool["early_exit:12"]``) as its model or n-gram drafter,
    an :class:`~mdboost.engine.kv.LMBackend` (a :class:`~mdboost.engine.llamacpp.LlamaCppModel`) as a
    :class:`ModelDrafter`."""
    if isinstance(drafter, Drafter):
        return drafter
    if isinstance(drafter, PoolMember):
        return as_drafter(drafter.ngram if drafter.ngram is not None else drafter.model)
    if isinstance(drafter, NgramDrafter):
        return NgramAdapter(drafter)
    if isinstance(drafter, (PreTrainedModel, LMBackend)):
        return ModelDrafter(drafter)
    raise TypeError(f"drafter must be a Drafter, a pool member, a transformers PreTrainedModel, an LMBackend "
                    f"(llama.cpp) or an NgramDrafter, "
                    f"got {type(drafter).__name__}")
