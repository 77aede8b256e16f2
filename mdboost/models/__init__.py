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

from .cost import measure_cost_ratio
from .home import mdboost_home
from .loading import load_model, resolve_device
from .ngram import NgramDrafter
from .pool import DEFAULT_DRAFTERS, Pool, PoolMember, build_pool, default_drafters, vocab_fingerprint
from .tiny import tiny_llama, tiny_tokenizer
from .write import write_drafter

__all__ = [
    "DEFAULT_DRAFTERS", "NgramDrafter", "Pool", "PoolMember", "build_pool", "default_drafters", "load_model",
    "mdboost_home", "measure_cost_ratio", "resolve_device", "tiny_llama", "tiny_tokenizer", "vocab_fingerprint",
    "write_drafter",
]
