"""What one :func:`mdboost.cache.build.build_cache` call builds, as small frozen, validated objects.

- :class:`StoreSettings`: what each member shard stores (top-``k``, storage dtype, full logits,
  temperatures, sequences per shard, ``ngram`` lookahead);
- :class:`SequenceSettings`: how the token sequences are made (teacher-forced reference text
  or target-sampled continuations, prompt formatting, truncation, sampling);
- :class:`RunOptions`: how the build runs (joblib backend and jobs, progress bar, overwrite).

The first two are the build's configuration: their values go into the folder's manifest,
and a folder is resumed only when they match (:func:`mdboost.cache.build.build_cache`).
:class:`RunOptions` never changes what is stored.

Every field is checked when the object is built; an error names the field and its value.
Change a field with :func:`dataclasses.replace`, which validates again.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .options import DTYPE_NAMES, SOURCES  # torch-free (a config checks them before torch loads)

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def _whole(name: str, value) -> int:
    """``value`` as an int when it is a positive whole number (``16`` or ``16.0``), else ValueError."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or int(value) != value or value < 1):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _flag(name: str, value) -> bool:
    """``value`` as a bool when it is one (or 0 / 1, a numpy bool); a string such as ``"false"`` is a ValueError."""
    if isinstance(value, (str, bytes)) or value not in (0, 1):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _integer(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True)
class StoreSettings:
    """What each member shard of a cache folder stores.

    Parameters
    ----------
    k : int, default=32
        Top-k entries kept per position and member.
    dtype : {"float16", "bfloat16", "float32"}, default="float16"
        Storage dtype of the top-k logits (logsumexp, true logit and logit sum stay float32).
        float16 keeps 11 significant bits: a logit of magnitude ``|l|`` is off by at most
        ``|l| * 2**-11`` (0.016 at ``|l| = 32``), a relative probability error below 1.6%.
    keep_full : bool, default=False
        Also keep full-vocabulary logits (fp16): exact NLL of mixtures, for small samples.
    temperatures : sequence of float, default=(1.0,)
        Temperatures ``> 0`` whose exact full-vocabulary ``logsumexp(logits / T)`` is stored;
        kept sorted, without repeats, always with ``1.0``.
    shard_size : int, default=16
        Sequences per shard.
    ngram_lookahead : int, default=4
        Tokens kept of each ``ngram`` proposal (``-1`` padded).

    Examples
    --------
    >>> StoreSettings(k=16, temperatures=(0.5, 1)).temperatures
    (0.5, 1.0)
    >>> StoreSettings(k=0)
    Traceback (most recent call last):
    ...
    ValueError: k must be a positive integer, got 0
    """

    k: int = 32
    dtype: str = "float16"
    keep_full: bool = False
    temperatures: tuple[float, ...] = (1.0,)
    shard_size: int = 16
    ngram_lookahead: int = 4

    def __post_init__(self):
        object.__setattr__(self, "k", _whole("k", self.k))
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        object.__setattr__(self, "keep_full", _flag("keep_full", self.keep_full))
        if isinstance(self.temperatures, (str, bytes)) or not isinstance(self.temperatures, Iterable):
            one = isinstance(self.temperatures, numbers.Real)
            raise ValueError(f"temperatures must be a sequence of numbers > 0, got {self.temperatures!r}"
                             + (f" (for one temperature: ({self.temperatures!r},))" if one else ""))
        for t in self.temperatures:
            if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 < t < math.inf:
                raise ValueError(f"temperatures must be finite and > 0 (logits are cached at temperature 1), got {t!r}")
        temperatures = sorted({1.0, *map(float, self.temperatures)})
        object.__setattr__(self, "temperatures", tuple(temperatures))
        object.__setattr__(self, "shard_size", _whole("shard_size", self.shard_size))
        object.__setattr__(self, "ngram_lookahead", _whole("ngram_lookahead", self.ngram_lookahead))

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def manifest_entries(self) -> dict:
        """The manifest keys these settings fill (JSON values: ``temperatures`` as a list)."""
        return {"k": self.k, "dtype": self.dtype, "keep_full": self.keep_full, "temperatures": list(self.temperatures),
                "ngram_lookahead": self.ngram_lookahead, "shard_size": self.shard_size}


@dataclass(frozen=True)
class SequenceSettings:
    """How the token sequences of a cache are made from the records.

    Parameters
    ----------
    source : {"reference", "sampled"}, default="reference"
        Teacher-forced reference continuations, or continuations sampled from the target at
        ``sample_temperature`` (up to ``max_new_tokens``, seeded per record from ``seed``).
    chat_template : bool, default=False
        Format prompts with the tokenizer's chat template.
    system : str or None, default=None
        System message of the chat template.
    max_tokens : int, default=512
        Sequence budget, ``>= 2`` (prompt and continuation, :func:`mdboost.data.encode_record`).
    max_new_tokens : int, default=128
        Sampled tokens per record, ``>= 1`` (``source="sampled"`` only).
    sample_temperature : float, default=1.0
        Sampling temperature, ``>= 0`` (``0`` is greedy; ``source="sampled"`` only).
    seed : int, default=0
        Seeds each record's ``torch.Generator`` together with its id (``source="sampled"`` only).

    Examples
    --------
    >>> SequenceSettings(source="sampled", max_new_tokens=8).manifest_entries()["max_new_tokens"]
    8
    >>> SequenceSettings(source="greedy")
    Traceback (most recent call last):
    ...
    ValueError: source must be one of ('reference', 'sampled'), got 'greedy'
    """

    source: str = "reference"
    chat_template: bool = False
    system: str | None = None
    max_tokens: int = 512
    max_new_tokens: int = 128
    sample_temperature: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        object.__setattr__(self, "chat_template", _flag("chat_template", self.chat_template))
        if self.system is not None and not isinstance(self.system, str):
            raise ValueError(f"system must be a string or None, got {self.system!r}")
        _integer("max_tokens", self.max_tokens, 2)  # encode_record's bound: a context token and a predicted one
        _integer("max_new_tokens", self.max_new_tokens, 1)
        t = self.sample_temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 <= t < math.inf:
            raise ValueError(f"sample_temperature must be a finite number >= 0, got {t!r}")
        _integer("seed", self.seed, 0)

    @property
    def sampled(self) -> bool:
        return self.source == "sampled"

    def manifest_entries(self) -> dict:
        """The manifest keys these settings fill (the sampling ones only for sampled sequences)."""
        entries = {"source": self.source, "chat_template": self.chat_template, "system": self.system,
                   "max_tokens": self.max_tokens}
        if self.sampled:
            entries.update(max_new_tokens=self.max_new_tokens, sample_temperature=self.sample_temperature,
                           seed=self.seed)
        return entries


@dataclass(frozen=True)
class RunOptions:
    """How a cache build runs; none of it changes what is stored.

    Parameters
    ----------
    backend : str, default="loky"
        joblib backend (``"loky"``, ``"threading"``, ``"dask"``, ...). Process-based backends
        rebuild members from ``pool.recipe`` in the workers.
    n_jobs : int, default=1
        joblib jobs, ``>= 1``; with ``1`` everything runs in this process.
    progress : bool, default=True
        Show a tqdm bar (``TQDM_DISABLE=1`` silences it).
    overwrite : bool, default=False
        Replace a folder that holds a cache built with another configuration (else ValueError).
    """

    backend: str = "loky"
    n_jobs: int = 1
    progress: bool = True
    overwrite: bool = False

    def __post_init__(self):
        if not isinstance(self.backend, str) or not self.backend:
            raise ValueError(f"backend must be a joblib backend name, got {self.backend!r}")
        _integer("n_jobs", self.n_jobs, 1)

    @property
    def in_process(self) -> bool:
        """Jobs run in this process (one job, or a thread-based backend)."""
        return self.n_jobs == 1 or self.backend in ("threading", "sequential")
