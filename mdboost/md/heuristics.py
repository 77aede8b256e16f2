"""The field's lossy verification heuristics, as rules of :mod:`mdboost.md.rules`.

Each heuristic below relaxes speculative decoding's test to accept more drafts; mentored
decoding is the optimum of the problem they all approximate (``docs/theory.md``, section 11,
"The field's heuristics"). Four of them accept the draft ``x`` with a probability ``t_x`` read
off the position and, at the first rejection, draw from a residual ``r`` that does not depend
on ``x``, so their law per position is one formula:

    ``pi = p * t + (1 - sum_x p_x t_x) r``,  acceptance ``sum_x p_x t_x``

(``p`` the proposal: the drafter's distribution, or the one-hot of the greedy draft).

- `Lenient`: ``t_x = min(1, q_x / (l p_x))``, ``r = (q - l p)_+`` normalised;
- `Typical`: ``t_x = 1[q_x > min(epsilon, delta exp(-H(q)))]``, ``r = delta_{argmax q}``;
- `Fuzzy`: ``t_x = 1`` where ``D(p, q) <= T``, else ``min(1, q_x / p_x)``; ``r = (q - p)_+`` normalised;
- `Fly`: ``t_x = m_x + (1 - m_x) gate_x kappa`` with ``m_x = min(1, q_x / p_x)``; ``r = (q - p)_+`` normalised.

`Fly` (vLLM's ``rejection_sample_method="fly"``) defers a rejection over a window of the next
``W`` drafts, so its law is not local to a position: its sampler runs vLLM's state machine on the
whole block, and its :meth:`Rule.law` is the law of the first position of a block given
``kappa``, the probability that the next ``W`` drafts are all natively accepted (exact for
positions whose distributions do not depend on the drafted tokens; the tests check it against
an enumeration of the block).

Samplers follow the randomness contract of :mod:`mdboost.md.sampling` (``K + 1`` uniforms a row).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from mdboost.md.divergences import f_divergence, resolve
from mdboost.md.rules import Rule, TokenLaw, draft_draws, tokenwise_result
from mdboost.md.sampling import VerifyResult, accept_ratio, accepted_prefix

__all__ = ["Fly", "Fuzzy", "Lenient", "Typical", "fly_entropy", "typical_threshold"]

MEDUSA_ENTROPY_EPS = 1e-5  # Medusa's entropy reads log(q + 1e-5) (medusa/model/utils.py, evaluate_posterior)


def _number(name: str, value, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> float:
    """``value`` as a float in the interval, else a ValueError naming ``name``."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and not math.isnan(value)
    if ok:
        ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        interval = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")
    return float(value)


def _normalised(w: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:  # [..., V] x2 -> [..., V]
    """``w`` over its sum; rows whose sum is 0 take ``fallback`` (never drawn from: no rejection)."""
    total = w.sum(-1, keepdim=True)
    return torch.where(total > 0, w / torch.where(total > 0, total, 1.0), fallback)


def typical_threshold(target_probs: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:  # [..., V] -> [...]
    """Medusa's typical-acceptance threshold ``min(epsilon, delta exp(-H(q)))``, with Medusa's
    entropy ``H(q) = -sum_i q_i log(q_i + 1e-5)``."""
    entropy = -(target_probs * torch.log(target_probs + MEDUSA_ENTROPY_EPS)).sum(-1)
    return torch.clamp(delta * torch.exp(-entropy), max=epsilon)


def fly_entropy(target_probs: torch.Tensor, top_k: int) -> torch.Tensor:  # [..., V] -> [...]
    """FLy's gate statistic: ``-sum q_i log q_i`` over the ``top_k`` largest ``q_i`` (not
    renormalised), as vLLM 0.34.0's ``compute_fly_entropy`` (``v1/worker/gpu/spec_decode/fly.py:12-38``)."""
    top = torch.topk(target_probs, k=min(top_k, target_probs.shape[-1]), dim=-1).values
    return -torch.where(top > 0, top * torch.log(torch.where(top > 0, top, 1.0)), 0.0).sum(-1)


@dataclass(frozen=True, kw_only=True, repr=False)
class _Local(Rule):
    """A rule that accepts ``x`` with probability ``t_x`` and at a rejection draws from ``r``.

    Subclasses give ``_accept(p, q) -> t`` and ``_residual(p, q) -> r`` (both ``[..., V]``) and
    may give ``_bonus(q) -> [..., V]``, the weights of the token after K accepted drafts.
    """

    def _accept(self, p, q):  # [..., V] x2 -> [..., V]
        raise NotImplementedError

    def _residual(self, p, q):  # [..., V] x2 -> [..., V], rows summing to 1
        return _normalised((q - p).clamp(min=0.0), q)

    def _bonus(self, q):  # [B, V] -> [B, V]
        return q

    def _position_law(self, p, q) -> TokenLaw:  # [B, K, V]: the law the sampler reports per position
        return self._law(p, q)

    def _law(self, p, q) -> TokenLaw:
        kept = p * self._accept(p, q)  # [..., V] mass emitted as an accepted draft
        acceptance = kept.sum(-1).clamp(0.0, 1.0)
        emitted = kept + (1 - acceptance).unsqueeze(-1) * self._residual(p, q)
        return TokenLaw(acceptance, emitted)

    def _verify(self, tokens, p, q_all, generator, validate, divergence) -> VerifyResult:
        batch, num_draft, vocab = p.shape
        q = q_all[:, :num_draft]
        u, p_x, q_x = draft_draws(tokens, p, q, generator, validate)
        t_x = torch.gather(self._accept(p, q), -1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, K]
        num_accepted, by_budget = accepted_prefix(u[:, :num_draft], t_x, accept_ratio(q_x, p_x))
        return _result(self, tokens, num_accepted, by_budget, u[:, num_draft], p, q_all, divergence)


def _result(rule, tokens, num_accepted, by_budget, u_draw, p, q_all, divergence) -> VerifyResult:
    """Draw the token after the accepted prefix and report the per-position law (shared tail)."""
    num_draft = p.shape[1]
    q = q_all[:, :num_draft]
    return tokenwise_result(tokens, num_accepted, by_budget, u_draw, p, q_all, rule._position_law(p.double(), q.double()),
                            divergence, lambda rows, rpos: rule._residual(p[rows, rpos], q[rows, rpos]),
                            bonus=rule._bonus(q_all[:, num_draft]))


@dataclass(frozen=True, kw_only=True, repr=False)
class Lenient(_Local):
    """Lenient speculative decoding (Leviathan et al. 2023, "Fast inference from transformers via
    speculative decoding", appendix on lenience).

    The draft ``x`` is accepted with probability ``min(1, q_x / (l p_x))`` and a rejection draws
    from ``(q - l p)_+``, normalised: speculative decoding run against the target scaled by
    ``1 / l`` (its ratio test and its residual both), which is the clamp ``pi(a, b)`` of
    ``docs/theory.md`` section 4 at ``1 + a = 1 - b = 1 / l``. ``l = 1`` is lossless SD; ``l -> 0``
    accepts every draft. The paper's text could not be retrieved where this module was written
    (no copy in the stored corpora); the acceptance test is the paper's lenience as cited by the
    later literature, and the residual is the one that keeps the rule a speculative-decoding step
    towards a fixed target, as stated here (``docs/theory.md``, section 11).

    Parameters
    ----------
    lenience : float in (0, 1], default=1.0
        ``l``.
    drafting : {"sampled", "greedy"}, default="sampled"

    Examples
    --------
    >>> p = torch.tensor([0.6, 0.4], dtype=torch.float64)
    >>> q = torch.tensor([0.3, 0.7], dtype=torch.float64)
    >>> law = Lenient(lenience=0.5).law(p, q)  # x = 0 kept with min(1, 0.3 / 0.3) = 1
    >>> round(float(law.acceptance), 6), [round(v, 6) for v in law.emitted.tolist()]
    (1.0, [0.6, 0.4])
    """

    lenience: float = 1.0
    name: ClassVar[str] = "lenient"

    def __post_init__(self):
        super().__post_init__()
        _number("lenience", self.lenience, 0.0, 1.0, lo_open=True)

    @property
    def lossless(self) -> bool:
        return self.lenience == 1

    def _accept(self, p, q):
        return accept_ratio(q / self.lenience, p)

    def _residual(self, p, q):
        return _normalised((q - self.lenience * p).clamp(min=0.0), q)


@dataclass(frozen=True, kw_only=True, repr=False)
class Typical(_Local):
    """Typical acceptance (Cai et al. 2024, Medusa), as Medusa's released code runs it.

    The draft ``x`` is accepted when ``q_x > min(epsilon, delta exp(-H(q)))`` (a deterministic
    test; Medusa's entropy is ``-sum q log(q + 1e-5)``). Read from FasterDecoding/Medusa at commit
    e2a5d20 (``medusa/model/utils.py``): with its default ``fast=True``
    (``medusa/model/medusa_model.py``, ``medusa_generate``: ``posterior_threshold=0.09``,
    ``posterior_alpha=0.3``), ``evaluate_posterior`` applies this test and ``generate_candidates``
    takes the token after the accepted prefix as ``argmax q`` (``torch.argmax(logits[:, -1])``):
    the token at a rejection, and the token after a fully accepted chain, is the target's argmax.
    That is the rule here (Medusa drafts the heads' top-k tokens: greedy drafting by default).
    Medusa's ``fast=False`` path instead samples the target truncated to
    ``q_i >= min(epsilon, delta exp(-H))`` and keeps a draft equal to that sample: llama.cpp's
    `mdboost.md.rules.Match` against the truncated target (not a separate rule here).

    Parameters
    ----------
    epsilon : float in (0, 1], default=0.09
        Medusa's ``posterior_threshold``, the hard threshold.
    delta : float in (0, 1], default=0.3
        Medusa's ``posterior_alpha``, the entropy-scaled threshold (Medusa recommends
        ``sqrt(epsilon)``).
    drafting : {"sampled", "greedy"}, default="greedy"

    Examples
    --------
    >>> p = torch.tensor([0.1, 0.9], dtype=torch.float64)
    >>> q = torch.tensor([0.8, 0.2], dtype=torch.float64)  # greedy draft 1: q_1 = 0.2 > 0.09, kept
    >>> law = Typical().law(p, q)
    >>> float(law.acceptance), law.emitted.tolist()
    (1.0, [0.0, 1.0])
    """

    drafting: str = "greedy"
    epsilon: float = 0.09
    delta: float = 0.3
    name: ClassVar[str] = "typical"

    def __post_init__(self):
        super().__post_init__()
        _number("epsilon", self.epsilon, 0.0, 1.0, lo_open=True)
        _number("delta", self.delta, 0.0, 1.0, lo_open=True)

    def _accept(self, p, q):
        return (q > typical_threshold(q, self.epsilon, self.delta).unsqueeze(-1)).to(q.dtype)

    def _residual(self, p, q):
        return self._bonus(q)

    def _bonus(self, q):  # the target's argmax (lowest index among ties)
        return torch.zeros_like(q).scatter_(-1, q.argmax(-1, keepdim=True), 1.0)


@dataclass(frozen=True, kw_only=True, repr=False)
class Fuzzy(_Local):
    """Fuzzy speculative decoding (Holsman et al. 2025, "Fuzzy Speculative Decoding for a Tunable
    Accuracy-Runtime Tradeoff", arXiv:2502.20704).

    At a position whose divergence ``D(p, q)`` between the drafter's and the target's next-token
    distributions is at most ``T``, the draft is accepted unconditionally; elsewhere standard SD
    runs (``min(1, q_x / p_x)``, residual ``(q - p)_+``). The paper ranks divergences and uses the
    Jensen-Shannon divergence (the default here, natural log); any mdboost generator ``f`` may
    be named, read as ``D_f(p || q)``, the direction of the budget. Then a position either emits
    ``p`` (when ``D_f(p || q) <= T``) or ``q``: every position stays within ``D_f(pi || q) <= T``.
    With greedy drafting the divergence is that of the one-hot proposal.

    Parameters
    ----------
    threshold : float >= 0, default=0.0
        ``T`` (0: SD, up to positions where ``p = q``).
    divergence : str, default="js"
    drafting : {"sampled", "greedy"}, default="sampled"

    Examples
    --------
    >>> p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    >>> q = torch.tensor([0.4, 0.6], dtype=torch.float64)
    >>> float(Fuzzy(threshold=0.01).law(p, q).acceptance)  # JS(p, q) = 0.005: accepted
    1.0
    >>> round(float(Fuzzy(threshold=0.001).law(p, q).acceptance), 6)  # SD: 1 - TV
    0.9
    """

    threshold: float = 0.0
    divergence: str = "js"
    name: ClassVar[str] = "fuzzy"

    def __post_init__(self):
        super().__post_init__()
        _number("threshold", self.threshold, 0.0, math.inf)
        try:
            resolve(self.divergence)
        except ValueError as err:
            raise ValueError(f"divergence: {err}") from err

    def _gate(self, p, q):  # [..., V] x2 -> [..., 1] whether the position accepts every draft
        return (f_divergence(p, q, resolve(self.divergence), validate=False) <= self.threshold).unsqueeze(-1)

    def _accept(self, p, q):
        return torch.where(self._gate(p, q), torch.ones_like(q), accept_ratio(q, p))


@dataclass(frozen=True, kw_only=True, repr=False)
class Fly(_Local):
    """vLLM's FLy verification (``rejection_sample_method="fly"``, vLLM 0.34.0).

    A ported state machine (``v1/worker/gpu/spec_decode/rejection_sampler_utils.py``, the
    rejection kernel, lines 590-755; the gate statistic of :func:`fly_entropy`). Each draft gets
    SD's native test (``u < min(1, q_x / p_x)``, :716). A native rejection at position ``i`` is
    deferred when the target's top-k entropy there is at least ``entropy_threshold``, ``q_x`` and
    ``p_x`` are positive (:719-723), and ``i + W < K`` (:738-742): the draft stays while the next
    ``W`` drafts are natively accepted, and position ``i + W``'s native acceptance confirms the
    whole window (:727-732). A native rejection inside the window ends verification with the
    accepted length back at ``i`` (:728), and the token there is drawn from SD's residual
    ``(q - p)_+`` at ``i`` (the log-sum-exps are frozen at the pending position, :707-709).
    After K accepted drafts the bonus is drawn from ``q``. With greedy drafts (vLLM's default
    ``draft_sample_method``) the native test is ``u < q_x`` and the residual ``q`` without ``x``.

    The law is not local to a position. :meth:`law` gives the first position's law of a block:
    ``x`` is kept with ``m_x + (1 - m_x) gate_x kappa`` (``m_x = min(1, q_x / p_x)``, ``gate_x`` the
    deferral condition, ``kappa`` the probability that the next ``W`` drafts are all natively
    accepted, :attr:`window_acceptance`); otherwise ``(q - p)_+`` is drawn. :meth:`verify`
    reports, at each position ``k``, that law with ``kappa = prod_{j=k+1}^{k+W} (1 - TV(p_j, q_j))``
    (0 when ``k + W >= K``). The draws themselves follow the state machine, not these laws.

    Parameters
    ----------
    window : int >= 1, default=1
        ``W`` (vLLM's ``fly_window_size``; its default is ``min(6, K - 1)``).
    entropy_threshold : float >= 0, default=0.3
        vLLM's ``fly_entropy_threshold``.
    entropy_top_k : int >= 1, default=3
        vLLM's ``fly_entropy_top_k``.
    window_acceptance : float in [0, 1], optional
        ``kappa`` for :meth:`law` (required there).
    drafting : {"sampled", "greedy"}, default="greedy"
    """

    drafting: str = "greedy"
    window: int = 1
    entropy_threshold: float = 0.3
    entropy_top_k: int = 3
    window_acceptance: float | None = None
    name: ClassVar[str] = "fly"

    def __post_init__(self):
        super().__post_init__()
        for name in ("window", "entropy_top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        _number("entropy_threshold", self.entropy_threshold, 0.0, math.inf)
        if self.window_acceptance is not None:
            _number("window_acceptance", self.window_acceptance, 0.0, 1.0)

    def _engines(self) -> tuple[str, ...]:
        return ("mdboost", "hf", "vllm")

    def _gate(self, p, q):  # [..., V]: whether a native rejection of x may be deferred
        high = (fly_entropy(q, self.entropy_top_k) >= self.entropy_threshold).unsqueeze(-1)
        return high & (q > 0) & (p > 0)

    def _accept_given(self, p, q, kappa):  # kappa: broadcastable to [..., 1]
        native = accept_ratio(q, p)
        return native + (1 - native) * self._gate(p, q).to(q.dtype) * kappa

    def _accept(self, p, q):
        if self.window_acceptance is None:
            raise ValueError("Fly.law needs window_acceptance (the probability that the W drafts after "
                             "a deferred rejection are all natively accepted), got None")
        return self._accept_given(p, q, self.window_acceptance)

    def _position_law(self, p, q) -> TokenLaw:  # [B, K, V]: each position as a block's first
        native = torch.minimum(p, q).sum(-1)  # [B, K]
        num_draft = p.shape[1]
        kappa = torch.zeros_like(native)
        for k in range(num_draft - self.window):
            kappa[:, k] = native[:, k + 1:k + 1 + self.window].prod(-1)
        kept = p * self._accept_given(p, q, kappa.unsqueeze(-1))
        acceptance = kept.sum(-1).clamp(0.0, 1.0)
        return TokenLaw(acceptance, kept + (1 - acceptance).unsqueeze(-1) * self._residual(p, q))

    def _verify(self, tokens, p, q_all, generator, validate, divergence) -> VerifyResult:
        batch, num_draft, vocab = p.shape
        q = q_all[:, :num_draft]
        u, p_x, q_x = draft_draws(tokens, p, q, generator, validate)
        native = u[:, :num_draft] < accept_ratio(q_x, p_x)  # [B, K]
        can_defer = ((fly_entropy(q, self.entropy_top_k) >= self.entropy_threshold) & (q_x > 0) & (p_x > 0))
        length = torch.zeros(batch, dtype=torch.long, device=p.device)
        pending = torch.full_like(length, -1)
        verifying = torch.ones(batch, dtype=torch.bool, device=p.device)
        for i in range(num_draft):  # rejection_sampler_utils.py:726-751
            ok = native[:, i]
            waiting = pending >= 0
            confirm = verifying & waiting & ok & (i - pending == self.window)
            stop_window = verifying & waiting & ~ok
            fresh = verifying & ~waiting
            defer = fresh & ~ok & can_defer[:, i] & (i + self.window < num_draft)
            length = torch.where(confirm | (fresh & ok), i + 1, length)
            pending = torch.where(confirm, -1, torch.where(defer, i, pending))
            verifying = verifying & ~stop_window & ~(fresh & ~ok & ~defer)
        sd_kept = u[:, :num_draft] < accept_ratio(q_x, p_x)
        emitted = torch.arange(num_draft, device=p.device) < length.unsqueeze(-1)
        return _result(self, tokens, length, emitted & ~sd_kept, u[:, num_draft], p, q_all, divergence)

