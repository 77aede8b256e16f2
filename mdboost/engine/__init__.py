"""Generation engine: AR, speculative and mentored decoding with KV caches (Hugging Face models).

- :func:`generate` -- the loop (draft, one target forward, ``verify``, roll back the caches);
- :class:`GenerationOutput`, :class:`GenerationStats` -- tokens and vLLM-style counters;
- :class:`ModelDrafter`, :class:`SharedLayersDrafter`, :class:`NgramAdapter` -- drafter
  adapters (private KV cache / drafting on the target's own KV cache / prompt lookup);
- :class:`CachedLM` -- a model plus a ``DynamicCache`` with per-row rollback.
"""

from mdboost.engine.drafting import ModelDrafter, NgramAdapter, SharedLayersDrafter
from mdboost.engine.generate import GenerationOutput, generate
from mdboost.engine.kv import CachedLM
from mdboost.engine.stats import GenerationStats

__all__ = [
    "CachedLM", "GenerationOutput", "GenerationStats", "ModelDrafter", "NgramAdapter",
    "SharedLayersDrafter", "generate",
]
