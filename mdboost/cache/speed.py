"""The pool's measured engine costs, kept next to its logit caches (``docs/theory.md``, "Speed model for ranking").

Costs are timings of this machine, not logits: they live in one JSON file per pool target and
machine setting, ``<dir>/speed-<key>.json`` (:func:`speed_path`), apart from the member folders,
so measuring them again (a new unit, another machine) never touches a logit shard, and every
temperature's folders share them (the engine's step costs do not depend on the sampling
temperature, except greedy decoding: temperature 0 takes the engine's greedy path, with its own
file). The key covers what the figures depend on: the target spec, its content id
(:meth:`~mdboost.cache.keys.PoolCacheSpec.weights`: a local folder's digest, a hub commit) and
device, the torch thread count and version, the measurement settings (prompt tokens, repeats,
the largest draft length), greedy or sampled, and :data:`mdboost.engine.costs.COST_UNIT`; a
drafter's entry is keyed by its spec and, for a model loaded by name or path, its own content
id (:func:`entry_key`), so re-saved weights are measured again. The file holds

- ``profile``: the target's :class:`~mdboost.engine.costs.EngineProfile` (``verify_cost``
  ``v(K)``, ``md_overhead`` ``s``, ``prefill_per_token``, samples, method);
- ``drafters``: per drafter spec its :class:`~mdboost.engine.costs.CostMeasurement`
  (``median`` ``c``, ``samples``, ``prefill_per_token``, method), measured against the target.

:class:`SpeedStore` reads it and writes it back atomically after each new measurement, so an
interrupted build keeps what it measured.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from mdboost._io import atomic_write_text
from mdboost.cache.keys import fingerprint

FORMAT = "mdboost-speed/1"


def speed_path(spec) -> Path:
    """The speed file of a :class:`~mdboost.cache.keys.PoolCacheSpec` (module docstring)."""
    # deferred: mdboost.engine imports transformers (seconds); a cache opens without it
    from mdboost.engine.costs import COST_UNIT, ENGINE_THREADS

    parts = [FORMAT, COST_UNIT, spec.target, spec.device, spec.home, ENGINE_THREADS, torch.__version__.split("+")[0],
             spec.cost_context, spec.cost_repeats, max(spec.gamma_max, 8), *spec.weights(spec.target)]
    key = fingerprint(*parts, *(["greedy"] if spec.temperature == 0 else []))
    return Path(spec.dir) / f"speed-{key}.json"


def entry_key(spec, name: str) -> str:
    """A drafter's entry name in the speed file: its spec, plus its own content id when it has one."""
    own = [pair for pair in spec.weights(name) if pair[0] == "weights"]
    return name if not own else f"{name}#{fingerprint(*own)}"


class SpeedStore:
    """The speed file of one pool target: read on open, rewritten atomically on each change.

    Parameters
    ----------
    path : path
        The JSON file (created on the first write).
    keys : dict, optional
        Drafter name -> entry name (:func:`entry_key`); names not in it are their own entry.
    """

    def __init__(self, path: str | os.PathLike, keys: dict | None = None):
        self.path = Path(path)
        self._keys = dict(keys or {})
        self._data = {"format": FORMAT, "profile": None, "drafters": {}}
        if self.path.is_file():
            try:
                data = json.loads(self.path.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ValueError(f"speed file {str(self.path)!r} is not valid JSON ({exc}); delete it to measure "
                                 f"again") from None
            if not isinstance(data, dict) or not isinstance(data.get("drafters", {}), dict):
                raise ValueError(f"speed file {str(self.path)!r} is damaged (not a JSON object with a 'drafters' "
                                 f"object); delete it to measure again")
            if data.get("format") != FORMAT:
                raise ValueError(f"speed file {str(self.path)!r} has format {data.get('format')!r}, expected {FORMAT!r}")
            self._data = data

    @property
    def profile(self) -> dict | None:
        """The target's profile (``EngineProfile.to_dict()``), or None when not measured."""
        return self._data["profile"]

    def drafter(self, name: str) -> dict | None:
        """A drafter's entry (``median``, ``samples``, ``prefill_per_token``, ``method``), or None."""
        return self._data["drafters"].get(self._keys.get(name, name))

    def missing(self, drafters) -> list[str]:
        """The names in ``drafters`` without an entry."""
        return [d for d in drafters if self.drafter(d) is None]

    def set_profile(self, profile: dict) -> None:
        self._data["profile"] = profile
        self._write()

    def set_drafter(self, name: str, entry: dict) -> None:
        """Store a drafter's entry (``CostMeasurement.to_dict()``)."""
        self._data["drafters"][self._keys.get(name, name)] = entry
        self._write()

    def _write(self) -> None:
        atomic_write_text(self.path, json.dumps(self._data, indent=2, sort_keys=True))
