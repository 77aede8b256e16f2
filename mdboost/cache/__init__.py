"""Top-k compressed logit cache over a model pool and a dataset.

Build one folder with :func:`build_cache` (what it stores: :class:`StoreSettings`; how its
token sequences are made: :class:`SequenceSettings`; how it runs: :class:`RunOptions`), read
it with :meth:`LogitCache.open`. A pool's
folders (one per member, keyed by content: :mod:`mdboost.cache.keys`) are opened, and built
where missing, by :func:`open_or_build_cache` (:mod:`mdboost.cache.pool_cache`). Storage:
safetensors shards plus a JSON manifest; resumable, atomic, checksummed.
"""

from mdboost._lazy import lazy_exports

_EXPORTS = {  # imported on first use: a light module here (keys, options: a config's checks) loads no torch
    "build_cache": ".build", "sample_sequences": ".build", "StoreSettings": ".settings", "SequenceSettings": ".settings",
    "RunOptions": ".settings", "LogitCache": ".reader", "CacheCorruptionError": ".manifest", "FolderSettings": ".keys",
    "PoolCacheSpec": ".keys", "fingerprint": ".keys", "BuildInfo": ".pool_cache", "PoolCache": ".pool_cache",
    "open_or_build_cache": ".pool_cache",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
