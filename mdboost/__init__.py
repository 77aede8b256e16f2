"""mdboost: pick drafter/target pairs for mentored decoding and prove the picks with real runs.

Layout (the folder structure is the architecture):

- :mod:`mdboost.md` -- the mentored decoding core: f-divergences, the breakpoint structure
  over the curve C(p, q), exact and bound-based primal/dual solvers, batched verification.
- :mod:`mdboost.boosting` -- multiclass self-normalized boosting (scikit-learn estimator).
- :mod:`mdboost.models` -- Hugging Face model pool, derived drafters, offline default model.
- :mod:`mdboost.data` -- prompt/text datasets (bundled offline default: HumanEval).
- :mod:`mdboost.cache` -- top-k compressed logit cache over a pool and a dataset.
- :mod:`mdboost.engine` -- AR / SD / MD generation with KV caches.
- :mod:`mdboost.ranking` -- pair scores: acceptance, speed model, boosting complementarity, plots.
- :mod:`mdboost.validation` -- real runs of ranked pairs against the prediction, HumanEval.
- :mod:`mdboost.tracking` -- the MLflow store and ``mdboost ui`` (pipelines and CLI only).

Public names are imported lazily so that ``import mdboost`` stays cheap.
"""

from mdboost._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    # mentored decoding core
    "divergences": "mdboost.md.divergences",
    "Breakpoints": "mdboost.md.breakpoints",
    "solve": "mdboost.md.solve",
    "MDSolution": "mdboost.md.solve",
    "mentored_distribution": "mdboost.md.solve",
    "acceptance_probability": "mdboost.md.solve",
    "logits_to_probs": "mdboost.md.probs",
    "verify": "mdboost.md.verify",
    "PLACEHOLDER_TOKEN_ID": "mdboost.md.verify",
    "VerifyResult": "mdboost.md.verify",
    # generation
    "generate": "mdboost.engine.generate",
    "GenerationOutput": "mdboost.engine.generate",
    "GenerationSettings": "mdboost.engine.settings",
    "GenerationStats": "mdboost.engine.stats",
    # models, data, cache
    "build_pool": "mdboost.models",
    "Pool": "mdboost.models",
    "PoolMember": "mdboost.models",
    "load_model": "mdboost.models",
    "NgramDrafter": "mdboost.models",
    "load_texts": "mdboost.data",
    "build_cache": "mdboost.cache",
    "LogitCache": "mdboost.cache",
    # learning
    "SelfNormalizedBoostClassifier": "mdboost.boosting.estimator",
    "FixedScorer": "mdboost.boosting.scorers",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
