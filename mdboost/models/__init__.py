"""Hugging Face model pool, derived drafters and the offline default model.

- :mod:`~mdboost.models.loading` -- load by alias (``smollm2-135m``, ``tiny``), hub name, local path or GGUF.
- :mod:`~mdboost.models.convert` -- the bundled SmolLM2 GGUF, converted once to safetensors.
- :mod:`~mdboost.models.drafters` -- ``early_exit:N``, ``tuned:N`` (tuned lens), ``int8``.
- :mod:`~mdboost.models.ngram` -- ``ngram:N`` prompt-lookup drafter (one-hot drafts).
- :mod:`~mdboost.models.pool` -- ``PoolMember``, ``Pool``, ``build_pool``, vocabulary fingerprints.
- :mod:`~mdboost.models.cost` -- measured cost ratios ``c`` for the speed model.
- :mod:`~mdboost.models.tiny` -- tiny random Llama models and a tokenizer built in code.
- :mod:`~mdboost.models.write` -- ``write_drafter``: a drafter as a standalone checkpoint engines load.
"""

from mdboost._lazy import lazy_exports

_EXPORTS = {  # imported on first use: a light module here (mdboost export) does not pull in transformers
    "measure_cost_ratio": ".cost", "mdboost_home": ".home", "load_model": ".loading", "resolve_device": ".loading",
    "NgramDrafter": ".ngram", "DEFAULT_DRAFTERS": ".pool", "Pool": ".pool", "PoolMember": ".pool", "build_pool": ".pool",
    "default_drafters": ".pool", "vocab_fingerprint": ".pool", "tiny_llama": ".tiny", "tiny_tokenizer": ".tiny",
    "write_drafter": ".write",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
