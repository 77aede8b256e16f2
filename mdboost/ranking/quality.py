"""Teacher-forced quality of the target, the drafter, mentored and boosted distributions.

Per position ``i`` with true next token ``j`` (reference text), the negative log-likelihood
``-log d_j`` under each distribution ``d``:

- target ``q`` and drafter ``p``: exact (the cache keeps the true token's logit and the
  full-vocabulary normalizer). A one-hot drafter gives ``inf`` on a miss or no proposal.
- mentored ``pi(a, b) = max{(1-b) q, min{p, (1+a) q}}`` (``docs/theory.md`` section 4) at the operating
  point ``(a, b)`` found per position: ``pi_j`` needs only ``p_j``, ``q_j``, ``a``, ``b``, so it
  is exact given ``(a, b)``; the ``(a, b)`` themselves come from the solver on the aligned
  support (:mod:`mdboost.ranking.support`, uniform-tail approximation unless full logits).
- boosted ``softmax(c1 h_q + c2 h_p)`` (Section 4: the geometric mixture ``q^c1 p^c2`` up to
  normalization; ``h`` = logits, or the one-hot proposal for a prompt-lookup drafter),
  The numerator is exact; the normalizer is summed on the aligned support (the union of the
  two top-k sets plus the tail bucket, uniform-tail approximation) with the true token's
  approximated term (its kept value, or the tail level of a model that did not keep it)
  swapped for its exact one, so ``Z >= exp(H_j)`` and the NLL is never negative at any scale
  (exact with full logits, and when ``k = V - 1``). Because the
  leveraging coefficients carry ``1 / h*``, ``softmax(H_T)`` is far flatter than either model;
  :func:`best_boosted_scale` also reports the mixture ``softmax(s H_T)`` at its best ``s``.

- boosted projection (TV points only, paper Section 4.3): the boosted ensemble
  ``softmax(s H_T)`` projected onto the TV optimal set at the point's budget
  (:func:`mdboost.md.tv_set.tv_projection`, ``docs/theory.md`` section 10), on the aligned support;
  the true token's ``pi_j = clip(s_g r_j, min(p_j, q_j), max(p_j, q_j))`` from its exact ``p_j``,
  ``q_j``, ``r_j`` and its group's scale. Its acceptance is the clamp's (both are optimal).

``beats_target``: the mean NLL of the mentored distribution is below the target's (the
paper's case where MD improves on the target itself).
"""

from __future__ import annotations

import torch
from scipy.optimize import minimize_scalar

from mdboost.md.solve import clamp
from mdboost.md.tv_set import tv_projection
from mdboost.ranking.support import Aligned, MemberRows


def nll(rows: MemberRows) -> torch.Tensor:  # [N]
    """``-log d_j`` of the true next token under a member's own distribution."""
    return -rows.true_logp.double()


def mentored_true_prob(draft: MemberRows, target: MemberRows, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``pi_j`` of the true token at per-position ``(a, b)`` ([N] each); returns [N]."""
    return clamp(draft.true_logp.double().exp(), target.true_logp.double().exp(), a, b)


def nll_mentored(draft: MemberRows, target: MemberRows, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # [N]
    """NLL of the true token under ``pi(a, b)``; rows where the drafter is invalid use ``q``."""
    valid = draft.valid
    a = torch.where(valid, a.double(), torch.zeros_like(a, dtype=torch.float64))
    b = torch.where(valid, b.double(), torch.zeros_like(b, dtype=torch.float64))
    return -mentored_true_prob(draft, target, a, b).log()


def nll_tv_boosted(aligned: Aligned, draft: MemberRows, target: MemberRows, max_divergence: float, c_target: float,
                   c_drafter: float, temperature: float = 1.0, scale: float = 1.0) -> torch.Tensor:  # [N]
    """NLL of the true token under ``softmax(scale * H_T)`` projected onto the TV optimal set.

    ``H_T = c_target h_q + c_drafter h_p`` as in :func:`nll_boosted`; the set is the one of the
    aligned support's ``p``, ``q`` at budget ``max_divergence``; rows where the drafter is
    invalid use ``q`` (nothing is drafted there).
    """
    valid = draft.valid
    mix, exact, _ = _boosted_scores(aligned, draft, target, c_target, c_drafter, temperature)
    log_r = scale * mix[valid]  # [M, S], -inf on empty slots
    shift = torch.where(torch.isfinite(log_r), log_r, torch.full_like(log_r, -torch.inf)).amax(-1, keepdim=True)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    p_m, q_m = aligned.p_mass[valid], aligned.q_mass[valid]
    p_m, q_m = p_m / p_m.sum(-1, keepdim=True), q_m / q_m.sum(-1, keepdim=True)
    proj = tv_projection(p_m, q_m, max_divergence, torch.exp(log_r - shift) * aligned.count[valid], validate=False)
    p_j, q_j = draft.true_logp.double().exp(), target.true_logp.double().exp()  # [N]
    r_j = torch.exp(scale * exact[valid] - shift.squeeze(-1))
    s_g = torch.where(p_j[valid] >= q_j[valid], proj.upper_scale, proj.lower_scale)
    lo, hi = torch.minimum(p_j, q_j)[valid], torch.maximum(p_j, q_j)[valid]
    pi_j = q_j.clone()
    pi_j[valid] = torch.minimum(torch.maximum(s_g * r_j, lo), hi)
    return -pi_j.log()


def _scores(aligned_log: torch.Tensor, one_hot: bool, temperature: float) -> torch.Tensor:
    if one_hot:  # indicator of the proposal: log value 0 there, -inf elsewhere
        return (aligned_log == 0).to(torch.float64)
    return aligned_log * temperature  # logits up to a per-row shift


def _true_score(lq: torch.Tensor, lp: torch.Tensor, draft: MemberRows, c_target: float, c_drafter: float,
                temperature: float) -> torch.Tensor:  # [N]
    true_p = (lp.double() == 0).to(torch.float64) if draft.one_hot else lp.double() * temperature
    true_p = torch.zeros_like(true_p) if c_drafter == 0 else c_drafter * true_p
    return c_target * lq.double() * temperature + true_p


def _boosted_scores(aligned: Aligned, draft: MemberRows, target: MemberRows, c_target: float, c_drafter: float,
                    temperature: float):
    """``H`` on the support ([N, S], ``-inf`` on empty slots), and at the true token: exact ([N])
    and as the support approximates it ([N], the token's kept value or its tail level)."""
    h_q = _scores(aligned.log_q, False, temperature)
    h_p = _scores(aligned.log_p, draft.one_hot, temperature)
    if c_drafter == 0:
        h_p = torch.zeros_like(h_p)
    mix = torch.where(aligned.count > 0, c_target * h_q + c_drafter * h_p, torch.full_like(h_q, float("-inf")))
    exact = _true_score(target.true_logp, draft.true_logp, draft, c_target, c_drafter, temperature)
    if aligned.true_log_q is None:
        return mix, exact, None
    approx = _true_score(aligned.true_log_q, aligned.true_log_p, draft, c_target, c_drafter, temperature)
    return mix, exact, approx


def nll_boosted(aligned: Aligned, draft: MemberRows, target: MemberRows, c_target: float, c_drafter: float,
                temperature: float = 1.0, scale: float = 1.0) -> torch.Tensor:  # [N]
    """NLL of the true token under ``softmax(scale * (c_target h_q + c_drafter h_p))``.

    ``h`` are the models' logits at temperature 1 (recovered as ``temperature * log-prob``, the
    shift cancels); for a one-hot drafter ``h_p`` is the proposal indicator. ``scale = 1`` is
    the boosted distribution ``softmax(H_T)`` itself. Its coefficients ``alpha_t`` carry the
    ``1 / h*_t`` normalization, so ``H_T`` is usually a much flatter (hotter) distribution
    than either model: its NLL measures the boosting model as fitted, not the best mixture.
    """
    mix, exact, approx = _boosted_scores(aligned, draft, target, c_target, c_drafter, temperature)
    return _log_z(aligned, mix, scale, exact, approx) - scale * exact


def _log_z(aligned: Aligned, mix: torch.Tensor, scale: float, exact: torch.Tensor,
           approx: torch.Tensor | None) -> torch.Tensor:  # [N]
    """``log Z``: the support sum with the true token's approximated term swapped for its exact one
    (``Z - exp(s H~_j) + exp(s H_j)``), so ``Z >= exp(s H_j)`` and the NLL is never negative."""
    log_z = torch.logsumexp(scale * mix + aligned.count.log(), dim=-1)  # count-0 slots drop out
    if approx is None:
        return log_z
    finite = torch.isfinite(log_z)  # a row whose cached values are all -inf/overflowed keeps only the exact term
    share = torch.exp(torch.where(finite, scale * approx - log_z, torch.zeros_like(log_z))).clamp(max=1.0)
    rest = torch.where(finite, log_z + torch.log1p(-share), torch.full_like(log_z, float("-inf")))
    return torch.logaddexp(rest, scale * exact)


def best_boosted_scale(aligned: Aligned, draft: MemberRows, target: MemberRows, c_target: float,
                       c_drafter: float, temperature: float = 1.0, max_scale: float = 1e4) -> tuple[float, float]:
    """``(s*, mean NLL)`` minimizing the mean NLL of ``softmax(s H_T)`` over ``s`` in ``[0, max_scale]``.

    The geometric mixture ``q^(s c1) p^(s c2)`` at its best temperature: the NLL is convex in
    ``s`` (log-sum-exp minus a linear term), so a bounded scalar search finds the optimum.
    Fitted on the same positions it is evaluated on (one parameter), hence mildly optimistic.
    """
    mix, exact, approx = _boosted_scores(aligned, draft, target, c_target, c_drafter, temperature)

    def mean_nll(log_s: float) -> float:
        s = float(torch.tensor(log_s).exp())
        return float((_log_z(aligned, mix, s, exact, approx) - s * exact).mean())

    found = minimize_scalar(mean_nll, bounds=(-8.0, float(torch.tensor(max_scale).log())), method="bounded",
                            options={"xatol": 1e-4})
    return float(torch.tensor(found.x).exp()), float(found.fun)
