"""Top-k compressed logit cache over a model pool and a dataset.

Build with :func:`build_cache`, read with :meth:`LogitCache.open`. Storage: safetensors
shards plus a JSON manifest; resumable, atomic, checksummed.
"""

from .build import build_cache, sample_sequences
from .manifest import CacheCorruptionError
from .reader import LogitCache, PairProbs

__all__ = ["build_cache", "sample_sequences", "LogitCache", "PairProbs", "CacheCorruptionError"]
