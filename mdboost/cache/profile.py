"""Cost profiles: a pool's measured engine costs as a portable file, with the machine they belong to.

A pool's speed file (:mod:`mdboost.cache.speed`) *is* its cost profile: one JSON object holding

- ``hardware`` (:func:`hardware_fingerprint`): the CPU's model name and the instruction-set flags
  that decide the speed of its matrix kernels (AVX2, AVX-512, VNNI, AMX, read from
  ``/proc/cpuinfo`` where there is one), or the CUDA device's name and memory; the torch thread
  count of the measurement, the torch version, the pool's dtype, the CPU count and the load
  average when measured;
- ``engine``: the engine whose steps are timed (``"mdboost"``);
- ``pool`` (:func:`pool_identity`): the target spec, its content id, the vocabulary
  fingerprint the logit caches are built with, greedy or sampled decoding;
- the costs, as the speed model reads them (``docs/theory.md``, "Speed model for ranking"): the
  target's ``profile`` (``v(K)``, the MD overhead ``s``, the prefill cost, every repeat's sample,
  the load averages) and per drafter entry its cost ratio ``c`` with its samples (their spread)
  and prefill cost.

``mdboost profile`` writes a pool's file for its drafters (:func:`write_profile`);
``mdboost rank --costs FILE`` ranks the cached logits with the costs of ``FILE`` instead of this
machine's (:func:`read_profile`, then :func:`check_profile` against the pool). A profile of another
target (spec or weights), another vocabulary, the other decoding mode, another cost unit, one
lacking a drafter of the pool or a batch size the ranking predicts for, or whose ``v(K)`` table
is shorter than the ranking's draft lengths, is refused with a ``ValueError`` naming the file and the mismatch.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

from mdboost._io import atomic_write_text
from mdboost.cache.speed import ENGINE, KERNEL_ENV, SpeedStore, engine_version

# /proc/cpuinfo flags that select the CPU's matrix kernels (int8 dot products: VNNI, AMX)
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")



def _cpu(cpuinfo: str) -> tuple[str | None, list[str]]:
    """The model name and the :data:`CPU_FLAGS` present in a ``/proc/cpuinfo`` text (its first CPU).

    >>> _cpu("model name\\t: Some CPU\\nflags\\t\\t: fpu avx2 avx512f\\n")
    ('Some CPU', ['avx2', 'avx512f'])
    """
    fields = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return fields.get("model name"), [f for f in CPU_FLAGS if f in flags]


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def hardware_fingerprint(device, engine: str = ENGINE) -> dict:
    """What the costs measured on this machine depend on, as a JSON-able dict.

    Parameters
    ----------
    device : str, torch.device or None
        The pool's device (``None``: the one the pool resolves it to, CUDA when present).
    engine : {"mdboost", "llamacpp"}, default="mdboost"
        Whose forward passes are timed; ``"llamacpp"`` adds ``llama_cpp`` (llama-cpp-python's version).

    Returns
    -------
    dict
        ``cpu`` (model name or None), ``cpu_flags`` (the :data:`CPU_FLAGS` present), ``cpu_count``,
        ``machine`` (``platform.machine()``), ``cuda`` (``{"name", "memory_gib"}`` on a CUDA
        device, else None), ``torch_threads`` (the measurements' thread count), ``torch``
        (version), ``dtype`` (the pool's models' default dtype on the device), ``cpu_capability``
        (the instruction set torch's CPU kernels dispatch to, ``torch.backends.cpu.get_cpu_capability``),
        ``kernel_env`` (the :data:`KERNEL_ENV` variables set, which cap it) and ``load_average``
        (1, 5, 15 minutes; None where the platform has none).
    """
    # deferred: mdboost.engine and mdboost.models import transformers (seconds); a cache opens without it
    from mdboost.engine.costs import ENGINE_THREADS
    from mdboost.models.loading import default_dtype, resolve_device

    device = resolve_device(device)
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    cpu, flags = _cpu(cpuinfo)
    cuda = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        cuda = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1)}
    return {"cpu": cpu or platform.processor() or None, "cpu_flags": flags, "cpu_count": os.cpu_count(),
            "machine": platform.machine(), "cuda": cuda, "torch_threads": ENGINE_THREADS,
            "torch": torch.__version__.split("+")[0], "dtype": str(default_dtype(device)).replace("torch.", ""),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "kernel_env": {k: os.environ[k] for k in KERNEL_ENV if os.environ.get(k)},
            "load_average": _load_average(), **({} if engine == ENGINE else {"llama_cpp": engine_version(engine)})}


def hardware_label(hardware: dict | None) -> str:
    """A fingerprint in words: the GPU, or the CPU with its flags, then threads and torch.

    >>> hardware_label({"cpu": "AMD EPYC 7B13", "cpu_flags": ["avx2"], "cuda": None, "torch_threads": 1,
    ...                 "torch": "2.9.1", "dtype": "float32"})
    'AMD EPYC 7B13 (avx2), 1 torch thread, torch 2.9.1, float32'
    >>> hardware_label({"cpu": "CPU X", "cpu_flags": ["avx2", "avx512f"], "torch_threads": 1, "torch": "2.13.0",
    ...                 "dtype": "float32", "kernel_env": {"ATEN_CPU_CAPABILITY": "avx2"}})
    'CPU X (avx2, avx512f; kernels capped: ATEN_CPU_CAPABILITY=avx2), 1 torch thread, torch 2.13.0, float32'
    >>> hardware_label({"cpu": "CPU X", "cpu_flags": ["avx2"], "torch_threads": 1, "torch": "2.13.0",
    ...                 "dtype": "float32", "llama_cpp": "0.3.36"})
    'CPU X (avx2), 1 thread, llama.cpp (llama-cpp-python 0.3.36)'
    >>> hardware_label(None)
    'unrecorded hardware'
    """
    if not hardware:
        return "unrecorded hardware"
    if hardware.get("cuda"):
        chip = f"{hardware['cuda']['name']} ({hardware['cuda']['memory_gib']:g} GiB)"
    else:
        capped = ", ".join(f"{k}={v}" for k, v in (hardware.get("kernel_env") or {}).items())
        chip = (f"{hardware.get('cpu') or 'unknown CPU'} ({', '.join(hardware.get('cpu_flags') or []) or 'no AVX2'}"
                f"{f'; kernels capped: {capped}' if capped else ''})")
    threads = hardware.get("torch_threads")
    if "llama_cpp" in hardware:  # llama.cpp's forward passes (speed.engine: llamacpp), at the same thread count
        return f"{chip}, {threads} thread{'s' * (threads != 1)}, llama.cpp (llama-cpp-python {hardware['llama_cpp']})"
    return f"{chip}, {threads} torch thread{'s' * (threads != 1)}, torch {hardware.get('torch')}, {hardware.get('dtype')}"


def costs_line(hardware: dict | None, profile=None) -> str:
    """Where a ranking's costs were measured, for its verdict: the predicted speedups hold there.

    >>> costs_line({"cpu": "CPU X", "cpu_flags": ["avx2"], "torch_threads": 1, "torch": "2.9", "dtype": "float32"},
    ...            "other.json")
    'costs measured on CPU X (avx2), 1 torch thread, torch 2.9, float32 (cost profile other.json)'
    """
    if profile is None:
        return f"costs measured on {hardware_label(hardware)}"
    names = ", ".join([profile] if isinstance(profile, str) else [str(p) for p in profile])
    return f"costs measured on {hardware_label(hardware)} (cost profile {names})"


def loaded_measurements(store: SpeedStore, drafters=()) -> list[str]:
    """The figures of ``store`` measured while the machine was busy: the 1-minute load average
    before or after the measurement above the CPU count (other processes then shared the cores,
    and the many small ops of a drafter's step slow down more than a target's forward, which
    biases every ratio). One ``"<what> at B=<b> (load <x> on <n> cores)"`` per figure, the
    target's profile first, then ``drafters`` in their order.

    >>> import tempfile, pathlib
    >>> store = SpeedStore(pathlib.Path(tempfile.mkdtemp()) / "s.json")
    >>> store.identify({}, {"cpu_count": 2})
    >>> store.set_profile({"load_before": 0.5, "load_after": 3.1})
    >>> store.set_drafter("int8", {"load_before": 1.0, "load_after": 1.2})
    >>> loaded_measurements(store, ["int8"])
    ['target profile at B=1 (load 3.1 on 2 cores)']
    """
    cores = (store.hardware or {}).get("cpu_count") or os.cpu_count() or 1
    out = []
    for b in store.batch_sizes or [1]:
        entries = [("target profile", store.profile_at(b))] + [(d, store.drafter(d, b)) for d in drafters]
        for name, entry in entries:
            loads = [x for x in ((entry or {}).get("load_before"), (entry or {}).get("load_after"))
                     if isinstance(x, (int, float)) and x == x]
            if loads and max(loads) > cores:
                out.append(f"{name} at B={b} (load {max(loads):.1f} on {cores} cores)")
    return out


def pool_identity(spec, vocabulary: str) -> dict:
    """The pool a profile's costs belong to: the target spec, its content id
    (:meth:`~mdboost.cache.keys.PoolCacheSpec.weights`), the vocabulary fingerprint the caches are
    built with, and ``sampling`` (``"greedy"`` at temperature 0: the engine's greedy path, else
    ``"sampled"``). The drafters are the profile's entries (:func:`~mdboost.cache.speed.entry_key`)."""
    return {"target": spec.target, "target_weights": [list(p) for p in spec.weights(spec.target)],
            "vocabulary": vocabulary, "sampling": sampling_of(spec)}


def sampling_of(spec) -> str:
    return "greedy" if spec.temperature == 0 else "sampled"


def write_profile(store: SpeedStore, path: str | os.PathLike, drafters) -> Path:
    """Write ``store``'s figures for ``drafters`` to ``path`` (atomic), as a cost profile.

    The store must name its pool and hardware (:meth:`SpeedStore.identify`) and hold every
    drafter's entry and the target's profile."""
    sizes = store.batch_sizes or [1]
    missing = {b: store.missing(drafters, b) for b in sizes}
    missing = {b: m for b, m in missing.items() if m}
    if store.profile is None or missing or store.pool is None or store.hardware is None:
        raise ValueError(f"speed file {str(store.path)!r} is incomplete for a profile (target profile "
                         f"{'missing' if store.profile is None else 'present'}, drafters missing per batch size: "
                         f"{missing}, pool {'unknown' if store.pool is None else 'known'}, hardware "
                         f"{'unknown' if store.hardware is None else 'known'})")
    return atomic_write_text(path, json.dumps(store.to_dict(drafters), indent=2, sort_keys=True))


def read_profile(path: str | os.PathLike) -> SpeedStore:
    """A cost profile file, read (not yet checked against a pool: :func:`check_profile`)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"cost profile {str(path)!r} does not exist (write one with `mdboost profile`)")
    return SpeedStore(path, kind="cost profile")


def check_profile(store: SpeedStore, spec, vocabulary: str, gamma_max: int) -> None:
    """Refuse a profile that is not for the pool of ``spec`` (module docstring), naming the mismatch.

    Parameters
    ----------
    store : SpeedStore
        The profile, keyed by the pool's entry names (:meth:`SpeedStore.keyed`).
    spec : PoolCacheSpec
        The pool at one temperature.
    vocabulary : str
        The vocabulary fingerprint of the pool's logit caches (their manifests' ``tokenizer_fingerprint``).
    gamma_max : int
        The largest draft length ranked: ``v(K)`` must cover it.
    """
    # deferred: mdboost.engine imports transformers (seconds); a cache opens without it
    from mdboost.engine.costs import COST_UNIT

    where = f"cost profile {str(store.path)!r}"
    pool, own = store.pool, pool_identity(spec, vocabulary)
    if store.engine != spec.engine:
        raise ValueError(f"{where} times engine {store.engine!r}, the ranking's (speed.engine) is {spec.engine!r}")
    if pool is None or store.hardware is None:
        raise ValueError(f"{where} names no pool or hardware (a speed file of format 1); write a profile with "
                         f"`mdboost profile`")
    for key, what in (("target", "target"), ("target_weights", "target weights"), ("vocabulary", "vocabulary"),
                      ("sampling", "decoding (greedy or sampled)")):
        if pool.get(key) != own[key]:
            raise ValueError(f"{where} is for another {what}: {pool.get(key)!r}, the pool's is {own[key]!r}")
    for b in spec.batch_sizes:
        at = "" if b == 1 else f" at batch size {b}"
        profile = store.profile_at(b)
        if profile is None:
            raise ValueError(f"{where} has no target profile (v(K), MD overhead){at} (profiled batch sizes: "
                             f"{store.batch_sizes})")
        if profile.get("unit") != COST_UNIT:
            raise ValueError(f"{where} is measured in unit {profile.get('unit')!r}, this mdboost's is {COST_UNIT!r}")
        if len(profile["verify_cost"]) <= gamma_max:
            raise ValueError(f"{where} has v(K) for K <= {len(profile['verify_cost']) - 1}{at}, the ranking's "
                             f"gamma_max is {gamma_max}")
        missing = store.missing(spec.drafters, b)
        if missing:
            raise ValueError(f"{where} lacks drafter(s) {missing} of the pool{at} (or has them with other weights)")
