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

from mdboost.ranking.chains import conditional_acceptance
from mdboost.ranking.layout import sequence_layout
from mdboost.ranking.process import run_process
from mdboost.ranking.pair import PairRows, PairSide
from mdboost.ranking.rank import ScoreSettings, rank_rows, score_pair
from mdboost.ranking.scores import PairScore, PointScore, score_rows
from mdboost.ranking.speed import (
    SpeedProfile,
    best_gamma,
    expected_solved,
    expected_tokens,
    walltime_speedup,
)

__all__ = ["PairRows", "PairScore", "PairSide", "PointScore", "ScoreSettings", "SpeedProfile",
           "conditional_acceptance", "run_process", "sequence_layout", "best_gamma", "expected_solved",
           "expected_tokens", "rank_rows", "score_pair", "score_rows", "walltime_speedup"]
