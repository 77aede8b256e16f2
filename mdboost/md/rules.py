"""Verification rules: how drafts are drawn and how they are verified, one small object each.

A rule is the pair the engines differ on (``docs/theory.md``, section 11):

- **drafting** ``"sampled"`` (``x ~ p``) or ``"greedy"`` (``x = argmax p``: the verifier sees the
  one-hot of ``x`` as the draft distribution, as vLLM's ``draft_sample_method="greedy"`` does),
  greedy with an optional probability floor ``draft_p_min`` (llama.cpp's, :mod:`mdboost.md.drafting`);
- **verification**, token by token:

  ============  ===========================================  =====================================
  rule          accept the draft ``x`` with probability      at the first rejection, draw from
  ============  ===========================================  =====================================
  `Rejection`   ``min(1, q_x / p_x)``                        ``(q - p)_+``: lossless SD
  `Block`       the block's joint ratio (vLLM ``"block"``)   scaled residual: lossless, >= SD
  `Mentored`    ``min(1, (1 + a) q_x / p_x)``                ``((1 - b) q - p)_+``: the MD clamp
  `Threshold`   ``1`` if ``q_x >= single``, else             ``q`` without ``x``, renormalised
                ``min(1, q_x / accept)``                     (SGLang's thresholds)
  `Match`       ``q_x`` (the target's own sample is ``x``)   ``q`` without ``x`` (llama.cpp)
  ============  ===========================================  =====================================

Each rule gives its emitted distribution per position in closed form (:meth:`Rule.law`:
the acceptance probability over the draft and the distribution ``pi`` of the emitted token),
so the achieved ``D_f(pi || q)`` of a rule is known exactly (:meth:`Rule.achieved_divergence`), and
samples it (:meth:`Rule.verify`, the randomness contract of :mod:`mdboost.md.sampling`: ``K + 1``
uniforms per row). `Threshold` keeps ``D_f(pi || q) <= D`` at every position for every convex
``f`` when ``accept >= threshold_for_budget(D, f)`` and ``single >= accept`` (``docs/theory.md``,
section 11); `Match` is `Threshold` at ``accept = single = 1``, lossless.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields
from typing import ClassVar, NamedTuple

import torch

from mdboost.md._checks import check_probs, check_verify_inputs, compute_dtype
from mdboost.md.block import block_verify
from mdboost.md.clamp import mentored_distribution
from mdboost.md.divergences import f_divergence, resolve
from mdboost.md.drafting import DRAFTING, check_draft_floor, greedy_proposal
from mdboost.md.sampling import (VerifyResult, accept_ratio, accepted_prefix, draw_uniforms, emitted_tokens,
                                 inverse_cdf, overlap)
from mdboost.md.solve import solve
from mdboost.md.verify import SOLVE, verify

__all__ = ["Block", "DRAFTING", "ENGINES", "FLOOR_ENGINES", "Match", "Mentored", "Rejection", "Rule", "Threshold", "TokenLaw", "tokenwise_result",
           "check_budget_request", "draft_draws", "greedy_proposal", "threshold_for_budget"]

ENGINES = ("mdboost", "hf", "vllm", "sglang", "llamacpp")
FLOOR_ENGINES = ("mdboost", "hf", "llamacpp")  # a draft probability floor: llama.cpp's --spec-draft-p-min


class TokenLaw(NamedTuple):
    """A rule's law at each position, over the draft and the verifier's draws."""

    acceptance: torch.Tensor  # [...] probability that the draft is accepted
    emitted: torch.Tensor  # [..., V] distribution pi of the emitted token


@dataclass(frozen=True, kw_only=True, repr=False)
class Rule:
    """Base of the verification rules (not used directly).

    Parameters
    ----------
    drafting : {"sampled", "greedy"}, default="sampled"
        How the drafter's tokens are drawn: ``x ~ p``, or ``x = argmax p`` with the draft
        distribution taken as its one-hot.
    draft_p_min : float in [0, 1), default=0.0
        With greedy drafting, llama.cpp's floor: a step drafts no position whose
        :func:`~mdboost.md.drafting.draft_confidence` is below it, nor any after it (0: every
        step drafts its full length). It changes the draft lengths (the engine's drafting, the
        ranking's draft-start process), not the law of a drafted position; only mdboost, hf and
        llama.cpp run it.
    """

    drafting: str = "sampled"
    draft_p_min: float = 0.0
    name: ClassVar[str] = "rule"

    def __post_init__(self):
        if self.drafting not in DRAFTING:
            raise ValueError(f"drafting must be one of {DRAFTING}, got {self.drafting!r}")
        object.__setattr__(self, "draft_p_min", check_draft_floor(self.draft_p_min, self.drafting))

    def __repr__(self) -> str:  # the dataclass repr of what __init__ takes (it evaluates back), no floor when 0
        shown = [f for f in fields(self) if f.repr and f.init and not (f.name == "draft_p_min" and self.draft_p_min == 0)]
        return f"{type(self).__name__}({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    @property
    def lossless(self) -> bool:
        """Whether the emitted distribution is the target's at every position."""
        return False

    @property
    def engines(self) -> tuple[str, ...]:
        """The engines that run this rule: its verification's (``docs/theory.md``, section 11),
        those of :data:`FLOOR_ENGINES` only when it has a draft probability floor."""
        return tuple(e for e in self._engines() if self.draft_p_min == 0 or e in FLOOR_ENGINES)

    def _engines(self) -> tuple[str, ...]:  # the engines that emit the verification's law
        return ("mdboost", "hf")

    def proposal(self, draft_probs: torch.Tensor, draft_token: torch.Tensor | None = None) -> torch.Tensor:
        """The draft distribution the verifier sees: ``p``, or the one-hot of the greedy draft."""
        return greedy_proposal(draft_probs, draft_token) if self.drafting == "greedy" else draft_probs

    def law(self, draft_probs: torch.Tensor, target_probs: torch.Tensor, *,
            draft_token: torch.Tensor | None = None) -> TokenLaw:  # [..., V] x2 -> [...], [..., V]
        """Acceptance and emitted distribution per position, in closed form.

        Parameters
        ----------
        draft_probs, target_probs : torch.Tensor of shape (..., V)
            ``p`` and ``q`` at each position.
        draft_token : torch.LongTensor of shape (...), optional
            With ``drafting="greedy"``, the drafted token (default ``argmax p``; a caller whose
            rows merge tokens, such as the ranking's aligned support, names it).
        """
        p = check_probs("draft_probs", draft_probs)
        q = check_probs("target_probs", target_probs)
        p64, q64 = p.double(), q.double()
        return self._law(self.proposal(p64, draft_token), q64)

    def achieved_divergence(self, draft_probs: torch.Tensor, target_probs: torch.Tensor, divergence="kl", *,
                   draft_token: torch.Tensor | None = None) -> torch.Tensor:  # [...]
        """The achieved ``D_f(pi || q)`` per position of :meth:`law`'s ``pi``."""
        law = self.law(draft_probs, target_probs, draft_token=draft_token)
        return f_divergence(law.emitted, target_probs.double(), resolve(divergence), validate=False)

    def verify(self, draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor, *,
               generator=None, validate: bool = True, divergence="kl") -> VerifyResult:
        """Verify K drafts per row (``[B, K]``, ``[B, K, V]``, ``[B, K + 1, V]``).

        ``divergence`` names the generator of the reported per-position ``D_f(pi || q)``. With
        ``drafting="greedy"`` every draft must be an argmax of its ``p`` (checked when
        ``validate``); the verifier sees its one-hot.
        """
        tokens, p, q_all = check_verify_inputs(draft_tokens, draft_probs, target_probs, validate=validate)
        num_draft = p.shape[1]
        dtype = compute_dtype(torch.promote_types(p.dtype, q_all.dtype))
        p, q_all = p.to(dtype), q_all.to(dtype)
        if self.drafting == "greedy":
            if validate and num_draft:
                p_x = torch.gather(p, -1, tokens.unsqueeze(-1)).squeeze(-1)
                if bool((p_x < p.amax(-1)).any()):
                    raise ValueError("draft_tokens holds a token that is not an argmax of draft_probs "
                                     f"(drafting={self.drafting!r})")
            p = greedy_proposal(p, tokens)
        return self._verify(tokens, p, q_all, generator, validate, divergence)

    def _law(self, p, q) -> TokenLaw:  # float64 [..., V] x2 (p: the proposal)
        raise NotImplementedError

    def _verify(self, tokens, p, q_all, generator, validate, divergence) -> VerifyResult:  # checked, p: the proposal
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True, repr=False)
class Rejection(Rule):
    """Lossless speculative decoding: accept ``min(1, q_x / p_x)``, resample ``(q - p)_+``.

    vLLM's ``rejection_sample_method="standard"`` (``draft_sample_method`` ``"probabilistic"``
    or ``"greedy"``); with greedy drafts, llama.cpp's match and SGLang at thresholds 1 emit the
    same law.

    Examples
    --------
    >>> p = torch.tensor([0.6, 0.4], dtype=torch.float64)
    >>> q = torch.tensor([0.3, 0.7], dtype=torch.float64)
    >>> law = Rejection().law(p, q)
    >>> round(float(law.acceptance), 6), law.emitted.tolist()
    (0.7, [0.3, 0.7])
    >>> round(float(Rejection(drafting="greedy").law(p, q).acceptance), 6)  # q at argmax p
    0.3
    """

    name: ClassVar[str] = "rejection"

    @property
    def lossless(self) -> bool:
        return True

    def _engines(self) -> tuple[str, ...]:
        return ENGINES if self.drafting == "greedy" else ("mdboost", "hf", "vllm")

    def _law(self, p, q) -> TokenLaw:
        return TokenLaw(torch.minimum(p, q).sum(-1).clamp(0.0, 1.0), q)

    def _verify(self, tokens, p, q_all, generator, validate, divergence) -> VerifyResult:
        return verify(tokens, p, q_all, generator=generator, validate=False)


@dataclass(frozen=True, kw_only=True, repr=False)
class Block(Rejection):
    """vLLM's block verification (``rejection_sample_method="block"``, Sun et al. 2024): lossless.

    The drafts are judged as a block (:func:`mdboost.md.block.block_verify`, ``docs/theory.md``
    section 5b): the longest prefix whose test passes is kept, so a block accepts at least as many
    drafts as token-wise `Rejection`, draft by draft. It is `Rejection` but for its sampler: its
    :meth:`law`, :attr:`engines` and losslessness are a one-draft block's, token-wise rejection's (a longer block's accepted length is not a product of
    per-position acceptances: :func:`mdboost.md.block.block_acceptance_law`). With greedy drafts
    its law is token-wise rejection's exactly (section 5b).

    Examples
    --------
    >>> p = torch.tensor([0.6, 0.4], dtype=torch.float64)
    >>> q = torch.tensor([0.3, 0.7], dtype=torch.float64)
    >>> round(float(Block().law(p, q).acceptance), 6)
    0.7
    """

    name: ClassVar[str] = "block"

    def _verify(self, tokens, p, q_all, generator, validate, divergence) -> VerifyResult:
        return block_verify(tokens, p, q_all, generator=generator, validate=False)


@dataclass(frozen=True, kw_only=True, repr=False)
class Mentored(Rule):
    """Mentored decoding: the optimal clamp ``pi(a, b)`` at each position (``mdboost.md.verify``).

    Parameters
    ----------
    max_divergence : float, default=0.0
        Per-position budget ``D`` on ``D_f(pi || q)`` (0: lossless SD).
    divergence : str, default="kl"
        The generator ``f`` of the budget.
    min_acceptance : float or None
        The dual budget instead (then ``max_divergence`` stays 0).
    solve : {"all", "reached", "needed"}, default="all"
        Where :meth:`verify` solves the clamp (:func:`mdboost.md.verify.verify`'s ``solve``): the
        same tokens for every value; fewer solves, and NaN stats where none was needed.
    drafting : {"sampled", "greedy"}, default="sampled"

    Examples
    --------
    >>> p = torch.tensor([0.9, 0.1], dtype=torch.float64)
    >>> q = torch.tensor([0.5, 0.5], dtype=torch.float64)
    >>> law = Mentored(max_divergence=0.05).law(p, q)
    >>> round(float(law.acceptance), 4), round(float(Mentored(max_divergence=0.05).achieved_divergence(p, q)), 4)
    (0.7568, 0.05)
    """

    max_divergence: float = 0.0
    divergence: str = "kl"
    min_acceptance: float | None = None
    solve: str = "all"
    name: ClassVar[str] = "mentored"

    def __post_init__(self):
        super().__post_init__()
        check_budget_request(self.max_divergence, self.min_acceptance, self.divergence)
        if self.solve not in SOLVE:
            raise ValueError(f"solve must be one of {SOLVE}, got {self.solve!r}")

    @property
    def lossless(self) -> bool:
        return self.min_acceptance is None and self.max_divergence == 0

    def _engines(self) -> tuple[str, ...]:
        return Rejection(drafting=self.drafting)._engines() if self.lossless else ("mdboost", "hf")

    def _budget(self) -> dict:
        return dict(max_divergence=self.max_divergence, min_acceptance=self.min_acceptance,
                    divergence=self.divergence)

    def _law(self, p, q) -> TokenLaw:
        request = (dict(min_acceptance=self.min_acceptance) if self.min_acceptance is not None
                   else dict(max_divergence=self.max_divergence))
        sol = solve(p, q, divergence=self.divergence, validate=False, **request)
        pi = mentored_distribution(p, q, sol.a, sol.b, validate=False)
        return TokenLaw(sol.acceptance.double(), pi)

    def _verify(self, tokens, p, q_all, generator, validate, divergence) -> VerifyResult:
        return verify(tokens, p, q_all, generator=generator, validate=False, solve=self.solve, **self._budget())


@dataclass(frozen=True, kw_only=True, repr=False)
class Threshold(Rule):
    """SGLang's lossy acceptance (``--speculative-accept-threshold-acc`` / ``-single``).

    Accept the draft ``x`` with probability ``min(1, q_x / accept)``, always when
    ``q_x >= single``; at a rejection draw from ``q`` without ``x``, renormalised. SGLang runs it on
    greedy (top-k) drafts and never reads the draft probabilities; ``drafting="sampled"`` applies
    the same test to sampled drafts (mdboost's engine only). ``accept = 1`` is lossless (`Match`).

    Parameters
    ----------
    accept : float in (0, 1], default=1.0
        SGLang's ``threshold_acc`` ``c``.
    single : float in (0, 1], default=1.0
        SGLang's ``threshold_single`` ``s`` (the bound of ``docs/theory.md`` section 11 needs
        ``s >= c``; SGLang's default is 1).
    drafting : {"sampled", "greedy"}, default="greedy"

    Examples
    --------
    >>> p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    >>> q = torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    >>> law = Threshold(accept=0.8).law(p, q)  # draft 0: accepted with 0.4 / 0.8
    >>> round(float(law.acceptance), 6), [round(x, 6) for x in law.emitted.tolist()]
    (0.5, [0.5, 0.333333, 0.166667])
    """

    drafting: str = "greedy"
    accept: float = 1.0
    single: float = 1.0
    name: ClassVar[str] = "threshold"

    def __post_init__(self):
        super().__post_init__()
        for name in ("accept", "single"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")

    @classmethod
    def for_budget(cls, max_divergence: float, divergence="kl", *, drafting: str = "greedy") -> "Threshold":
        """The rule at ``accept = threshold_for_budget(max_divergence, divergence)``, ``single = 1``."""
        return cls(drafting=drafting, accept=threshold_for_budget(max_divergence, divergence))

    @property
    def lossless(self) -> bool:
        return self.accept == 1

    def _engines(self) -> tuple[str, ...]:
        if self.drafting == "sampled":
            return ("mdboost", "hf")
        return ENGINES if self.lossless else ("mdboost", "hf", "sglang")

    def _accept_prob(self, q_x):  # [...] -> [...]
        return torch.where(q_x >= self.single, torch.ones_like(q_x), (q_x / self.accept).clamp(max=1.0))

    def _law(self, p, q) -> TokenLaw:
        # pi_i = p_i t_i + q_i (R - p_i (1 - t_i) / (1 - q_i)), R = sum_x p_x (1 - t_x) / (1 - q_x)
        # (docs/theory.md, section 11); a token with q_x = 1 has t_x = 1 and no residual
        t = self._accept_prob(q)  # [..., V] acceptance of each token as the draft
        out = ((1 - t) / (1 - q).clamp(min=torch.finfo(q.dtype).tiny)).where(q < 1, torch.zeros_like(q))
        rest = (p * out).sum(-1, keepdim=True)  # [..., 1] R
        emitted = p * t + q * (rest - p * out)
        return TokenLaw((p * t).sum(-1).clamp(0.0, 1.0), emitted)

    def _verify(self, tokens, p, q_all, generator, validate, divergence) -> VerifyResult:
        num_draft = p.shape[1]
        q = q_all[:, :num_draft]
        u, p_x, q_x = draft_draws(tokens, p, q, generator, validate)  # p_x: 1 for greedy drafts
        ratio = self._accept_prob(q_x)
        num_accepted, by_budget = accepted_prefix(u[:, :num_draft], ratio, accept_ratio(q_x, p_x))
        def without_draft(rows, rpos):  # [B] x2 -> [B, V]: q without the rejected draft
            resid = q[rows, rpos].scatter(-1, tokens[rows, rpos].unsqueeze(-1), 0.0)
            return torch.where(resid.sum(-1, keepdim=True) > 0, resid, q[rows, rpos])  # q = x: rounding only

        return tokenwise_result(tokens, num_accepted, by_budget, u[:, num_draft], p, q_all,
                                self._law(p.double(), q.double()), divergence, without_draft)


def draft_draws(tokens, p, q, generator, validate: bool):  # [B, K], [B, K, V] x2 -> [B, K+1], [B, K] x2
    """A token-wise sampler's start: the ``K + 1`` uniforms per row (:func:`draw_uniforms`) and the
    drafts' ``p_x``, ``q_x`` (a draft ``p`` gives probability 0 is refused when ``validate``)."""
    batch, num_draft, _ = p.shape
    u = draw_uniforms(batch, num_draft, dtype=p.dtype, device=p.device, generator=generator)
    p_x = torch.gather(p, -1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, K]
    if validate and num_draft and bool((p_x <= 0).any()):
        raise ValueError("draft_tokens contains a token to which draft_probs gives probability 0")
    return u, p_x, torch.gather(q, -1, tokens.unsqueeze(-1)).squeeze(-1)


def tokenwise_result(tokens, num_accepted, by_budget, u_draw, p, q_all, law: TokenLaw, divergence, residual,
                     bonus=None) -> VerifyResult:
    """The shared tail of a token-wise rule's sampler: the one categorical draw, then the result.

    ``residual(rows, rpos)`` gives the weights ``[B, V]`` of the draw at each row's first rejected
    position; ``bonus`` the weights ``[B, V]`` after ``K`` accepted drafts (default the target at
    ``K``); ``u_draw`` ``[B]`` the draw's uniforms (column ``K`` of :func:`draw_uniforms`). The
    per-position stats are the rule's ``law`` (float64, ``[B, K]`` / ``[B, K, V]``); ``a``, ``b``
    NaN (not a clamp).
    """
    batch, num_draft, _ = p.shape
    weights = q_all[:, num_draft] if bonus is None else bonus  # [B, V]
    if num_draft:
        rows = torch.arange(batch, device=p.device)
        resid = residual(rows, num_accepted.clamp(max=num_draft - 1))
        weights = torch.where((num_accepted == num_draft).unsqueeze(-1), weights, resid)
    q = q_all[:, :num_draft]
    nan = torch.full((batch, num_draft), float("nan"), dtype=p.dtype, device=p.device)
    return VerifyResult(
        tokens=emitted_tokens(tokens, num_accepted, inverse_cdf(weights, u_draw)),
        num_accepted=num_accepted,
        acceptance_probability=law.acceptance.to(p.dtype),
        sd_acceptance=overlap(p, q, rescale=False),  # the rule's rows, checked and trusted
        divergence=f_divergence(law.emitted, q.double(), resolve(divergence), validate=False).to(p.dtype),
        accepted_by_budget=by_budget,
        a=nan,
        b=nan.clone(),
    )


@dataclass(frozen=True, kw_only=True, repr=False)
class Match(Threshold):
    """llama.cpp's verification: the target samples its own token; the draft is kept iff equal.

    The draft ``x`` is accepted with probability ``q_x``, and a rejection emits the target's
    sample, which is then ``q`` without ``x``: the law of ``Threshold(accept=1, single=1)``,
    lossless for any drafting (llama.cpp drafts greedily).
    """

    accept: float = field(default=1.0, init=False)
    single: float = field(default=1.0, init=False)
    name: ClassVar[str] = "match"

    def _engines(self) -> tuple[str, ...]:
        return ENGINES if self.drafting == "greedy" else ("mdboost", "hf")


def check_budget_request(max_divergence, min_acceptance, divergence) -> None:
    """The checks of an MD budget (``Mentored``'s and ``GenerationSettings``'): ``max_divergence``
    a number ``>= 0``; ``min_acceptance`` None or in ``[0, 1]``, and then ``max_divergence`` 0;
    ``divergence`` a generator :func:`mdboost.md.divergences.resolve` knows. Errors name the argument."""
    if isinstance(max_divergence, bool) or not isinstance(max_divergence, numbers.Real) or not max_divergence >= 0:
        raise ValueError(f"max_divergence must be a number >= 0, got {max_divergence!r}")
    if min_acceptance is not None:
        if isinstance(min_acceptance, bool) or not isinstance(min_acceptance, numbers.Real) \
                or not 0 <= min_acceptance <= 1:
            raise ValueError(f"min_acceptance must be in [0, 1] or None, got {min_acceptance!r}")
        if max_divergence != 0:
            raise ValueError(f"give max_divergence or min_acceptance, not both: max_divergence="
                             f"{max_divergence!r}, min_acceptance={min_acceptance!r}")
    try:
        resolve(divergence)
    except ValueError as err:
        raise ValueError(f"divergence: {err}") from err


def threshold_for_budget(max_divergence: float, divergence="kl") -> float:
    """The smallest SGLang ``accept`` threshold ``c`` that keeps every position's ``D_f(pi || q)``
    within ``max_divergence`` (``single >= c``; ``docs/theory.md``, section 11).

    The worst position has ``q_x = c`` and emits ``x`` surely, so ``c`` solves
    ``phi(c) = c g(1 / c) + (1 - c) g(0) = D``, ``phi`` decreasing from ``phi(0+)`` to
    ``phi(1) = 0`` (``kl``: ``c = exp(-D)``; ``tv``: ``c = 1 - D``). A budget at or above
    ``phi(0+)`` returns ``1e-9``, SGLang's floor on the threshold; a generator with
    ``g(0) = inf`` (``rkl``, ``neyman``, ``alpha:<a>`` with ``a <= -1``) returns 1 for every
    finite budget (emitting ``x`` surely costs ``q_i g(0) = inf``: no lossy threshold fits).

    Examples
    --------
    >>> round(threshold_for_budget(0.5, "kl"), 12) == round(math.exp(-0.5), 12)
    True
    >>> round(threshold_for_budget(0.25, "tv"), 12)
    0.75
    >>> threshold_for_budget(0.0)
    1.0
    """
    if isinstance(max_divergence, bool) or not isinstance(max_divergence, (int, float)) or not max_divergence >= 0:
        raise ValueError(f"max_divergence must be a number >= 0, got {max_divergence!r}")
    div = resolve(divergence)

    def phi(c: float) -> float:
        z = torch.tensor([1.0 / c, 0.0], dtype=torch.float64)
        g = div.g(z)
        return float(c * g[0] + (1 - c) * g[1])

    if max_divergence == 0:
        return 1.0
    lo, hi = 1e-9, 1.0  # phi(lo) > D >= phi(hi) = 0 unless the budget reaches phi(0+)
    if phi(lo) <= max_divergence:
        return lo
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if phi(mid) <= max_divergence:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-15:
            break
    return hi
