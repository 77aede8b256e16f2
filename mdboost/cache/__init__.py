"""Top-k compressed logit cache over a model pool and a dataset.

Build one folder with :func:`build_cache` (what it stores: :class:`StoreSettings`; how its
token sequences are made: :class:`SequenceSettings`; how it runs: :class:`RunOptions`), read
it with :meth:`LogitCache.open`. A pool's
folders (one per member, keyed by content: :mod:`mdboost.cache.keys`) are opened, and built
where missing, by :func:`open_or_build_cache` (:mod:`mdboost.cache.pool_cache`). Storage:
safetensors shards plus a JSON manifest; resumable, atomic, checksummed.
"""

from .build import build_cache, sample_sequences
from .keys import FolderSettings, PoolCacheSpec, fingerprint
from .manifest import CacheCorruptionError
from .pool_cache import BuildInfo, PoolCache, open_or_build_cache
from .reader import LogitCache
from .settings import RunOptions, SequenceSettings, StoreSettings

__all__ = ["build_cache", "sample_sequences", "StoreSettings", "SequenceSettings", "RunOptions", "LogitCache", "CacheCorruptionError", "FolderSettings",
           "PoolCacheSpec", "fingerprint", "BuildInfo", "PoolCache", "open_or_build_cache"]
