"""The pool's measured engine costs, kept next to its logit caches (``docs/theory.md``, "Speed model for ranking").

Costs are timings of this machine, not logits: they live in one JSON file per pool target and
machine setting, ``<dir>/speed-<key>.json`` (:func:`speed_path`), apart from the member folders,
so measuring them again (a new unit, another machine) never touches a logit shard, and every
temperature's folders share them (the engine's step costs do not depend on the sampling
temperature, except greedy decoding: temperature 0 takes the engine's greedy path, with its own
file). The key covers what the figures depend on: the target spec, its content id
(:meth:`~mdboost.cache.keys.PoolCacheSpec.weights`: a local folder's digest, a hub commit) and
device, the torch thread count and version, the measurement settings (prompt tokens, repeats,
the largest draft length), greedy or sampled, :data:`mdboost.engine.costs.COST_UNIT`, and the
:data:`KERNEL_ENV` variables set (kernels capped below the CPU's time another machine); a
drafter's entry is keyed by its spec and, for a model loaded by name or path, its own content
id, for a kind whose kernel changed, its revision (:func:`entry_key`), so re-saved weights and
changed kernels are measured again. The file holds

- ``profile``: the target's :class:`~mdboost.engine.costs.EngineProfile` (``verify_cost``
  ``v(K)``, ``md_overhead`` ``s``, ``prefill_per_token``, samples, method);
- ``drafters``: per drafter entry (:func:`entry_key`) its
  :class:`~mdboost.engine.costs.CostMeasurement` (``median`` ``c``, ``samples``,
  ``prefill_per_token``, method, threads, load averages), measured against the target;
- ``engine`` (``"mdboost"``, or ``"llamacpp"`` for a spec whose ``engine`` is llama.cpp's: its
  own file, keyed by llama-cpp-python's version too), ``hardware`` (the machine's fingerprint when it measured:
  :func:`mdboost.cache.profile.hardware_fingerprint`) and ``pool`` (target, its content id, the
  vocabulary fingerprint, greedy or sampled: :func:`mdboost.cache.profile.pool_identity`);
- ``batches`` (when measured): per batch size ``B > 1`` (its key the decimal ``B``) the same
  ``profile`` and ``drafters``, measured with ``B`` rows in every engine step (``v(K, B)``,
  ``c(B)``, the prefill costs at ``B``; ``docs/theory.md``, "Batches"). The top-level figures
  are those of ``B = 1``.

So the speed file is a *cost profile* (:mod:`mdboost.cache.profile`): ``mdboost profile`` writes
a copy of it for one pool's drafters, and ``mdboost rank --costs`` ranks with another machine's.
A file of format 1 (without ``engine``, ``hardware`` and ``pool``) is read as format 2 with those
unknown; it is written as format 2 when something new is measured into it. The file's name keeps
the key of format 1 (:data:`KEY_FORMAT`), so the costs already measured are found.

:class:`SpeedStore` reads it and writes it back atomically after each new measurement, so an
interrupted build keeps what it measured.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
from pathlib import Path

import torch

from mdboost._io import atomic_write_text
from mdboost.cache.keys import fingerprint

# the environment variables that cap the CPU kernels' instruction set (ATen, MKL, oneDNN)
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
FORMAT = "mdboost-speed/2"
KEY_FORMAT = "mdboost-speed/1"  # part of a speed file's name: unchanged, so format-1 files are still found
ENGINE = "mdboost"  # the engine whose steps the costs time (mdboost.engine)


def engine_version(engine: str) -> str | None:
    """The installed version of what runs ``engine``'s forward passes: torch's for ``"mdboost"``,
    llama-cpp-python's for ``"llamacpp"`` (None when it is not installed)."""
    if engine == ENGINE:
        return torch.__version__.split("+")[0]
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return None


def speed_path(spec) -> Path:
    """The speed file of a :class:`~mdboost.cache.keys.PoolCacheSpec` (module docstring)."""
    # deferred: mdboost.engine imports transformers (seconds); a cache opens without it
    from mdboost.engine.costs import COST_UNIT, ENGINE_THREADS

    parts = [KEY_FORMAT, COST_UNIT, spec.target, spec.device, spec.home, ENGINE_THREADS, torch.__version__.split("+")[0],
             spec.cost_context, spec.cost_repeats, max(spec.gamma_max, 8), *spec.weights(spec.target)]
    if spec.engine != ENGINE:  # another engine's steps (mdboost's keep the names they always had)
        parts += ["engine", spec.engine, engine_version(spec.engine)]
    # kernels capped below the CPU's (KERNEL_ENV) time another machine: they get their own file
    capped = [f"{k}={os.environ[k]}" for k in KERNEL_ENV if os.environ.get(k)]
    key = fingerprint(*parts, *(["greedy"] if spec.temperature == 0 else []), *capped)
    return Path(spec.dir) / f"speed-{key}.json"


def entry_key(spec, name: str) -> str:
    """A drafter's entry name in the speed file: its spec, plus its own content id when it has one
    and the revision of how its kind computes (:data:`mdboost.models.pool.ROW_REVISIONS`: a
    changed kernel is measured again)."""
    # deferred: mdboost.models imports transformers (seconds); a cache opens without it
    from mdboost.models.pool import row_revision

    own = [pair for pair in spec.weights(name) if pair[0] == "weights"]
    if row_revision(name) is not None:
        own.append(["revision", row_revision(name)])
    return name if not own else f"{name}#{fingerprint(*own)}"


class SpeedStore:
    """The speed file of one pool target: read on open, rewritten atomically on each change.

    Parameters
    ----------
    path : path
        The JSON file (created on the first write).
    keys : dict, optional
        Drafter name -> entry name (:func:`entry_key`); names not in it are their own entry.
    kind : str, default="speed file"
        What the file is called in errors (``"cost profile"`` for one given to ``rank --costs``).
    """

    def __init__(self, path: str | os.PathLike, keys: dict | None = None, kind: str = "speed file"):
        self.path, self.kind = Path(path), kind
        self._keys = dict(keys or {})
        self._data = {"format": FORMAT, "engine": ENGINE, "hardware": None, "pool": None, "profile": None,
                      "drafters": {}}
        if self.path.is_file():
            self._data = self._read()

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{self.kind} {str(self.path)!r} is not valid JSON ({exc}); {self._remedy}") from None
        if not isinstance(data, dict) or not isinstance(data.get("drafters", {}), dict):
            raise ValueError(f"{self.kind} {str(self.path)!r} is damaged (not a JSON object with a 'drafters' "
                             f"object); {self._remedy}")
        if data.get("format") not in (KEY_FORMAT, FORMAT):
            raise ValueError(f"{self.kind} {str(self.path)!r} has format {data.get('format')!r}, expected {FORMAT!r}")
        # format 1 had no engine, hardware or pool: read as format 2 with them unknown
        return {"engine": ENGINE, "hardware": None, "pool": None, "profile": None, "drafters": {}, **data,
                "format": FORMAT}

    @property
    def _remedy(self) -> str:
        return "delete it to measure again" if self.kind == "speed file" else "write it again with `mdboost profile`"

    def keyed(self, keys: dict) -> SpeedStore:
        """The same file's figures read through other entry names (``keys``: drafter -> entry)."""
        out = copy.copy(self)
        out._keys = dict(keys)
        return out

    def _batch(self, batch_size: int, create: bool = False) -> dict | None:
        """The figures of one batch size: the file itself at 1, its ``batches`` entry above."""
        if batch_size == 1:
            return self._data
        batches = self._data.setdefault("batches", {}) if create else self._data.get("batches") or {}
        if create:
            return batches.setdefault(str(batch_size), {"profile": None, "drafters": {}})
        return batches.get(str(batch_size))

    @property
    def profile(self) -> dict | None:
        """The target's profile (``EngineProfile.to_dict()``), or None when not measured."""
        return self._data["profile"]

    def profile_at(self, batch_size: int = 1) -> dict | None:
        """The target's profile measured with ``batch_size`` rows per step, or None."""
        batch = self._batch(batch_size)
        return None if batch is None else batch["profile"]

    @property
    def batch_sizes(self) -> list[int]:
        """The batch sizes with a target profile."""
        sizes = [1] if self.profile is not None else []
        return sizes + sorted(int(b) for b, v in (self._data.get("batches") or {}).items() if v.get("profile"))

    @property
    def hardware(self) -> dict | None:
        """The fingerprint of the machine that measured (:func:`mdboost.cache.profile.hardware_fingerprint`),
        or None (a format-1 file)."""
        return self._data["hardware"]

    @property
    def pool(self) -> dict | None:
        """The pool the costs belong to (:func:`mdboost.cache.profile.pool_identity`), or None (unknown)."""
        return self._data["pool"]

    @property
    def engine(self) -> str:
        return self._data["engine"]

    def drafter(self, name: str, batch_size: int = 1) -> dict | None:
        """A drafter's entry (``median``, ``samples``, ``prefill_per_token``, ``method``) at
        ``batch_size`` rows per step, or None."""
        batch = self._batch(batch_size)
        return None if batch is None else batch["drafters"].get(self._keys.get(name, name))

    def missing(self, drafters, batch_size: int = 1) -> list[str]:
        """The names in ``drafters`` without an entry at ``batch_size``."""
        return [d for d in drafters if self.drafter(d, batch_size) is None]

    def identify(self, pool: dict, hardware: dict | None = None, engine: str = ENGINE) -> None:
        """Set the pool's identity, the engine whose steps are timed and (when given) the measuring
        machine's fingerprint, in memory: they are written with the next measurement (a plain
        re-ranking never writes the file)."""
        self._data["pool"] = pool
        self._data["engine"] = engine
        if hardware is not None:
            self._data["hardware"] = hardware

    def set_profile(self, profile: dict, batch_size: int = 1) -> None:
        self._batch(batch_size, create=True)["profile"] = profile
        self._write()

    def set_drafter(self, name: str, entry: dict, batch_size: int = 1) -> None:
        """Store a drafter's entry (``CostMeasurement.to_dict()``) at ``batch_size``."""
        self._batch(batch_size, create=True)["drafters"][self._keys.get(name, name)] = entry
        self._write()

    def to_dict(self, drafters=None) -> dict:
        """The file's JSON object; with ``drafters`` (names), only their entries (at every batch size)."""
        data = copy.deepcopy(self._data)
        if drafters is not None:
            entries = [self._keys.get(d, d) for d in drafters]
            for batch in [data, *(data.get("batches") or {}).values()]:
                batch["drafters"] = {e: batch["drafters"][e] for e in entries if e in batch["drafters"]}
        return data

    def _write(self) -> None:
        atomic_write_text(self.path, json.dumps(self._data, indent=2, sort_keys=True))
