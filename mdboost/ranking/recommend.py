"""One recommendation from a ranking: which pair, at which settings, how fast, how sure.

The rule (documented in ``docs/ranking.md``, section "The recommendation"), over the ranking's
rows, one per (drafter, target, temperature, divergence, budget, gamma):

1. *eligible* rows are those whose mentored NLL stays within the tolerance of the target's
   (``quality_ok``); if no row is eligible, every row is considered (and the verdict says so);
2. a row *beats plain decoding* when the lower end of its predicted speedup interval is above 1
   (``predicted_speedup_lo > 1``): a point whose interval reaches 1 is not called faster;
3. among eligible rows that beat plain decoding, the largest predicted speedup wins (ties: the
   larger lower bound, then the smaller gamma, then the smaller budget);
4. when none beats plain decoding, the recommendation is plain decoding with the target, and
   it names the best speculative point by the same order (its figures, ``beats_plain_decoding``
   false) so the user sees how far it is.

The same rule over the rows one engine can run (its name in the row's ``engines``, from the
row's verification rule, :attr:`mdboost.md.rules.Rule.engines`) gives that engine's
recommendation (:func:`recommend_engines`, ``summary.json``'s ``recommendations``).

Rows are plain dicts (CSV rows may hold strings): this module reads them, nothing else.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from mdboost.models.specs import parse_drafter
from mdboost.ranking.report import ALONE, csv_bool, csv_float, row_draft_p_min

DEGENERATE_SHARE = 0.95  # a budget >= D_f(p || q) at this share of positions or more is called out

FIELDS = ("drafter", "target", "temperature", "divergence", "max_divergence", "gamma", "predicted_speedup",
          "predicted_speedup_lo", "predicted_speedup_hi", "beats_plain_decoding")


@dataclass(frozen=True)
class Recommendation:
    """The ranking's answer (the first ten fields are ``summary.json``'s ``recommendation``).

    ``beats_plain_decoding`` false means: decode with the target alone; the other fields then
    describe the best speculative point, for reference.
    """

    drafter: str
    target: str
    temperature: float
    divergence: str
    max_divergence: float
    gamma: int
    predicted_speedup: float
    predicted_speedup_lo: float
    predicted_speedup_hi: float
    beats_plain_decoding: bool
    quality_ok: bool
    nll_target: float
    nll_mentored: float
    rule: str = "mentored"
    drafting: str = "sampled"
    threshold_acc: float | None = None  # SGLang's thresholds, for its rule only
    threshold_single: float | None = None
    draft_p_min: float = 0.0  # llama.cpp's draft probability floor (greedy drafts; 0: none)
    drafter_share: float | None = None  # MD: positions where the budget >= D_f(p || q) (None: not MD)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def alone(self) -> bool:
        """Whether the point is the drafter decoding alone (rule ``"alone"``: no target, gamma 0)."""
        return self.rule == ALONE

    @property
    def point(self) -> str:
        """``"ngram:3 -> smollm2-135m, T=0.7, kl <= 0.2, gamma 4"`` (budget 0: ``SD``; a rule other
        than MD on sampled drafts is named: ``"..., gamma 4, threshold (greedy drafts)"``; the
        drafter alone: ``"int8 alone (instead of t), T=0.7"``)."""
        if self.alone:
            return f"{self.drafter} alone (instead of {self.target}), T={self.temperature:g}"
        budget = "SD" if self.max_divergence == 0 else f"{self.divergence} <= {self.max_divergence:g}"
        md = (self.rule, self.drafting) == ("mentored", "sampled")
        floor = f", p_min {self.draft_p_min:g}" if self.draft_p_min else ""
        rule = "" if md else f", {self.rule} ({self.drafting} drafts{floor})"
        return f"{self.drafter} -> {self.target}, T={self.temperature:g}, {budget}, gamma {self.gamma}{rule}"

    @property
    def interval(self) -> str:
        return (f"{self.predicted_speedup:.2f}x [{self.predicted_speedup_lo:.2f}, "
                f"{self.predicted_speedup_hi:.2f}]")

    @property
    def degenerate(self) -> str:
        """What the verdict adds when the point's budget lets the drafter's own distribution
        through at :data:`DEGENERATE_SHARE` of its positions or more (``""`` otherwise).

        >>> Recommendation("int8", "t", 1.0, "tv", 1.0, 8, 1.5, 1.4, 1.6, True, True, 1.0, 1.0,
        ...                drafter_share=1.0).degenerate
        "; its budget is at least D_f(p || q) at 100% of positions: it emits the drafter's own distribution there (the ranking's row 'int8 alone' prices decoding with the drafter alone)"
        """
        share = self.drafter_share
        if self.alone or share is None or not share >= DEGENERATE_SHARE:
            return ""
        return (f"; its budget is at least D_f(p || q) at {share:.0%} of positions: it emits the drafter's own "
                f"distribution there (the ranking's row '{self.drafter} alone' prices decoding with the drafter alone)")

    def verdict(self) -> str:
        """One line, one of three answers: a drafter is reliably faster (the interval's low end
        above 1: the recommendation), none is (the interval holds 1), or plain decoding is
        reliably fastest (the best point's interval below 1).

        >>> r = Recommendation("ngram:3", "t", 0.7, "kl", 0.2, 4, 0.86, 0.8, 0.92, False, True, 1.0, 1.01)
        >>> r.verdict()
        'plain decoding is reliably fastest here; the best speculative point is ngram:3 -> t, T=0.7, kl <= 0.2, gamma 4 at 0.86x [0.80, 0.92]'
        >>> Recommendation("ngram:3", "t", 0.7, "none", 0.0, 3, 0.97, 0.85, 1.13, False, True, 1.0, 1.0).verdict()
        'no drafter is reliably faster here; the best speculative point is ngram:3 -> t, T=0.7, SD, gamma 3 at 0.97x [0.85, 1.13]'

        Without an interval (no bootstrap) nothing is called faster, and the verdict says why:

        >>> nan = float("nan")
        >>> Recommendation("int8", "t", 1.0, "kl", 0.1, 5, 1.43, nan, nan, False, True, 1.0, 1.01).verdict()
        'no interval, so no point is called faster than plain decoding (ranking.resamples: 0 computes none); the best speculative point is int8 -> t, T=1, kl <= 0.1, gamma 5 at 1.43x'
        """
        quality = ("" if self.quality_ok else " (no point met the quality tolerance)") + self.degenerate
        if not self.beats_plain_decoding and not math.isfinite(self.predicted_speedup_lo):
            return (f"no interval, so no point is called faster than plain decoding (ranking.resamples: 0 computes "
                    f"none); the best speculative point is {self.point} at {self.predicted_speedup:.2f}x{quality}")
        if not self.beats_plain_decoding:
            answer = "plain decoding is reliably fastest" if self.predicted_speedup_hi < 1 else "no drafter is reliably faster"
            return f"{answer} here; the best speculative point is {self.point} at {self.interval}{quality}"
        return f"recommended: {self.point}: predicted speedup {self.interval} over plain decoding{quality}"


def beats_plain_decoding(row: dict) -> bool:
    """``predicted_speedup_lo > 1`` (a NaN bound, e.g. no bootstrap, never counts as faster)."""
    lo = csv_float(row.get("predicted_speedup_lo"))
    return math.isfinite(lo) and lo > 1.0


def _order(row: dict):
    neg = lambda key: -csv_float(row.get(key)) if math.isfinite(csv_float(row.get(key))) else math.inf  # noqa: E731
    return neg("predicted_speedup"), neg("predicted_speedup_lo"), int(float(row["gamma"])), csv_float(row.get("max_divergence"))


def _not_rows(value):
    raise TypeError(f"rows must be a list of ranking rows (dicts, e.g. load_ranking(folder)['rows']), got "
                    f"{type(value).__name__} {value!r}")


def recommend(rows: list[dict]) -> Recommendation:
    """Apply the module's rule to ranking rows (with ``quality_ok`` set, e.g. by ``rank_rows``).

    Parameters
    ----------
    rows : list of dict
        Ranking rows with the fields of :data:`FIELDS` (but ``beats_plain_decoding``), plus
        ``quality_ok``, ``nll_target`` and ``nll_mentored``.

    Returns
    -------
    Recommendation
    """
    if isinstance(rows, (str, bytes, os.PathLike, Mapping)) or not isinstance(rows, Iterable):
        _not_rows(rows)
    rows = list(rows)  # any iterable of rows, read once
    for row in rows:
        if not isinstance(row, Mapping):
            _not_rows(row)
    if not rows:
        raise ValueError("rows must hold at least one ranking row, got none")
    return _recommendation(rows)


def _recommendation(rows: list[dict], prefer=None) -> Recommendation:
    eligible = [r for r in rows if csv_bool(r.get("quality_ok"))]
    pool = eligible or list(rows)
    winners = [r for r in pool if beats_plain_decoding(r)]
    best = min(winners or pool, key=_order)
    best = best if prefer is None else prefer(best, winners or pool)
    return Recommendation(
        drafter=str(best["drafter"]), target=str(best["target"]), temperature=csv_float(best.get("temperature")),
        divergence=str(best["divergence"]), max_divergence=csv_float(best.get("max_divergence")),
        gamma=int(float(best["gamma"])), predicted_speedup=csv_float(best.get("predicted_speedup")),
        predicted_speedup_lo=csv_float(best.get("predicted_speedup_lo")),
        predicted_speedup_hi=csv_float(best.get("predicted_speedup_hi")), beats_plain_decoding=bool(winners),
        quality_ok=bool(eligible), nll_target=csv_float(best.get("nll_target")),
        nll_mentored=csv_float(best.get("nll_mentored")), rule=str(best.get("rule", "mentored")),
        drafting=str(best.get("drafting", "sampled")), threshold_acc=_number(best.get("threshold_acc")),
        threshold_single=_number(best.get("threshold_single")), draft_p_min=row_draft_p_min(best),
        drafter_share=_number(best.get("drafter_share")))


def plain_wins_from(speedups: Mapping) -> int | None:
    """The smallest batch size at and above which plain decoding wins, from the best speculative
    speedup per batch size (``{batch_size: speedup}``, e.g. each recommendation's predicted one):
    the first listed size from which on none exceeds 1. None: speculation is faster at the
    largest size listed (no crossover within the list).

    >>> plain_wins_from({1: 1.3, 4: 0.9, 8: 0.7})
    4
    >>> plain_wins_from({1: 1.3, 4: 1.1}) is None
    True
    """
    cross = None
    for b in sorted(speedups, key=int, reverse=True):
        if speedups[b] > 1.0:
            break
        cross = b
    return cross


def batch_lines(by_batch: Mapping) -> list[str]:
    """One line per batch size: its recommendation's verdict, and the crossover (:func:`plain_wins_from`)."""
    lines = [f"B={b}: {by_batch[b].verdict()}" for b in sorted(by_batch)]
    cross = plain_wins_from({b: r.predicted_speedup for b, r in by_batch.items()})
    listed = ", ".join(str(b) for b in sorted(by_batch))
    lines.append(f"plain decoding is predicted to win from batch size {cross} on (of {listed})" if cross is not None
                 else f"speculation is predicted to pay at every listed batch size ({listed})")
    return lines


def _number(value) -> float | None:
    """A finite number of a row, else None (a rule without the column's parameter holds NaN)."""
    x = csv_float(value)
    return x if math.isfinite(x) else None


def md_row(row: dict) -> bool:
    """Whether the row is MD on sampled drafts (a row without ``rule``, from a ranking before
    rules were ranked, is one)."""
    return (row.get("rule", "mentored"), row.get("drafting", "sampled")) == ("mentored", "sampled")


def rule_label(row: dict) -> str:
    """What a point's name adds for its rule: ``""`` for MD on sampled drafts, else
    ``" threshold:greedy"`` (budget-0 points of several rules share drafter, budget and gamma),
    ``" match:greedy:p0.5"`` with a draft floor; ``""`` for the drafter decoding alone (its name
    says it: :func:`mdboost.tracking.runs.point_name` at gamma 0)."""
    if row.get("rule") == ALONE:
        return ""
    floor = row_draft_p_min(row)
    return "" if md_row(row) else f" {row['rule']}:{row['drafting']}" + (f":p{floor:g}" if floor else "")


DRAFTER_KINDS = {
    "vllm": ("hf", "ngram", "early_exit"),
    "sglang": ("hf", "early_exit"),
    "llamacpp": ("hf", "ngram", "early_exit"),
}
"""The drafter kinds (:func:`mdboost.models.pool.parse_drafter`) each serving engine can draft with:
a model it loads (``hf``), its own prompt lookup (vLLM's ``ngram``, llama.cpp's ``ngram-simple``:
SGLang's ``NGRAM`` drafts from a corpus of all requests, another drafter) and an early exit written
out as a standalone model (``mdboost export --write-drafter``). mdboost's engine and ``hf`` run
every kind; ``tuned`` (a fitted translator) and ``int8`` (torch's dynamic quantization) run there
only. Whether an ``hf`` drafter loads in the engine (a GGUF file in vLLM) is the export's check."""


def runs_on(row: dict, engine: str) -> bool:
    """Whether ``engine`` runs the row: its rule (the engine's name in the row's space-separated
    ``engines``; a row without the column, from a ranking before rules were ranked, is MD on
    sampled drafts: mdboost and hf) with its drafter (:data:`DRAFTER_KINDS`)."""
    engines = row.get("engines")
    if engine not in (str(engines).split() if engines is not None else ("mdboost", "hf")):
        return False
    return engine not in DRAFTER_KINDS or parse_drafter(str(row["drafter"]))[0] in DRAFTER_KINDS[engine]


def recommend_engines(rows: list[dict]) -> dict[str, dict]:
    """Every engine's recommendation (:data:`mdboost.md.rules.ENGINES`, ``summary.json``'s
    ``recommendations``): the module's rule over the rows it can run (:func:`runs_on`).

    Returns
    -------
    dict
        ``engine ->`` :func:`engine_entry`: ``{"recommendation": ..., "reason": ...}``, the
        recommendation ``None`` (with the reason) where the engine runs none of the rows.
    """
    rows = list(rows)
    # deferred: mdboost.md imports torch (a second); reading a ranking (mdboost export) needs none
    from mdboost.md.rules import ENGINES

    return {engine: engine_entry(rows, engine) for engine in ENGINES}


NATIVE = {"mdboost": "mentored", "hf": "mentored", "vllm": "rejection", "sglang": "threshold", "llamacpp": "match"}
"""Each engine's own rule: among rows of the same point with the same law (lossless rules on greedy
drafts), the recommendation names it."""


def _native(engine: str):
    """Among the candidates, the row of the engine's own rule at the best row's point (drafter,
    target, temperature, divergence, budget, gamma) and speedup (to 1e-9), else the best row."""
    def point(r):
        return (str(r["drafter"]), str(r["target"]), csv_float(r.get("temperature")), str(r["divergence"]),
                csv_float(r.get("max_divergence")), int(float(r["gamma"])),
                round(csv_float(r.get("predicted_speedup")), 9))

    def prefer(best: dict, candidates: list[dict]) -> dict:
        same = [r for r in candidates if point(r) == point(best) and r.get("rule") == NATIVE[engine]]
        return same[0] if same else best
    return prefer


def engine_entry(rows: list[dict], engine: str) -> dict:
    """``{"recommendation": Recommendation dict with its verdict, "reason": None}`` for the rows
    ``engine`` runs, or ``{"recommendation": None, "reason": why}`` when it runs none. Where rows
    of several rules tie at the recommended point, the engine's own rule (:data:`NATIVE`) is named."""
    mine = [r for r in rows if runs_on(r, engine)]
    if not mine:
        ranked = sorted({f"{r.get('rule', 'mentored')} ({r.get('drafting', 'sampled')} drafts)" for r in rows})
        kinds = ", ".join(DRAFTER_KINDS.get(engine, ()))
        return {"recommendation": None,
                "reason": f"{engine} runs none of the ranked rows: its rules with its drafter kinds ({kinds}); "
                          f"ranked rules: {', '.join(ranked)} (md.rules, docs/ranking.md \"Rules and engines\")"}
    rec = _recommendation(mine, prefer=_native(engine))
    return {"recommendation": {**rec.to_dict(), "verdict": rec.verdict()}, "reason": None}
