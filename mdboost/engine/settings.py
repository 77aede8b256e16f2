"""What one :func:`mdboost.engine.generate` call does, as one frozen, validated object.

:class:`GenerationSettings` holds the sampling settings (shared by drafter and target: both
go through :func:`mdboost.logits_to_probs` with them, ``docs/theory.md`` section 1), the MD
budget of verification (section 3: a divergence budget ``max_divergence`` or its dual, an
acceptance floor ``min_acceptance``; budget 0 is lossless SD), the draft length and the
stopping rule. Which drafter drafts, and how it schedules its drafts, is the drafter's
business (:mod:`mdboost.engine.drafting`), not a setting.

Every field is checked when the object is built; an error names the field and its value.
Change a field with :func:`dataclasses.replace`, which validates again.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Callable

from mdboost.md.options import DEFAULT_MD_SOLVE  # where MD verification solves the clamp unless told otherwise
from mdboost.md.rules import Mentored, Rule, check_budget_request
from mdboost.md.verify import SOLVE


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _positive_int(name: str, value, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not _is_int(value) or value < 1:
        extra = " or None" if optional else ""
        raise ValueError(f"{name} must be a positive integer{extra}, got {value!r}")


def _token_id(name: str, value) -> None:
    if value is not None and (not _is_int(value) or value < 0):
        raise ValueError(f"{name} must be a token id (an integer >= 0) or None, got {value!r}")


@dataclass(frozen=True)
class GenerationSettings:
    """Sampling, MD budget, draft length and stopping rule of one generation.

    Parameters
    ----------
    max_new_tokens : int, default=32
        New tokens per row, ``>= 1``.
    gamma : int, default=4
        Draft length per step, ``>= 1`` (where a drafter's schedule starts; see
        :class:`mdboost.engine.schedule.AdaptiveDraftLength`). A step never drafts more than
        the row that needs the most tokens can still use, minus one.
    temperature : float, default=1.0
        Softmax temperature of both models, ``>= 0``; ``0`` is greedy (one-hot ``p`` and
        ``q``: SD then reproduces the target's greedy decoding token for token).
    top_k, top_p : int or None, float or None
        Filtering of both models' distributions (:func:`mdboost.logits_to_probs`).
    max_divergence : float, default=0.0
        MD budget ``D`` on ``D_f(pi || q)`` per verified position, ``>= 0``
        (``docs/theory.md`` section 3); ``0`` with ``min_acceptance=None`` is lossless SD.
    min_acceptance : float or None, default=None
        The dual budget, an acceptance floor in ``[0, 1]``, instead of ``max_divergence``
        (give one of the two).
    divergence : str or callable, default="kl"
        The f-divergence of the budget (a name of :mod:`mdboost.md.divergences` or a
        generator ``f``).
    md_top_k : int or None, default=None
        Solve MD on the target's top-k tokens only (Lemma 6.1). Used only with a budget (in
        lossless SD it would make verification lossy).
    md_solve : {"needed", "reached", "all"}, default="needed"
        Where verification solves the clamp (:func:`mdboost.md.verify.verify`'s ``solve``):
        ``"needed"`` only at drafts SD would reject (fastest; the same tokens), ``"reached"``
        at every verified position (exact per-position stats), ``"all"`` also after the
        first rejection.
    eos_token_id : int or None, default=None
        A row stops after emitting it.
    pad_token_id : int or None, default=None
        Pads rows that stopped early (default: ``eos_token_id``, else 0).
    logits_processor : callable or None, default=None
        ``(input_ids [B, L], scores [B, V]) -> scores [B, V]``, transformers' ``LogitsProcessor``
        signature: applied to the drafter's and the target's logits at every position, the
        same way for both, before :func:`mdboost.logits_to_probs` (so before the MD clamp).
        ``input_ids`` holds each row's tokens before that position (prompt, generated tokens,
        earlier drafts), left-padded with :attr:`pad_id` to the longest row.
    stopping_criteria : callable or None, default=None
        ``(input_ids [B, L], scores) -> BoolTensor [B]``, transformers' ``StoppingCriteria``
        signature (called with ``scores=None``) after each emitted token, with the rows
        left-padded as above: a row stops after the first token that makes it ``True``.
    mentor : callable or None, default=None
        ``(draft_probs [B, K, V], target_probs [B, K, V]) -> mentored_probs [B, K, V]``: the
        distribution to emit at each drafted position, whatever the drafter (sampled by
        :func:`mdboost.md.verify.verify`'s ``mentored_probs``), e.g.
        :class:`mdboost.md.tv_set.BoostedMentor`. It replaces the budget (leave
        ``max_divergence`` 0, ``min_acceptance`` and ``md_top_k`` None); ``divergence`` then
        only names the reported divergence. Positions past a row's draft length are ignored.
    rule : mdboost.md.rules.Rule or None, default=None
        The verification rule, with its drafting (``docs/theory.md``, section 11), e.g.
        ``Threshold(accept=0.6)`` (SGLang's thresholds on greedy drafts), ``Match()``
        (llama.cpp), ``Rejection(drafting="greedy")`` (vLLM's default), ``Mentored(...)``. It
        replaces the budget (leave ``max_divergence`` 0, ``min_acceptance``, ``md_top_k`` and
        ``mentor`` unset); ``divergence`` names the reported divergence (a ``Mentored`` rule
        reports its own: leave ``divergence`` unset or equal). A ``Mentored`` rule solves where
        ``md_solve`` says. None: the budget fields above, sampled drafts.

    Examples
    --------
    >>> settings = GenerationSettings(max_new_tokens=16, temperature=0.0)
    >>> settings.lossy, settings.sampling
    (False, {'temperature': 0.0, 'top_k': None, 'top_p': None})
    >>> GenerationSettings(gamma=0)
    Traceback (most recent call last):
    ...
    ValueError: gamma must be a positive integer, got 0
    """

    max_new_tokens: int = 32
    gamma: int = 4
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    max_divergence: float = 0.0
    min_acceptance: float | None = None
    divergence: str | Callable = "kl"
    md_top_k: int | None = None
    md_solve: str = DEFAULT_MD_SOLVE
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    logits_processor: Callable | None = None
    stopping_criteria: Callable | None = None
    mentor: Callable | None = None
    rule: Rule | None = None

    def __post_init__(self):
        _positive_int("max_new_tokens", self.max_new_tokens)
        _positive_int("gamma", self.gamma)
        if not _is_real(self.temperature) or not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        _positive_int("top_k", self.top_k, optional=True)
        if self.top_p is not None and not (_is_real(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p!r}")
        check_budget_request(self.max_divergence, self.min_acceptance, self.divergence)
        _positive_int("md_top_k", self.md_top_k, optional=True)
        if self.md_solve not in SOLVE:
            raise ValueError(f"md_solve must be one of {SOLVE}, got {self.md_solve!r}")
        _token_id("eos_token_id", self.eos_token_id)
        _token_id("pad_token_id", self.pad_token_id)
        for name in ("logits_processor", "stopping_criteria", "mentor"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be callable or None, got {type(value).__name__}")
        if self.mentor is not None and (self.max_divergence != 0 or self.min_acceptance is not None
                                        or self.md_top_k is not None):
            raise ValueError(f"mentor sets the emitted distribution: leave max_divergence (got {self.max_divergence!r}), "
                             f"min_acceptance ({self.min_acceptance!r}) and md_top_k ({self.md_top_k!r}) unset")
        if self.rule is not None:
            if not isinstance(self.rule, Rule):
                raise TypeError(f"rule must be a mdboost.md.rules.Rule or None, got {self.rule!r}")
            if self.max_divergence != 0 or self.min_acceptance is not None or self.md_top_k is not None \
                    or self.mentor is not None:
                raise ValueError(f"rule sets the verification: leave max_divergence (got {self.max_divergence!r}), "
                                 f"min_acceptance ({self.min_acceptance!r}), md_top_k ({self.md_top_k!r}) and mentor "
                                 f"({self.mentor!r}) unset")
            if isinstance(self.rule, Mentored) and self.divergence not in ("kl", self.rule.divergence):
                raise ValueError(f"divergence={self.divergence!r} differs from the Mentored rule's divergence="
                                 f"{self.rule.divergence!r}: the rule's budget names the divergence (leave divergence unset)")

    @property
    def lossy(self) -> bool:
        """True with a budget (``max_divergence > 0`` or ``min_acceptance``), a mentor or a lossy rule."""
        if self.rule is not None:
            return not self.rule.lossless
        return self.max_divergence > 0 or self.min_acceptance is not None or self.mentor is not None

    @property
    def greedy_drafts(self) -> bool:
        """Whether drafts are the drafter's argmax (a rule with ``drafting="greedy"``)."""
        return self.rule is not None and self.rule.drafting == "greedy"

    @property
    def draft_p_min(self) -> float:
        """The rule's draft probability floor (:mod:`mdboost.md.drafting`; 0: none)."""
        return 0.0 if self.rule is None else self.rule.draft_p_min

    @property
    def sampling(self) -> dict:
        """Keyword arguments of :func:`mdboost.logits_to_probs` for both models."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    @property
    def verify_args(self) -> dict:
        """Keyword arguments of :func:`mdboost.md.verify.verify` (``md_top_k`` only when lossy),
        plus ``mentor`` when set (the engine turns it into ``mentored_probs``); with a ``rule``,
        ``{"rule": rule, "divergence": ...}`` (a ``Mentored`` rule solving where ``md_solve`` says)."""
        if self.rule is not None:
            rule = replace(self.rule, solve=self.md_solve) if isinstance(self.rule, Mentored) else self.rule
            divergence = self.rule.divergence if isinstance(self.rule, Mentored) else self.divergence
            return dict(rule=rule, divergence=divergence)
        args = dict(max_divergence=self.max_divergence, min_acceptance=self.min_acceptance,
                    divergence=self.divergence, top_k=self.md_top_k if self.lossy else None, solve=self.md_solve)
        return args if self.mentor is None else dict(args, mentor=self.mentor)

    @property
    def pad_id(self) -> int:
        """The pad token actually used: ``pad_token_id``, else ``eos_token_id``, else 0."""
        if self.pad_token_id is not None:
            return self.pad_token_id
        return self.eos_token_id if self.eos_token_id is not None else 0
