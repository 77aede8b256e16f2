"""``mdboost profile --config X [--out PATH]``: a pool's engine costs on this machine, as a cost profile.

Measures what the pool's speed file lacks (:func:`mdboost.cache.pool_cache.measure_pool_costs`:
the target's ``v(K)``, MD overhead and prefill cost, each drafter's ``c``; no logit cache is
built) for each decoding mode the config ranks (greedy at ``md.temperatures`` 0, sampled above),
then writes the portable profile of the pool's drafters (:mod:`mdboost.cache.profile`) to
``PATH``, the greedy one (when the config also ranks sampled temperatures) beside it as
``<stem>-greedy<suffix>``; without ``--out`` it prints where the speed files are, which are
profiles too. ``mdboost rank --costs PATH`` ranks with it, here or on another machine's caches.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mdboost.cache.pool_cache import measure_pool_costs
from mdboost.cache.profile import hardware_label, loaded_measurements, sampling_of, write_profile
from pipelines.config import RankConfig
from pipelines.loader import load_yaml
from pipelines.noise import quiet_libraries


def profile_paths(out: str, modes: list[str]) -> dict[str, Path]:
    """Where each mode's profile goes: ``out`` for the first, ``<stem>-greedy<suffix>`` for greedy after sampled.

    >>> profile_paths("p.json", ["sampled", "greedy"])
    {'sampled': PosixPath('p.json'), 'greedy': PosixPath('p-greedy.json')}
    """
    path = Path(out)
    return {mode: path if i == 0 else path.with_name(f"{path.stem}-{mode}{path.suffix}") for i, mode in enumerate(modes)}


def main(config: str | RankConfig, overrides=(), out: str | None = None) -> int:
    """CLI entry point (module docstring); returns the exit status. ``config``: the YAML file (read
    with ``overrides``), or the :class:`~pipelines.config.RankConfig` loaded from it
    (:func:`pipelines.commands.profile`, the command's entry)."""
    cfg = config if isinstance(config, RankConfig) else load_yaml(config, RankConfig, overrides)
    if not cfg.progress:
        quiet_libraries()
    specs = {}
    for t in sorted(cfg.md.sampling_temperatures, reverse=True):  # sampled first, then greedy
        specs.setdefault(sampling_of(cfg.cache_spec(t)), cfg.cache_spec(t))
    paths = None if out is None else profile_paths(out, list(specs))
    for mode, spec in specs.items():
        store, info = measure_pool_costs(spec, progress=cfg.progress)
        measured = (["target profile"] if info.measured_speed_profile else []) + list(info.measured_costs)
        print(f"{mode} decoding: measured {', '.join(measured) or 'nothing (all in the speed file)'}; "
              f"hardware: {hardware_label(store.hardware)}")
        loaded = loaded_measurements(store, spec.drafters)
        if loaded:
            print(f"mdboost profile: warning: measured on a busy machine (the load average above the core count "
                  f"biases every ratio): {'; '.join(loaded)}; delete {store.path} and measure again on a quiet "
                  f"machine", file=sys.stderr)
        if paths is None:
            print(f"  speed file: {store.path} (--out PATH writes the portable profile of this pool)")
        else:
            print(f"  cost profile: {write_profile(store, paths[mode], spec.drafters)}")
    return 0
