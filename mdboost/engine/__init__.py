"""Generation engine: AR, speculative and mentored decoding with KV caches (transformers models, or llama.cpp).

- :func:`generate` -- the loop (draft, one target forward, ``verify``, roll back the caches);
- :class:`GenerationSettings` -- what one call does (sampling, MD budget, draft length, stop);
- :class:`GenerationOutput`, :class:`GenerationStats` -- tokens and vLLM-style counters;
- :class:`Drafter` / :class:`DraftSession` -- the drafter interface (``start`` makes the
  per-generation session: ``propose`` / ``commit`` / ``update``); :class:`ModelDrafter` (a
  causal LM; early-exit drafters draft on the target's own KV cache) and :class:`NgramAdapter`
  (prompt lookup); :func:`as_drafter` converts a pool member;
- :class:`FixedDraftLength`, :class:`AdaptiveDraftLength`, :class:`ConfidenceStop` -- the
  schedules a drafter owns;
- :class:`CachedLM` -- a model plus a ``DynamicCache`` with per-row rollback; :class:`LMBackend`
  -- a model that runs its own forward passes (:class:`mdboost.engine.llamacpp.LlamaCppModel`:
  llama.cpp, optional).
"""

from mdboost.engine.drafting import DraftSession, Drafter, ModelDrafter, NgramAdapter, as_drafter
from mdboost.engine.generate import GenerationOutput, generate
from mdboost.engine.kv import CachedLM, LMBackend
from mdboost.engine.schedule import AdaptiveDraftLength, ConfidenceStop, DraftSchedule, FixedDraftLength
from mdboost.engine.settings import GenerationSettings
from mdboost.engine.stats import GenerationStats

__all__ = [
    "AdaptiveDraftLength", "CachedLM", "LMBackend", "ConfidenceStop", "DraftSchedule", "DraftSession", "Drafter",
    "FixedDraftLength", "GenerationOutput", "GenerationSettings", "GenerationStats", "ModelDrafter",
    "NgramAdapter", "as_drafter", "generate",
]
