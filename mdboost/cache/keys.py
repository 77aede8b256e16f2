"""Content keys of a pool's cache folders: which folder holds which member, built on what.

Each pool member is cached in its own folder ``<dir>/<slug>-<fingerprint>``
(:meth:`PoolCacheSpec.member_dir`). The fingerprint covers the text source (records,
truncation, seed; a local data file's content, :meth:`PoolCacheSpec.text_content`), the
folder's stored-value settings (:class:`FolderSettings`: ``k``, ``dtype``, ``full_logits``,
``source``, ``max_new_tokens``, ``shard_size``), the target spec, the member spec, the temperature, for kinds whose rows are computed differently since
caches were first keyed, that revision (:data:`mdboost.models.pool.ROW_REVISIONS`), and the
content of the weights where their name does not fix it (:meth:`PoolCacheSpec.weights`: a
local folder or file, a hub commit, a changed ``smollm2-135m`` source; the target's for every
member, a model drafter's own for its folders). So an unchanged spec opens every folder
without loading a model; adding a drafter builds only that drafter's folder; changing ``k`` or
the text rebuilds all; overwriting a local model folder with other weights rebuilds exactly
the folders built on it, and with them their measured costs and speed profile (which live in
the folders' manifests); build options (jobs, backend, cost measurement) never move a folder.

*Acceptance* folders (``acceptance=True``) hold the same prompts with continuations sampled
from the target (``source="sampled"``, ``acceptance_max_new_tokens`` tokens, seeded by the text
source's ``seed``, at ``temperature``). The continuations are sampled once into a shared token
file (:meth:`PoolCacheSpec.continuations_path`, keyed by text, target, temperature, token
count, :data:`SAMPLER` and the target's content id); a sampled folder's fingerprint includes
that key.

The keys are a compatibility contract: the same spec must give byte-identical folder names
across versions (users' caches are found by them), so :func:`fingerprint` hashes the same JSON
parts in the same order as the builds that made them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from mdboost._io import sha256_file
from mdboost.cache.options import joblib_backends
from mdboost.data import TextSource

# how continuations are sampled (part of their key): change it when the sampling code changes
SAMPLER = "build_sequences/v1: per-record torch.Generator seeded by sha256(seed:id), KV-cached multinomial"
ACCEPTANCE_SOURCES = ("reference", "sampled")
ENGINES = ("mdboost", "llamacpp")  # whose forward passes a speed file times (PoolCacheSpec.engine)


def fingerprint(*parts) -> str:
    """A short, stable hash (16 hex digits) of JSON-able parts; dataclasses go through
    :func:`dataclasses.asdict` (tuples serialize as lists).

    >>> fingerprint({"k": 16}, "tiny") == fingerprint({"k": 16}, "tiny")
    True
    >>> len(fingerprint(1.0))
    16
    """
    plain = [dataclasses.asdict(p) if dataclasses.is_dataclass(p) else p for p in parts]
    blob = json.dumps(plain, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class FolderSettings:
    """The build settings that change a folder's stored values (all part of its key).

    ``source``: teacher-forced ``"reference"`` text or ``"sampled"`` target continuations of
    ``max_new_tokens`` tokens (ignored for reference folders, but keyed).
    """

    k: int = 128
    dtype: str = "float16"
    full_logits: bool = False
    source: str = "reference"
    max_new_tokens: int = 128
    shard_size: int = 8

    @property
    def sampled(self) -> bool:
        return self.source == "sampled"


@dataclass(frozen=True)
class PoolCacheSpec:
    """Where a pool's member caches live and what they are built on.

    Parameters
    ----------
    dir : str
        Parent folder of all member folders and shared continuation files.
    text : TextSource
        The records cached (:class:`mdboost.data.TextSource`).
    target : str
        The pool target's spec; ``drafters``: the drafter specs (``early_exit:12``, ...).
    temperature : float, >= 0
        Sampling temperature of continuations; its ``logsumexp`` is stored in every folder
        (``0``: greedy continuations; the folders then store temperature 1's only).
    folders : FolderSettings
        The main folders' settings.
    acceptance_source : {"reference", "sampled"}
        ``"sampled"``: every member also gets an acceptance folder of target-sampled
        continuations with ``acceptance_max_new_tokens`` new tokens.
    device, home : where models load (``mdboost.models.pool.build_pool``); not keyed.
    n_jobs, backend : the build's joblib jobs; not keyed.
    cost_context, cost_repeats : the cost-ratio and speed-profile measurements
        (:mod:`mdboost.models.cost`); not keyed.
    gamma_max : int
        The speed profile's ``v(g)`` table covers ``g <= max(gamma_max, 8)``; not keyed.
    batch_sizes : tuple of int
        The batch sizes whose costs are measured (rows per engine step); not keyed (each has its
        own entries in the speed file, :mod:`mdboost.cache.speed`).
    engine : {"mdboost", "llamacpp"}
        Whose forward passes the costs time: mdboost's engine on torch, or the same loop with
        llama.cpp doing the forward passes (:class:`mdboost.engine.llamacpp.LlamaCppPool`; batch
        size 1). Keys the speed file only (:func:`mdboost.cache.speed.speed_path`): the logit
        caches are the pool's, whichever engine runs it.
    """

    dir: str
    text: TextSource
    target: str
    drafters: tuple[str, ...]
    temperature: float = 1.0
    folders: FolderSettings = field(default_factory=FolderSettings)
    acceptance_source: str = "reference"
    acceptance_max_new_tokens: int = 64
    device: str | None = None
    home: str | None = None
    n_jobs: int = 1
    backend: str = "loky"
    cost_context: int = 128
    cost_repeats: int = 21
    gamma_max: int = 8
    batch_sizes: tuple[int, ...] = (1,)
    engine: str = "mdboost"

    def __post_init__(self):
        object.__setattr__(self, "batch_sizes", tuple(self.batch_sizes))
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.engine == "llamacpp" and self.batch_sizes != (1,):
            raise ValueError(f"batch_sizes must be (1,) with engine 'llamacpp' (llama-cpp-python's Llama runs one "
                             f"sequence), got {self.batch_sizes!r}")
        if not self.batch_sizes or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1
                                           for b in self.batch_sizes):
            raise ValueError(f"batch_sizes must be positive integers, got {self.batch_sizes!r}")
        if self.acceptance_source not in ACCEPTANCE_SOURCES:
            raise ValueError(f"acceptance_source must be one of {ACCEPTANCE_SOURCES}, got {self.acceptance_source!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy continuations), got {self.temperature!r}")
        if self.backend not in joblib_backends():  # checked even when n_jobs = 1 never uses it
            raise ValueError(f"backend must be one of {joblib_backends()}, got {self.backend!r}")
        if isinstance(self.drafters, str):  # tuple() would key and build its letters as drafters
            raise TypeError(f"drafters must be a sequence of drafter specs, got str {self.drafters!r} "
                            f"(for one drafter: ({self.drafters!r},))")
        object.__setattr__(self, "drafters", tuple(self.drafters))
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "_keys", None)  # not a field: the keys of a keyed() copy

    def keyed(self) -> PoolCacheSpec:
        """This spec, computing each key (folder, continuations, content id) once and then answering
        it unchanged: a run's view of its folders, keyed once (a content id hashes a model's or a
        data file's bytes). A plain spec keys on every call, so it sees files changed since."""
        if self._keys is not None:
            return self
        spec = dataclasses.replace(self)
        object.__setattr__(spec, "_keys", {})
        return spec

    def _once(self, key: tuple, compute):
        """``compute()``, or for a :meth:`keyed` spec its value of the first call with ``key``."""
        if self._keys is None:
            return compute()
        if key not in self._keys:
            self._keys[key] = compute()
        return self._keys[key]

    @property
    def names(self) -> list[str]:
        """The target, then the drafters."""
        return [self.target, *self.drafters]

    @property
    def sampled_acceptance(self) -> bool:
        return self.acceptance_source == "sampled"

    def settings(self, acceptance: bool = False) -> FolderSettings:
        """The main folders' settings, or those of the acceptance folders."""
        if not acceptance:
            return self.folders
        return dataclasses.replace(self.folders, source="sampled", max_new_tokens=self.acceptance_max_new_tokens)

    def folder_sets(self) -> list[bool]:
        """The folder sets in use, as their ``acceptance`` flag: main, then (if sampled) acceptance."""
        return [False, True] if self.sampled_acceptance else [False]

    def weights(self, member: str) -> list:
        """The content ids (:func:`mdboost.models.identity.weights_id`) a member's folder key adds:
        the target's (every member is built on it) and, for a model drafter, its own; ids that
        are None (``tiny``, the released ``smollm2-135m``, a hub model not in the local cache)
        add nothing, so those folders keep the names they always had."""
        # deferred: mdboost.models imports transformers (seconds); a cache opens without it
        from mdboost.models.specs import parse_drafter

        ids = [["target_weights", self._weights_id(self.target)]]
        if member != self.target and parse_drafter(member)[0] == "hf":
            ids.append(["weights", self._weights_id(member)])
        return [pair for pair in ids if pair[1] is not None]

    def _weights_id(self, name: str) -> str | None:
        # deferred: mdboost.models imports transformers (seconds); a cache opens without it
        from mdboost.models.identity import weights_id

        return self._once(("weights_id", name), lambda: weights_id(name, self.home))

    def text_content(self) -> list:
        """The content id a local data file adds to every key built on its records
        (``["text_file", "file:<sha256>"]``): editing the file moves the folders and the shared
        continuations. The bundled HumanEval and hub datasets add nothing (their names fix
        them), so those folders keep the names they always had."""
        source = self.text.source
        path = Path(source).expanduser()
        if source == "humaneval" or not path.is_file():
            return []
        return [["text_file", self._once(("text_file",), lambda: f"file:{sha256_file(path, memo=True)}")]]

    def continuations_key(self, max_new_tokens: int) -> str:
        return self._once(("continuations", max_new_tokens), lambda: fingerprint(
            self.text, self.target, self.temperature, max_new_tokens, SAMPLER, *self.weights(self.target),
            *self.text_content()))

    def continuations_path(self, max_new_tokens: int) -> Path:
        """The token file of the target's sampled continuations shared by every member's folder.

        Keyed by the text source (records, truncation, seed; a local data file's content),
        the target, ``temperature``, ``max_new_tokens`` and :data:`SAMPLER`.
        """
        return Path(self.dir) / f"continuations-{self.continuations_key(max_new_tokens)}" / "tokens.safetensors"

    def member_dir(self, member: str, acceptance: bool = False) -> Path:
        """The cache folder of one pool member.

        ``acceptance=True``: the member's folder of target-sampled continuations; it coincides
        with the main folder when the main folders are themselves sampled with the same number
        of new tokens. A sampled folder's key includes the shared continuations' key.
        """
        return self._once(("member_dir", member, bool(acceptance)), lambda: self._member_dir(member, acceptance))

    def _member_dir(self, member: str, acceptance: bool) -> Path:
        # deferred: mdboost.models imports transformers (seconds); a cache opens without it
        from mdboost.models.pool import row_revision

        settings = self.settings(acceptance)
        parts = (self.text, settings, self.target, member, self.temperature)
        if settings.sampled:
            parts += (self.continuations_key(settings.max_new_tokens),)
        if row_revision(member) is not None:  # rows computed differently since first keyed
            parts += (row_revision(member),)
        parts += tuple(self.weights(member))  # the weights' content, where a name does not fix it
        parts += tuple(self.text_content())  # a local data file's content
        slug = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in member)
        return Path(self.dir) / f"{slug}-{fingerprint(*parts)}"

    def fingerprint(self) -> str:
        """One fingerprint over all member folders in use (for reports)."""
        dirs = [str(self.member_dir(m, acc)) for acc in self.folder_sets() for m in self.names]
        return fingerprint(*dirs)
