"""Benchmark: AR vs SD vs MD with the engine, side by side with Hugging Face ``generate``.

Resumable runner of the generation grid (``FULL_GRID``) on the default SmolLM2 pool (CPU by default,
batch size 1, HumanEval prompts). A *cell* is one configuration -- mode (``sd``, ``md`` at a
KL budget, or a Hugging Face peer), temperature, drafter, gamma -- at fixed settings (target,
device, number of prompts, new tokens, seed, torch threads). Cells are measured in *chunks*
(one drafter x one temperature: the engine's AR plus that drafter's SD/MD cells, configs
interleaved per prompt so that a change of machine load hits them alike). After every chunk
its cells are written atomically to the cells file (``bench/generation_cells.json``), each
with its same-process references: every chunk re-measures AR (and the SD that an MD cell is
compared with), so a ratio never mixes processes. ``--resume`` skips measured cells,
``--max-minutes`` stops before a chunk that would not finish (and abandons a chunk whose
projected end passes the cap, keeping the file consistent). The ``generation`` section of
``bench/RESULTS.md`` is rebuilt from ALL cells of the file at the current settings.

The first chunk is the greedy peer comparison: HF plain AR vs the engine's AR, HF assisted
generation (``assistant_model=``; transformers stops a draft at assistant confidence 0.4 by
default and adapts that threshold) vs the engine's SD with the same model drafter and a fixed
``ConfidenceStop(0.4)``, and HF prompt
lookup (``prompt_lookup_num_tokens``) vs the engine's SD with ``ngram:3``, all at gamma 4 with
token-for-token equality checks. Then chunks by priority: ``ngram:3`` and the tuned drafters
(highest acceptance in the ``cache`` section) at every temperature, then int8 and plain early
exits; temperatures in the order given (the grid: 1.0 before 0.7).

Timings are single-threaded by default (``--threads 1``): that is what the report shows.
The grid and the cells file live in ``bench/_generation_grid.py``, the report in
``bench/_generation_report.py``; this script measures.

    .venv/bin/python bench/generation.py --full-grid --resume --max-minutes 120
    .venv/bin/python bench/generation.py [--prompts 4] [--new-tokens 64] [--cells PATH] [--no-write]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import itertools
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench._generation_grid import (  # noqa: E402,F401  (re-exported: the grid is part of this script's API)
    CELLS, DEFAULT_DRAFTERS, DEFAULTS, FULL_GRID, HF_MODES, PEER_CONFIDENCE, SETTINGS, Chunk, Spec, cell_key,
    chunk_specs, dependencies, drafter_priority, grid_keys, load_cells, merge_cells, plan_chunks, save_cells, settings_of, shard, parse_shard, _pending,
)
from bench._generation_report import report  # noqa: E402
from bench._results import machine_line, update_section  # noqa: E402
from mdboost.data import encode_prompt, load_texts  # noqa: E402
from mdboost.engine import ConfidenceStop, GenerationSettings, ModelDrafter, NgramAdapter, generate  # noqa: E402
from mdboost.models.loading import synchronize  # noqa: E402
from mdboost.models.pool import build_pool, parse_drafter  # noqa: E402,F401


def _floats(text):
    return [float(x) for x in text.split(",") if x]


def _ints(text):
    return [int(x) for x in text.split(",") if x]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafters", help=f"comma-separated specs (default {DEFAULTS['drafters']})")
    ap.add_argument("--prompts", type=int, help=f"HumanEval prompts (default {DEFAULTS['prompts']})")
    ap.add_argument("--new-tokens", type=int, help=f"new tokens per prompt (default {DEFAULTS['new_tokens']})")
    ap.add_argument("--gammas", type=_ints, help="draft lengths (default 4)")
    ap.add_argument("--budgets", type=_floats, help="MD KL budgets (default 0.05)")
    ap.add_argument("--temperatures", type=_floats, help="sampling temperatures (default 0,1.0)")
    ap.add_argument("--full-grid", action="store_true", help="the generation grid's values for every grid flag not given")
    ap.add_argument("--peer-drafter", help="model drafter for HF assisted generation (default: first by priority)")
    ap.add_argument("--peer-gamma", type=int, default=4)
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face peer chunk")
    ap.add_argument("--cells", type=Path, default=CELLS, help="results file (default bench/generation_cells.json)")
    ap.add_argument("--resume", action="store_true", help="skip cells already in the cells file")
    ap.add_argument("--shard", help="I/N: measure every N-th chunk of the plan from the I-th (0-based), so that N "
                    "processes can share one cells file")
    ap.add_argument("--max-minutes", type=float, help="stop before a chunk that would end past this")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--report-only", action="store_true", help="measure nothing, rebuild the report")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true", help="print only, do not update RESULTS.md")
    args = ap.parse_args(argv)
    for name, value in FULL_GRID.items():
        if getattr(args, name) is None:
            setattr(args, name, value if args.full_grid else DEFAULTS[name])
    _check_args(args)
    args.shard = None if args.shard is None else parse_shard(args.shard)
    return args


def _check_args(args):
    for name in ("prompts", "new_tokens", "threads", "peer_gamma"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)!r}")
    if args.max_minutes is not None and not args.max_minutes > 0:
        raise ValueError(f"--max-minutes must be > 0, got {args.max_minutes!r}")
    if not args.gammas or min(args.gammas) < 1:
        raise ValueError(f"--gammas must be positive integers, got {args.gammas!r}")
    if any(not b > 0 for b in args.budgets) or any(t < 0 for t in args.temperatures):
        raise ValueError(f"--budgets must be > 0 and --temperatures >= 0, got {args.budgets!r}, {args.temperatures!r}")


# --------------------------------------------------------------------------- measuring


def run_interleaved(configs, prompts, device, deadline=None):
    """Time every config on every prompt, configs interleaved per prompt. Returns per config:
    tokens, seconds, outputs, stats; ``None`` when after a prompt the projected end of the
    run (from the prompts so far) passes ``deadline`` (a ``time.monotonic()`` value)."""
    results = {key: dict(tokens=0, seconds=0.0, outs=[], stats=[]) for key, _ in configs}
    start = time.monotonic()
    for done, ids in enumerate(prompts, 1):
        for key, fn in configs:
            synchronize(device)
            tic = time.perf_counter()
            new, extra = fn(ids, None)
            synchronize(device)
            res = results[key]
            res["seconds"] += time.perf_counter() - tic
            res["tokens"] += new.numel()
            res["outs"].append(new.tolist())
            if extra is not None:
                res["stats"].append(extra)
        now = time.monotonic()
        print(f"  prompt {done}/{len(prompts)} done ({len(configs)} configs, {now - start:.0f} s)", flush=True)
        if deadline is not None and done < len(prompts) and now + (now - start) / done * (len(prompts) - done) > deadline:
            return None
    return results


def hf_runner(target, eos, n, **kwargs):
    def run(ids, max_new=None):
        out = target.generate(ids, max_new_tokens=max_new or n, do_sample=False, eos_token_id=eos,
                              pad_token_id=eos, **kwargs)
        return out[0, ids.shape[1]:], None
    return run


def assisted_runner(target, eos, n, assistant, gamma):
    """HF assisted generation drafting ``gamma`` tokens per round, set where transformers reads it.

    ``AssistedCandidateGenerator`` takes ``num_assistant_tokens`` and its schedule from the
    *assistant's* ``generation_config`` (transformers' assisted decoding docs); passed to
    ``target.generate`` they are ignored and the draft cap stays at the default 20. The
    confidence threshold is left at transformers' default (0.4, adapted), as the module says.
    """
    def run(ids, max_new=None):
        config = assistant.generation_config
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = gamma, "constant"
        return hf_runner(target, eos, n, assistant_model=assistant)(ids, max_new)
    return run


def engine_runner(target, settings: GenerationSettings, seed, drafter=None):
    def run(ids, max_new=None):
        this = settings if max_new is None else dataclasses.replace(settings, max_new_tokens=max_new)
        out = generate(target, ids, this, drafter=drafter, generator=torch.Generator(device=ids.device).manual_seed(seed))
        return out.sequences[0, ids.shape[1]: ids.shape[1] + out.num_new_tokens[0]], out.stats
    return run


def make_runner(spec: Spec, pool, n: int, seed: int):
    """A ``run(ids, max_new=None) -> (new tokens, stats or None)`` for one config."""
    target, eos = pool.target.model, pool.target.tokenizer.eos_token_id
    if spec.mode == "hf_ar":
        return hf_runner(target, eos, n)
    if spec.mode == "hf_lookup":
        return hf_runner(target, eos, n, prompt_lookup_num_tokens=spec.gamma)
    if spec.mode == "hf_assisted":
        return assisted_runner(target, eos, n, pool[spec.drafter].model, spec.gamma)
    settings = GenerationSettings(max_new_tokens=n, eos_token_id=eos, temperature=spec.temperature,
                                  max_divergence=spec.budget if spec.mode == "md" else 0.0)
    if spec.mode == "ar":
        return engine_runner(target, settings, seed)
    member = pool[spec.drafter]
    if member.ngram is not None:
        drafter = NgramAdapter(member.ngram)
    else:
        # greedy model-drafter SD exists only as HF assisted generation's peer: draft with the
        # same confidence stop (HF starts from 0.4 and then adapts it by a ROC rule)
        peer = spec.mode == "sd" and spec.temperature == 0
        drafter = ModelDrafter(member.model, confidence_stop=ConfidenceStop(PEER_CONFIDENCE) if peer else None)
    return engine_runner(target, dataclasses.replace(settings, gamma=spec.gamma), seed, drafter)


def _timing(res) -> dict:
    return dict(tokens=res["tokens"], seconds=round(res["seconds"], 4), tok_s=res["tokens"] / res["seconds"])


def _stats_fields(stats) -> dict:
    if not stats:
        return {}
    total = {name: sum(getattr(s, name) for s in stats) for name in (
        "num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_verified_positions", "num_solved_positions",
        "num_budget_accepted", "time_drafter", "time_target", "time_verify")}
    drafts, proposed, solved = total["num_drafts"], total["num_draft_tokens"], total["num_solved_positions"]
    per_position = [[sum(x) for x in itertools.zip_longest(*(getattr(s, name) for s in stats), fillvalue=0)]
                    for name in ("draft_tokens_per_position", "accepted_tokens_per_position")]
    return dict(total, mean_accepted_length=1 + total["num_accepted_tokens"] / drafts if drafts else None,
                acceptance_rate=total["num_accepted_tokens"] / proposed if proposed else None,
                acceptance_rate_per_position=[a / d if d else None for d, a in zip(*per_position)],
                mean_kl=sum(s.divergence_sum for s in stats) / solved if solved else 0.0,
                max_kl=max(s.max_divergence for s in stats))


def make_cell(spec: Spec, results: dict, settings: dict, meta: dict) -> dict:
    """The record of one measured cell, with its same-process references and equality check.

    Fields: the spec and settings; ``tokens``, ``seconds``, ``tok_s`` summed over the prompts;
    engine counters (mean accepted length, acceptance rate overall and per draft position,
    ``mean_kl`` = realized KL over the positions where the MD clamp was solved, ``max_kl``,
    drafter / target / verify seconds); ``references`` (``ar`` always; ``sd`` for MD;
    ``hf_ar`` and ``engine`` for HF peers: same process); ``speedup_vs_ar``;
    ``identical_to_engine`` for HF peers; ``run_id``, ``chunk``, ``machine``, ``torch_threads``, ``date``,
    ``commit`` (short hash, ``+`` for local changes), ``loadavg`` (the larger 1-minute load of the
    chunk's start and end), ``shards`` (N of ``--shard I/N``: processes sharing the machine by design).
    """
    res = results[spec]
    refs = {"ar": _timing(results[Spec("ar", spec.temperature)])}
    refs.update({role: _timing(results[dep]) for role, dep in dependencies(spec)})
    cell = dict(key=cell_key(spec, settings), **spec._asdict(), **settings, **_timing(res), **_stats_fields(res["stats"]))
    cell.update(references=refs, speedup_vs_ar=cell["tok_s"] / refs["ar"]["tok_s"], **meta)
    same = Spec("ar", 0.0) if spec.mode == "hf_ar" else dict(dependencies(spec)).get("engine")
    if same is not None:
        cell["identical_to_engine"] = res["outs"] == results[same]["outs"]
    return cell


def measure_chunk(chunk: Chunk, pool, prompts, args, meta, deadline=None) -> list[dict] | None:
    """Measure one chunk; its cells, or ``None`` when abandoned at the deadline."""
    load = os.getloadavg()[0]  # 1-minute load: other processes sharing the cores
    runners = [(spec, make_runner(spec, pool, args.new_tokens, args.seed)) for spec in chunk_specs(chunk)]
    for _, fn in runners:
        fn(prompts[0], 2)  # warm-up: first-call costs stay out of the timings
    results = run_interleaved(runners, prompts, torch.device(args.device), deadline)
    if results is None:
        return None
    meta = dict(meta, chunk=chunk.name, loadavg=round(max(load, os.getloadavg()[0]), 2))
    return [make_cell(spec, results, settings_of(args), meta) for spec in chunk.cells]


def _commit() -> str | None:
    """The checkout's short commit (``+`` when it has local changes), or None outside git."""
    try:
        run = functools.partial(subprocess.run, capture_output=True, text=True, check=True, cwd=ROOT)
        head = run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip()
        return head + ("+" if run(["git", "status", "--porcelain", "--untracked-files=no"]).stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def run_chunks(chunks, pool, prompts, args, cells, deadline=None) -> int:
    """Measure ``chunks`` in order, saving ``cells`` after each; returns the number completed."""
    meta = dict(run_id=f"{datetime.datetime.now():%Y%m%dT%H%M%S}-{os.getpid()}-{uuid.uuid4().hex[:6]}", machine=machine_line(),
                torch_threads=torch.get_num_threads(), date=f"{datetime.date.today()}", commit=_commit(),
                shards=args.shard[1] if args.shard else 1)
    per_config = []  # seconds per (config x prompt) of the chunks so far
    for done, chunk in enumerate(chunks):
        size = len(chunk_specs(chunk)) * len(prompts)
        if deadline is not None and per_config and time.monotonic() + statistics.mean(per_config) * size > deadline:
            print(f"stopping: chunk {chunk.name!r} would end past --max-minutes", flush=True)
            return done
        print(f"chunk {done + 1}/{len(chunks)}: {chunk.name} ({len(chunk.cells)} cells)", flush=True)
        tic = time.monotonic()
        new = measure_chunk(chunk, pool, prompts, args, meta, deadline)
        if new is None:
            print(f"stopping: chunk {chunk.name!r} abandoned, it would end past --max-minutes", flush=True)
            return done
        per_config.append((time.monotonic() - tic) / size)
        cells.update(merge_cells(args.cells, {cell["key"]: cell for cell in new}))
    return len(chunks)


def main(argv=None):
    t0 = time.monotonic()
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    deadline = None if args.max_minutes is None else t0 + 60 * args.max_minutes
    settings, cells = settings_of(args), load_cells(args.cells)
    chunks = plan_chunks([d for d in args.drafters.split(",") if d], args.gammas, args.budgets, args.temperatures,
                         not args.no_hf, args.peer_drafter, args.peer_gamma)
    chunks = shard(chunks, args.shard)  # of the whole plan: the same split whenever each process starts
    if args.resume:
        chunks = _pending(chunks, lambda spec: cell_key(spec, settings) in cells)
    if chunks and not args.report_only:
        names = sorted({s.drafter for c in chunks for s in chunk_specs(c) if s.drafter}, key=drafter_priority)
        pool = build_pool(args.target, names, device=torch.device(args.device))
        prompts = [encode_prompt(pool.target.tokenizer, r["prompt"])[None].to(args.device)
                   for r in load_texts("humaneval", limit=args.prompts)]
        done = run_chunks(chunks, pool, prompts, args, cells, deadline)
        print(f"{done}/{len(chunks)} chunks measured; cells in {args.cells}", flush=True)
    markdown = report(cells, args)
    print(markdown)
    if not args.no_write:
        update_section("generation", markdown)


if __name__ == "__main__":
    main()
