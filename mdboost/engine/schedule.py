"""How much a drafter drafts: draft-length schedules and the confidence stop.

Both are small frozen objects that a drafter owns (``ModelDrafter(model, schedule=...,
confidence_stop=...)``), in the spirit of transformers' candidate generators, which adapt
their own ``num_assistant_tokens`` in ``update_candidate_strategy``. They hold settings only:
the per-generation state (the current draft length) lives in the drafter's session
(:class:`mdboost.engine.drafting.DraftSession`), so one drafter can serve many generations.

Neither changes what SD emits: the draft length and the stop depend only on past
verifications and on the drafter's own outputs, never on the tokens still to be verified, so
the output keeps the target's distribution (``docs/theory.md`` section 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from mdboost.md._checks import check_positive_int, check_real


class DraftSchedule(Protocol):
    """The draft length of the next step from the outcome of the last one.

    A schedule may also define ``first_length(gamma) -> int``, the first step's length
    (without it the first step drafts ``gamma``).
    """

    def next_length(self, length: int, gamma: int, drafted: int, lengths: list[int],
                    num_accepted: list[int]) -> int:
        """The next draft length, a positive integer (else the drafter's session raises, naming it).

        Parameters
        ----------
        length : int
            The schedule's current length (at the first step ``gamma``, or its ``first_length``).
        gamma : int
            The settings' draft length (:class:`mdboost.engine.settings.GenerationSettings`).
        drafted : int
            Tokens asked of the drafter in the last step (``<= length``: fewer near the end).
        lengths, num_accepted : list of int
            Per row still generating: drafts proposed (``<= drafted``) and accepted.
        """


@dataclass(frozen=True)
class FixedDraftLength:
    """Always ``gamma`` tokens (the default schedule)."""

    def next_length(self, length, gamma, drafted, lengths, num_accepted) -> int:
        return gamma


@dataclass(frozen=True)
class AdaptiveDraftLength:
    """Hugging Face's "heuristic" schedule of assisted generation.

    It starts at ``gamma`` (``max_length`` if that is smaller). After each drafted step the
    length grows by 2 when every row still generating accepted every one of ``drafted``
    drafts, and shrinks by 1 (down to 1) otherwise; it never exceeds ``max_length``.

    Parameters
    ----------
    max_length : int or None, default=None
        Cap of the length, ``>= 1`` (default ``4 * gamma``).

    Examples
    --------
    >>> schedule = AdaptiveDraftLength(max_length=7)
    >>> schedule.next_length(4, 4, 4, lengths=[4, 4], num_accepted=[4, 4])
    6
    >>> schedule.next_length(6, 4, 6, lengths=[6, 6], num_accepted=[6, 6])
    7
    >>> schedule.next_length(7, 4, 7, lengths=[7, 7], num_accepted=[7, 2])
    6
    >>> AdaptiveDraftLength(max_length=2).first_length(4)
    2
    """

    max_length: int | None = None

    def __post_init__(self):  # an integral float, numpy or one-element tensor value is kept as an int
        object.__setattr__(self, "max_length", check_positive_int("max_length", self.max_length))

    def first_length(self, gamma: int) -> int:
        """The length of the first step: ``gamma``, capped at ``max_length``."""
        return min(gamma, int(self.max_length or 4 * gamma))

    def next_length(self, length, gamma, drafted, lengths, num_accepted) -> int:
        cap = int(self.max_length or 4 * gamma)
        full = all(n == drafted == k for k, n in zip(lengths, num_accepted))
        return min(length + 2, cap) if full else min(max(1, length - 1), cap)


@dataclass(frozen=True)
class ConfidenceStop:
    """A row stops drafting right after a token its drafter was not confident about.

    Hugging Face's ``assistant_confidence_threshold`` rule (0.4 by default there; transformers
    then adapts the threshold, this stop keeps it fixed): the confidence of a drafted token
    is its probability under the drafter's raw softmax (temperature 1, no top-k / top-p; the logits
    after the settings' ``logits_processor`` when one is set, as Hugging Face does).

    Parameters
    ----------
    threshold : float, default=0.4
        In ``[0, 1]``; a row stops after a token whose confidence is below it (that token is
        still proposed).

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # confident row, uniform row
    >>> ConfidenceStop(0.5).stops(logits, torch.tensor([0, 1])).tolist()
    [False, True]
    """

    threshold: float = 0.4

    def __post_init__(self):  # a numpy or one-element tensor value is kept as a float; NaN is refused
        object.__setattr__(self, "threshold", check_real("threshold", self.threshold, low=0.0, high=1.0))

    def stops(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:  # [B, V], [B] -> [B] bool
        """Which rows stop after drafting ``tokens`` from ``logits``."""
        confidence = torch.softmax(logits.float(), dim=-1).gather(-1, tokens[:, None]).squeeze(-1)  # [B]
        return confidence < self.threshold
