"""Score one drafter/target pair from cached rows, and the ranking rule over all pairs.

One row per (pair, divergence, budget) operating point, with the columns of ``ranking.csv``
(definitions: ``docs/ranking.md``). The **ranking rule**:

1. an operating point is *eligible* when its mentored NLL stays within ``nll_tolerance``
   nats per token of the target's NLL (``quality_ok``); budget 0 (plain SD) always is;
2. eligible points come first, ordered by predicted walltime speedup (descending);
3. ties (equal speedup to 1e-9) are broken by complementarity, the boosting advantage
   ``A = mu_target^2 + mu_drafter^2`` (descending), then by MD acceptance;
4. ineligible points follow in the same order. ``rank`` is 1-based.

Acceptance-side columns (``sd_*``, ``md_acceptance*``, ``acceptance_gain``, ``best_gamma``,
``predicted_speedup``, ``achieved_divergence``, ``k_*``, ``eps_pq_*``, ``rho_pq_*``,
``proposal_rate``, ``acceptance_positions``) can come from other rows than the quality and
boosting columns: ``score_pair(..., acceptance=(draft, target, labels))`` scores them on, e.g.,
continuations sampled from the target, the text MD decodes; the ``acceptance_source`` column
says which.

Predicted speedups and best draft lengths come from :mod:`mdboost.ranking.speed`, fed the
target's measured verification cost table and MD solve overhead
(``score_pair(..., speed_profile=...)``; budget-0 points get no MD overhead). When the
acceptance rows come with their :class:`~mdboost.ranking.layout.SequenceLayout`
(``acceptance=(draft, target, labels, layout)``, the target-sampled cache), the draft-start
process of :mod:`mdboost.ranking.process` replaces the i.i.d. block: ``best_gamma``,
``predicted_speedup`` (and ``sd_best_gamma``, ``sd_speedup``) come from it, with
``engine_acceptance`` (expected acceptance at draft position 0 where the engine drafts),
``engine_mean_accepted_length`` and friends; the i.i.d. values stay as ``*_iid`` columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from mdboost.config import BoostingConfig, MDConfig, SpeedConfig
from mdboost.ranking import quality
from mdboost.ranking.acceptance import md_operating_points, sd_acceptance
from mdboost.ranking.boosting import boost_greedy, boost_target_first
from mdboost.ranking.diagnostics import boost_coefficient, pair_diagnostics
from mdboost.ranking.layout import SequenceLayout
from mdboost.ranking.process import PointInputs, budget_tilt, score_process
from mdboost.ranking.speed import SpeedProfile, best_gamma
from mdboost.ranking.support import MemberRows, align


@dataclass
class Member:
    """A pool member as the ranking sees it: cached rows, a boosting hypothesis, its cost."""

    name: str
    rows: MemberRows
    hypothesis: object
    cost_ratio: float


@dataclass
class PairScore:
    """CSV rows of one pair, plus per-position arrays kept for plots."""

    rows: list[dict]
    sd_acceptance: np.ndarray  # [N]
    md_acceptance: dict  # (divergence, budget) -> [N]
    k: dict  # (divergence, budget) -> [N]
    margins: np.ndarray  # [N]


def _q(x, level: float) -> float:
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    return float(np.quantile(x, level, method="nearest")) if x.size else math.nan


def _mean(x: torch.Tensor) -> float:
    return float(x.double().mean())


def _pair_common(draft: Member, target: Member, aligned, acc_aligned, acc_valid, sd, labels, row_ids,
                 md: MDConfig, speed: SpeedConfig, boosting: BoostingConfig, profile: SpeedProfile):
    valid = draft.rows.valid
    eps, rho = pair_diagnostics(acc_aligned.p, acc_aligned.q, mask=acc_aligned.kept)
    eps, rho = eps[acc_valid].numpy(), rho[acc_valid].numpy()
    boost = boost_target_first(target.hypothesis, draft.hypothesis, row_ids, labels,
                               n_rounds=boosting.n_estimators, thetas=boosting.thetas)
    sd_gamma, sd_speed = best_gamma(_mean(sd), draft.cost_ratio, speed.gamma_min, speed.gamma_max,
                                    verify_costs=profile.verify_cost)
    nll_b = quality.nll_boosted(aligned, draft.rows, target.rows, boost.c_target, boost.c_drafter, md.temperature)
    scale, nll_scaled = quality.best_boosted_scale(aligned, draft.rows, target.rows, boost.c_target,
                                                   boost.c_drafter, md.temperature)
    common = {
        "drafter": draft.name, "target": target.name, "n_positions": int(valid.numel()),
        "acceptance_positions": int(acc_valid.numel()),
        "proposal_rate": _mean(acc_valid.double()), "tail_mass": _mean(draft.rows.tail + target.rows.tail),
        "sd_acceptance": _mean(sd), "sd_best_gamma": int(sd_gamma), "sd_speedup": float(sd_speed),
        "cost_ratio": float(draft.cost_ratio),
        "mu_target": boost.mu_target, "mu_drafter": boost.mu_drafter, "boosting_advantage": boost.advantage,
        "c_target": boost.c_target, "c_drafter": boost.c_drafter,
        "margin_median": _q(boost.margins, 0.5),
        **{f"margin_bound_{t:g}": v for t, v in boost.bound.items()},
        **{f"margin_risk_{t:g}": v for t, v in boost.risk.items()},
        "eps_pq_q10": _q(eps, 0.1), "eps_pq_median": _q(eps, 0.5), "eps_pq_q90": _q(eps, 0.9),
        "rho_pq_q10": _q(rho, 0.1), "rho_pq_median": _q(rho, 0.5), "rho_pq_q90": _q(rho, 0.9),
        "nll_target": _mean(quality.nll(target.rows)), "nll_drafter": _mean(quality.nll(draft.rows)),
        "nll_boosted": _mean(nll_b), "boosted_scale": scale, "nll_boosted_rescaled": nll_scaled,
    }
    if "greedy" in boosting.orders:
        common.update(boost_greedy(target.hypothesis, draft.hypothesis, row_ids, labels, boosting.n_estimators))
    return common, boost


@dataclass
class _AcceptanceSide:
    """The rows the acceptance columns are computed from (and, when known, their sequences)."""

    draft: Member
    target: Member
    labels: torch.Tensor
    aligned: object
    layout: SequenceLayout | None = None

    @property
    def valid(self) -> torch.Tensor:
        return self.draft.rows.valid


def _acceptance_side(acceptance, draft: Member, target: Member, labels, aligned, vocab_size: int) -> _AcceptanceSide:
    if acceptance is None:
        return _AcceptanceSide(draft, target, torch.as_tensor(labels), aligned)
    if len(acceptance) not in (3, 4):
        raise ValueError(f"acceptance must be (draft, target, labels[, layout]), got {len(acceptance)} items")
    a_draft, a_target, a_labels = acceptance[:3]
    layout = acceptance[3] if len(acceptance) == 4 else None
    a_labels = torch.as_tensor(np.asarray(a_labels))
    if layout is not None and torch.as_tensor(layout.sequence).shape != a_labels.shape:
        raise ValueError(f"acceptance layout covers {torch.as_tensor(layout.sequence).numel()} rows, labels {a_labels.numel()}")
    return _AcceptanceSide(a_draft, a_target, a_labels, align(a_draft.rows, a_target.rows, vocab_size, a_labels), layout)


def _process_scores(side: _AcceptanceSide, ops, sd, speed: SpeedConfig, profile: SpeedProfile):
    """Process predictions (:mod:`mdboost.ranking.process`): SD first, then one per operating point."""
    zeros = torch.zeros_like(sd, dtype=torch.float64)
    p_mass, q_mass = side.aligned.p_mass, side.aligned.q_mass
    points = [PointInputs(zeros, zeros, sd.double(), 0.0)]
    points += [PointInputs(op.a, op.b, op.acceptance, profile.md_overhead if op.max_divergence > 0 else 0.0,
                           budget_tilt(p_mass, q_mass, op.a, op.b, op.acceptance)) for op in ops]
    return score_process(side.layout, side.draft.rows, side.target.rows, side.labels, points,
                         range(speed.gamma_min, speed.gamma_max + 1), side.draft.cost_ratio,
                         verify_costs=profile.verify_cost, md_solve=speed.md_solve, sd_acceptance=sd)


def _process_columns(score) -> dict:
    return {"best_gamma": score.gamma, "predicted_speedup": score.speedup, "engine_acceptance": score.acceptance,
            "engine_acceptance_conditional": score.acceptance_conditional,
            "engine_mean_accepted_length": score.mean_accepted_length, "engine_tokens_per_call": score.tokens_per_call}


def score_pair(draft: Member, target: Member, labels, vocab_size: int, *, md: MDConfig | None = None,
               speed: SpeedConfig | None = None, boosting: BoostingConfig | None = None,
               row_ids=None, acceptance: tuple | None = None, acceptance_source: str | None = None,
               speed_profile: SpeedProfile | None = None) -> PairScore:
    """All metrics of one ordered pair, one row per (divergence, budget).

    Parameters
    ----------
    draft, target : Member
        Cached rows over the same ``N`` positions.
    labels : array [N]
        True next tokens.
    vocab_size : int
    md, speed, boosting : config sections, optional
        Operating points, gamma range, boosting rounds (defaults: the dataclass defaults).
    row_ids : array [N], optional
        Cache row index of each position (the boosting hypotheses' ``X``); default ``arange(N)``.
    acceptance : (Member, Member, array [M][, SequenceLayout]), optional
        ``(draft, target, labels)`` on other rows (e.g. target-sampled continuations) to take the
        acceptance-side columns from; the draft's cost ratio is used for the speed model. Default:
        the rows above. With a fourth item, the rows' :class:`~mdboost.ranking.layout.SequenceLayout`
        (:func:`~mdboost.ranking.layout.sequence_layout` of the drafter's cache), the speed
        columns come from the draft-start process and the ``engine_*`` columns are added.
    acceptance_source : str, optional
        The ``acceptance_source`` column: default ``"reference"`` without ``acceptance``,
        ``"sampled"`` with it.
    speed_profile : SpeedProfile, optional
        The target's verification cost table and the MD overhead for this pair's drafts
        (:mod:`mdboost.ranking.speed`); default: ``v = 1``, ``s = 0`` (Leviathan et al.). The
        overhead applies to budgets > 0 only.
    """
    md, speed, boosting = md or MDConfig(), speed or SpeedConfig(), boosting or BoostingConfig()
    profile = speed_profile or SpeedProfile()
    labels = np.asarray(labels)
    row_ids = np.arange(len(labels)) if row_ids is None else np.asarray(row_ids)
    aligned = align(draft.rows, target.rows, vocab_size, torch.as_tensor(labels))
    valid = draft.rows.valid
    side = _acceptance_side(acceptance, draft, target, labels, aligned, vocab_size)
    acc_aligned, acc_valid = side.aligned, side.valid
    sd = sd_acceptance(acc_aligned, acc_valid)
    common, boost = _pair_common(draft, target, aligned, acc_aligned, acc_valid, sd, labels, row_ids, md, speed,
                                 boosting, profile)
    common["acceptance_source"] = acceptance_source or ("reference" if acceptance is None else "sampled")
    common.update(sd_best_gamma_iid=common["sd_best_gamma"], sd_speedup_iid=common["sd_speedup"])
    acc_ops = md_operating_points(acc_aligned, acc_valid, md.divergences, md.budgets, md.mode)
    ref_ops = acc_ops if acceptance is None else md_operating_points(aligned, valid, md.divergences, md.budgets, md.mode)
    process = None if side.layout is None else _process_scores(side, acc_ops, sd, speed, profile)
    if process is not None:
        common.update(sd_best_gamma=process[0].gamma, sd_speedup=process[0].speedup,
                      sd_engine_acceptance=process[0].acceptance)
    rows, md_acc, ks = [], {}, {}
    for i, (op, ref_op) in enumerate(zip(acc_ops, ref_ops, strict=True)):
        overhead = profile.md_overhead if op.max_divergence > 0 else 0.0
        gamma, speedup = best_gamma(_mean(op.acceptance), side.draft.cost_ratio, speed.gamma_min, speed.gamma_max,
                                    verify_costs=profile.verify_cost, md_overhead=overhead, md_solve=speed.md_solve,
                                    sd_acceptance=common["sd_acceptance"])
        point = {"best_gamma": int(gamma), "predicted_speedup": float(speedup)}
        point.update(best_gamma_iid=point["best_gamma"], predicted_speedup_iid=point["predicted_speedup"])
        if process is not None:
            point.update(_process_columns(process[i + 1]))
        k = boost_coefficient(op.a, op.b)[acc_valid].numpy()
        nll_m = _mean(quality.nll_mentored(draft.rows, target.rows, ref_op.a, ref_op.b))
        acc = op.acceptance.numpy()
        rows.append({
            **common, "divergence": op.divergence, "max_divergence": op.max_divergence,
            "md_acceptance": float(acc.mean()), "md_acceptance_q10": _q(acc, 0.1),
            "md_acceptance_median": _q(acc, 0.5), "md_acceptance_q90": _q(acc, 0.9),
            "acceptance_gain": float(acc.mean()) - common["sd_acceptance"],
            "achieved_divergence": _mean(op.achieved_divergence[acc_valid]) if bool(acc_valid.any()) else 0.0,
            **point,
            "verify_cost": 1.0 if profile.verify_cost is None else float(profile.verify_cost[point["best_gamma"]]),
            "md_overhead": float(overhead),
            "k_median": _q(k, 0.5), "k_q90": _q(k, 0.9),
            "nll_mentored": nll_m, "beats_target": bool(nll_m < common["nll_target"]),
        })
        md_acc[(op.divergence, op.max_divergence)] = acc
        ks[(op.divergence, op.max_divergence)] = k
    return PairScore(rows, sd.numpy(), md_acc, ks, boost.margins)


def rank_rows(rows: list[dict], nll_tolerance: float = 0.05) -> list[dict]:
    """Apply the ranking rule of the module docstring; returns new dicts sorted by ``rank``."""
    if nll_tolerance < 0:
        raise ValueError(f"nll_tolerance must be >= 0, got {nll_tolerance!r}")
    out = [dict(r, quality_ok=bool(r["nll_mentored"] <= r["nll_target"] + nll_tolerance)) for r in rows]
    out.sort(key=lambda r: (not r["quality_ok"], -round(r["predicted_speedup"], 9),
                            -r["boosting_advantage"], -r["md_acceptance"]))
    for i, r in enumerate(out, start=1):
        r["rank"] = i
    return out
