"""What :func:`mdboost.ranking.rank.score_pair` computes, as named types, and its CSV rows.

A :class:`PairScore` holds the pair-level results (:class:`PairStats`: quality, boosting,
diagnostics), the plain-SD speed choice and one :class:`PointScore` per (divergence, budget).
Speed predictions come in two kinds: the i.i.d. speed model's :class:`SpeedChoice`
(``docs/theory.md``, "Speed model for ranking") and, when the acceptance rows come with their
sequence layout, the draft-start process's :class:`~mdboost.ranking.process.ProcessScore`.
:func:`score_rows` is the one place that turns them into ``ranking.csv`` rows: ``best_gamma``
/ ``predicted_speedup`` (and ``sd_best_gamma`` / ``sd_speedup``) are the process's when there
is one, else the i.i.d. model's; the i.i.d. values are always in the ``*_iid`` columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mdboost.ranking.boosting import PairBoost
from mdboost.ranking.process import ProcessScore
from mdboost.ranking.report import ALONE
from mdboost.ranking.rule_points import RulePoint


def quantile(x, level: float) -> float:
    """The ``level`` quantile of the non-NaN values of ``x`` (``method="nearest"``); NaN if none."""
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    return float(np.quantile(x, level, method="nearest")) if x.size else math.nan


@dataclass(frozen=True)
class Quantiles:
    """The 10%, 50% and 90% quantiles of a per-position quantity (:func:`quantile`)."""

    q10: float
    median: float
    q90: float

    @classmethod
    def of(cls, x) -> Quantiles:
        return cls(quantile(x, 0.1), quantile(x, 0.5), quantile(x, 0.9))


@dataclass(frozen=True)
class SpeedChoice:
    """The i.i.d. speed model's best draft length, its predicted walltime speedup, and the
    speedup at every searched gamma (``speedups``, from ``gamma_min``)."""

    gamma: int
    speedup: float
    speedups: tuple = ()


@dataclass(frozen=True, eq=False)
class PairStats:
    """Pair-level results, the same for every operating point.

    ``n_positions``: rows of the quality/boosting side; ``acceptance_positions`` and
    ``proposal_rate`` (share of rows where the drafter has a distribution): the acceptance side;
    ``sd_acceptance``: mean SD acceptance ``sum_x min(p_x, q_x)`` there; ``eps_pq`` / ``rho_pq``:
    :func:`mdboost.ranking.diagnostics.pair_diagnostics` quantiles; ``boost``: the target-first
    boosting run; ``greedy``: the greedy run's columns (``None`` when not asked); NLLs in nats
    per token.
    """

    n_positions: int
    acceptance_positions: int
    proposal_rate: float
    tail_mass: float
    sd_acceptance: float
    cost_ratio: float
    boost: PairBoost
    greedy: dict | None
    eps_pq: Quantiles
    rho_pq: Quantiles
    nll_target: float
    nll_drafter: float
    nll_boosted: float
    boosted_scale: float
    nll_boosted_rescaled: float


@dataclass(frozen=True, eq=False)
class PointScore:
    """One operating point (divergence, budget ``max_divergence``).

    ``acceptance`` [M] and ``k`` [M]: per acceptance-side position, the MD acceptance and the
    boost coefficient ``k = sqrt((1 + a) / (1 - b))``; ``iid``: the i.i.d. speed model's choice;
    ``process``: the draft-start process's (or None), every figure at every searched gamma;
    ``verify_costs``: ``v`` at every searched gamma; ``md_overhead``: the ``s`` the speed model
    used (0 at budget 0). ``divergence`` is ``"none"`` for the budget-0 point (plain SD).
    ``rule``: the verification rule and the operating point it was set for (None: no rule
    columns in the rows; :func:`~mdboost.ranking.rank.score_pair` always sets it);
    ``achieved_divergence`` / ``achieved_divergence_max``: the mean and largest achieved
    ``D_f(pi || q)`` over the acceptance rows; ``acceptance`` is the rule's; ``drafter_share``
    (MD points): the share of those rows where the budget is at least ``D_f(p || q)``, so the
    mentored distribution is the drafter's own (:func:`~mdboost.ranking.acceptance.drafter_shares`).
    """

    divergence: str
    max_divergence: float
    acceptance: np.ndarray
    k: np.ndarray
    achieved_divergence: float
    nll_mentored: float
    iid: SpeedChoice
    process: ProcessScore | None
    verify_costs: tuple
    md_overhead: float
    tv: dict | None = None  # TV points: the clamp's and the boosted projection's NLL columns (rank._tv_boosted)
    text: str = "target"  # the text the process ran on: the target's continuations, or "own" (the point's rule's)
    rule: RulePoint | None = None
    achieved_divergence_max: float = math.nan
    drafter_share: float = math.nan

    @property
    def gamma(self) -> int:
        """The chosen draft length: the process's when there is one."""
        return self.iid.gamma if self.process is None else self.process.gamma


@dataclass(frozen=True, eq=False)
class PairScore:
    """Everything :func:`~mdboost.ranking.rank.score_pair` computes for one ordered pair.

    ``sd_acceptance`` [M]: per-position SD acceptance; ``sd_iid`` / ``sd_process``: plain SD's
    speed choice (i.i.d. model, draft-start process or None); ``points``: one per operating
    point, divergences outer, budgets inner (budget 0 once); ``temperature``, ``gammas`` and
    ``md_solve`` and ``batch_size`` (sequences per engine batch): what the predictions are for; ``bootstrap``: how the intervals were made
    (prompts, resamples, level, seed); ``prefill``: the speed model's ``(beta_t, beta_d)``, the
    target's and the drafter's prefill cost per prompt token (``docs/theory.md`` section 8).
    """

    drafter: str
    target: str
    acceptance_source: str
    stats: PairStats
    sd_acceptance: np.ndarray
    sd_iid: SpeedChoice
    sd_process: ProcessScore | None
    points: tuple[PointScore, ...]
    temperature: float = 1.0
    gammas: tuple = ()
    md_solve: str = "needed"
    bootstrap: dict | None = None
    prefill: tuple = (0.0, 0.0)
    batch_size: int = 1
    alone: object = None  # mdboost.ranking.process.AloneScore: the drafter decoding alone (None: prompt lookup)
    alone_tv: tuple | None = None  # (mean, max) TV(p, q) over the acceptance rows

    @property
    def margins(self) -> np.ndarray:  # [N]
        """Normalized boosting margins of the target-first run (for the margin CDF plot)."""
        return self.stats.boost.margins

    @property
    def md_acceptance(self) -> dict:
        """``(divergence, budget) -> acceptance [M]``."""
        return {(p.divergence, p.max_divergence): p.acceptance for p in self.points}

    @property
    def rows(self) -> list[dict]:
        """The ``ranking.csv`` rows of the operating points (:func:`score_rows`)."""
        return score_rows(self)

    @property
    def alone_rows(self) -> list[dict]:
        """The row of the drafter decoding alone, or none (:func:`alone_rows`)."""
        return alone_rows(self)


def _pair_columns(score: PairScore) -> dict:
    s, boost = score.stats, score.stats.boost
    sd = score.sd_iid if score.sd_process is None else SpeedChoice(score.sd_process.gamma, score.sd_process.at_best("speedup"))
    columns = {
        "drafter": score.drafter, "target": score.target, "n_positions": s.n_positions,
        "acceptance_positions": s.acceptance_positions, "proposal_rate": s.proposal_rate, "tail_mass": s.tail_mass,
        "sd_acceptance": s.sd_acceptance, "sd_best_gamma": int(sd.gamma), "sd_speedup": float(sd.speedup),
        "cost_ratio": s.cost_ratio,
        "mu_target": boost.mu_target, "mu_drafter": boost.mu_drafter, "boosting_advantage": boost.advantage,
        "c_target": boost.c_target, "c_drafter": boost.c_drafter,
        "margin_median": quantile(boost.margins, 0.5),
        **{f"margin_bound_{t:g}": v for t, v in boost.bound.items()},
        **{f"margin_risk_{t:g}": v for t, v in boost.risk.items()},
        "eps_pq_q10": s.eps_pq.q10, "eps_pq_median": s.eps_pq.median, "eps_pq_q90": s.eps_pq.q90,
        "rho_pq_q10": s.rho_pq.q10, "rho_pq_median": s.rho_pq.median, "rho_pq_q90": s.rho_pq.q90,
        "nll_target": s.nll_target, "nll_drafter": s.nll_drafter, "nll_boosted": s.nll_boosted,
        "boosted_scale": s.boosted_scale, "nll_boosted_rescaled": s.nll_boosted_rescaled,
        **(s.greedy or {}),
        "acceptance_source": score.acceptance_source,
        "sd_best_gamma_iid": int(score.sd_iid.gamma), "sd_speedup_iid": float(score.sd_iid.speedup),
        "prefill_target": float(score.prefill[0]), "prefill_drafter": float(score.prefill[1]),
    }
    if score.sd_process is not None:
        columns["sd_engine_acceptance"] = score.sd_process.at_best("acceptance")
    return columns


ENGINE_FIGURES = {"acceptance": "engine_acceptance", "acceptance_conditional": "engine_acceptance_conditional",
                  "mean_accepted_length": "engine_mean_accepted_length", "tokens_per_call": "engine_tokens_per_call"}
INTERVAL_COLUMNS = ("predicted_speedup", "engine_acceptance", "engine_mean_accepted_length", "engine_tokens_per_call")


def _speed_columns(point: PointScore, j: int, gamma: int) -> dict:
    """The speed predictions of ``point`` at its ``j``-th searched draft length ``gamma``."""
    iid = {"best_gamma_iid": int(point.iid.gamma), "predicted_speedup_iid": float(point.iid.speedups[j])}
    p = point.process
    nan = float("nan")
    if p is None:
        out = {"predicted_speedup": iid["predicted_speedup_iid"], "predicted_speedup_lo": nan,
               "predicted_speedup_hi": nan, "predicted_speedup_prompts_lo": nan, "predicted_speedup_prompts_hi": nan,
               "speedup_free_drafter": nan}
    else:
        out = {"predicted_speedup": float(p.values["speedup"][j]), "predicted_speedup_lo": float(p.lo["speedup"][j]),
               "predicted_speedup_hi": float(p.hi["speedup"][j]),
               "predicted_speedup_prompts_lo": float(p.lo["speedup_prompts"][j]),
               "predicted_speedup_prompts_hi": float(p.hi["speedup_prompts"][j]),
               "speedup_free_drafter": nan if p.free_speedup is None else float(p.free_speedup[j])}
        for figure, column in ENGINE_FIGURES.items():
            out[column] = float(p.values[figure][j])
            if column in INTERVAL_COLUMNS:
                out[f"{column}_lo"], out[f"{column}_hi"] = float(p.lo[figure][j]), float(p.hi[figure][j])
    best = point.gamma
    return {"gamma": gamma, "best_gamma": best, "is_best_gamma": gamma == best, **out, **iid}


def _rule_columns(point: PointScore) -> dict:
    """Which rule the row is (``docs/ranking.md``, "Rules and engines")."""
    rp = point.rule
    if rp is None:
        return {}
    acc, single = rp.threshold
    return {"rule": rp.rule.name, "drafting": rp.rule.drafting, "draft_p_min": rp.rule.draft_p_min,
            "engines": " ".join(rp.rule.engines),
            "threshold_acc": acc, "threshold_single": single,
            "achieved_divergence_mean": point.achieved_divergence,
            "achieved_divergence_max": point.achieved_divergence_max, "drafter_share": point.drafter_share}


def _row_columns(score: PairScore) -> dict:
    """The columns every row of the pair holds: the pair's, and what its predictions are for."""
    return {**_pair_columns(score), "temperature": score.temperature, "md_solve": score.md_solve,
            "batch_size": score.batch_size}


def score_rows(score: PairScore) -> list[dict]:
    """One ``ranking.csv`` row per operating point and searched gamma (column definitions:
    ``docs/ranking.md``)."""
    common = _row_columns(score)
    rows = []
    for point in score.points:
        acc, k = point.acceptance, point.k
        base = {
            **common, "divergence": point.divergence, "max_divergence": point.max_divergence,
            "md_acceptance": float(acc.mean()), "md_acceptance_q10": quantile(acc, 0.1),
            "md_acceptance_median": quantile(acc, 0.5), "md_acceptance_q90": quantile(acc, 0.9),
            "acceptance_gain": float(acc.mean()) - common["sd_acceptance"],
            "achieved_divergence": point.achieved_divergence,
            "md_overhead": point.md_overhead, "process_text": point.text, "k_median": quantile(k, 0.5), "k_q90": quantile(k, 0.9),
            "nll_mentored": point.nll_mentored, "beats_target": bool(point.nll_mentored < common["nll_target"]),
            **(point.tv or {}), **_rule_columns(point),
        }
        for j, gamma in enumerate(score.gammas):
            rows.append({**base, **_speed_columns(point, j, gamma), "verify_cost": float(point.verify_costs[j])})
    return rows


def alone_rows(score: PairScore) -> list[dict]:
    """The ``ranking.csv`` row of the drafter decoding alone (:func:`_alone_row`), or none (prompt
    lookup cannot decode alone); a ranking lists it after the pair's points."""
    return [] if score.alone is None else [_alone_row(score, _row_columns(score))]


def _alone_row(score: PairScore, common: dict) -> dict:
    """The row of the drafter decoding alone (``docs/ranking.md``, "The drafter alone"): no drafts
    (gamma 0, no acceptance figures), the drafter's speed and NLL, ``drafter_share`` 1 (every
    token is the drafter's), its distance from the target as ``tv`` (``max_divergence``: the
    largest ``TV(p, q)``, the smallest TV budget at which MD emits the drafter at every position);
    ``engines``: mdboost's (it ranks mdboost's engine decoding the drafter's model; to serve an
    early exit elsewhere, ``mdboost export --write-drafter`` writes it as a model of its own)."""
    nan = float("nan")
    mean_tv, max_tv = score.alone_tv if score.alone_tv is not None else (nan, nan)
    a = score.alone
    row = {**common, "divergence": "tv", "max_divergence": max_tv, "rule": ALONE, "drafting": "none",
           "draft_p_min": 0.0, "engines": "mdboost", "threshold_acc": nan, "threshold_single": nan,
           "gamma": 0, "best_gamma": 0, "is_best_gamma": True,
           "predicted_speedup": a.speedup, "predicted_speedup_lo": a.lo, "predicted_speedup_hi": a.hi,
           "predicted_speedup_prompts_lo": a.prompts_lo, "predicted_speedup_prompts_hi": a.prompts_hi,
           "predicted_speedup_iid": nan, "best_gamma_iid": 0, "speedup_free_drafter": nan,
           "md_acceptance": nan, "md_acceptance_q10": nan, "md_acceptance_median": nan, "md_acceptance_q90": nan,
           "acceptance_gain": nan, "achieved_divergence": mean_tv,
           "achieved_divergence_mean": mean_tv, "achieved_divergence_max": max_tv, "drafter_share": 1.0,
           "md_overhead": 0.0, "verify_cost": nan, "process_text": "target", "k_median": nan, "k_q90": nan,
           "nll_mentored": common["nll_drafter"], "beats_target": bool(common["nll_drafter"] < common["nll_target"])}
    for column in ENGINE_FIGURES.values():
        row[column] = nan
    for column in INTERVAL_COLUMNS[1:]:
        row[f"{column}_lo"] = row[f"{column}_hi"] = nan
    return row
