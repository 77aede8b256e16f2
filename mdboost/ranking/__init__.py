"""Pair scores for the pool ranking: acceptance, speed model, boosting complementarity, quality.

Modules (paper results in their docstrings; metric definitions in ``docs/ranking.md``):

- :mod:`~mdboost.ranking.support` -- drafter/target on a common support from a top-k cache;
- :mod:`~mdboost.ranking.acceptance` -- SD ``1 - TV`` and optimal MD acceptance per budget;
- :mod:`~mdboost.ranking.speed` -- the speed model (tokens per target call, walltime speedup);
- :mod:`~mdboost.ranking.chains` -- each draft's acceptance on a given text (the process's chains);
- :mod:`~mdboost.ranking.process` -- the engine's draft-start process (exact DP over sequences);
- :mod:`~mdboost.ranking.layout` -- cached rows grouped by sequence (what the process runs on);
- :mod:`~mdboost.ranking.diagnostics` -- ``eps_pq``, ``rho_pq`` and ``k = sqrt((1+a)/(1-b))``;
- :mod:`~mdboost.ranking.quality` -- teacher-forced NLL of q, p, mentored and boosted;
- :mod:`~mdboost.ranking.boosting` -- cache-backed pool members and the pair boosting runs;
- :mod:`~mdboost.ranking.rank` -- one pair's scores (:func:`score_pair`) and the ranking rule;
- :mod:`~mdboost.ranking.scores` -- what ``score_pair`` returns, and its CSV rows;
- :mod:`~mdboost.ranking.rows` -- members' rows and pairs read from an opened pool cache;
- :mod:`~mdboost.ranking.report` -- ``ranking.csv``, HTML and terminal tables.

The cache folders the rows come from are built and opened by :mod:`mdboost.cache`.
"""

from mdboost._lazy import lazy_exports

_EXPORTS = {  # imported on first use: reading a ranking (mdboost export) loads no engine or model
    "conditional_acceptance": ".chains", "sequence_layout": ".layout", "run_process": ".process", "PairRows": ".pair",
    "PairSide": ".pair", "ScoreSettings": ".rank", "rank_rows": ".rank", "score_pair": ".rank", "PairScore": ".scores",
    "PointScore": ".scores", "score_rows": ".scores", "SpeedProfile": ".speed", "best_gamma": ".speed",
    "expected_solved": ".speed", "expected_tokens": ".speed", "walltime_speedup": ".speed",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
