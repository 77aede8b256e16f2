"""Benchmark of the mentored decoding core (section ``md_core`` of bench/RESULTS.md).

Side by side in one process, reported as ratios:

1. ``[64, 49152]`` float32: exact KL primal (``solve``, the expected linear-time path, and the
   sorted ``Breakpoints`` build + query) / one ``torch.sort`` of the same tensor (goal <= 0.25);
   dual query / build; bound query / build.
2. Against the public mentored decoding notebook's algorithm (``bench/_notebook.py``, a line by
   line port): speed per row and exactness side by side, in its own section ``md_baseline``.
3. Single-row calls: ``solve`` at V in {50, 1000, 49152} (goal at V = 1000: <= 0.3 ms), per row
   in a batch of 64 at V = 49152.
4. ``verify`` on ``[8, 4, 49152]``: MD / SD time at full vocabulary (goal <= 2) and with
   ``top_k=256`` (goal <= 1.2), ``solve="all"`` and the engine's default ``solve="needed"``;
   on CPU, next to SD's ``verify``, the floor of any exact full-vocabulary solve (division, log,
   weighted sum at every drafted entry) and one classification pass (:func:`bench_floor`).

Run: ``.venv/bin/python bench/md_core.py`` (a few minutes on one CPU core); ``--baseline``
measures and writes section 2 only; ``--verify`` measures item 4 and prints it (no write).
``--device cuda`` runs everything on a GPU (the inputs are made on CPU from the same seeds, then
moved; every clock reading waits for the device) and writes the sections ``md_core_cuda`` and
``md_baseline_cuda`` instead; ``--no-write`` prints only. On CPU torch uses one thread.
The machine may be shared: paired measurements are interleaved and ratios are medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _results import load_line, machine_line, update_section  # noqa: E402

from _notebook import emitted_distribution, notebook_solve  # noqa: E402

from mdboost.md.breakpoints import Breakpoints  # noqa: E402
from mdboost.md.divergences import f_divergence  # noqa: E402
from mdboost.md.solve import acceptance_probability, mentored_distribution, solve  # noqa: E402
from mdboost.md.verify import verify  # noqa: E402
from mdboost.models.loading import synchronize  # noqa: E402

VOCAB = 49152
BUDGET = 0.05
DEVICE = torch.device("cpu")  # set once by the command line (--device)


def _sync():
    """Wait for :data:`DEVICE`'s queued work (a no-op on CPU), so that a clock reading covers it."""
    synchronize(DEVICE)


def timeit(fn, repeats=5, warmup=1):
    """Median wall time of ``fn()`` in seconds (the device's work included)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def llm_like_pair(rows, vocab, dtype, seed=0):
    """Correlated drafter/target rows with a heavy-tailed (LLM-like) logit profile, on :data:`DEVICE`
    (made on CPU from ``seed``: the same values on every device)."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 2.5
    draft = base + 0.8 * torch.randn(rows, vocab, generator=gen, dtype=torch.float64)
    target = base + 0.8 * torch.randn(rows, vocab, generator=gen, dtype=torch.float64)
    return torch.softmax(draft, -1).to(DEVICE, dtype), torch.softmax(target, -1).to(DEVICE, dtype)


def _generator(seed):
    """A generator on :data:`DEVICE` (``verify`` draws its uniforms there)."""
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _suffix():
    """The results sections' suffix: none on CPU, ``_cuda`` on a GPU."""
    return "" if DEVICE.type == "cpu" else f"_{DEVICE.type}"


def bench_build_and_queries(repeats=5):
    """``torch.sort``, the linear-time ``solve`` and the sorted build + query interleaved: ratios are
    medians of per-repeat ratios."""
    p, q = llm_like_pair(64, VOCAB, torch.float32)
    ratios = p / q

    def sorted_primal():
        Breakpoints.build(p, q, validate=False).for_divergence(BUDGET, "kl", validate=False)

    def linear():
        solve(p, q, max_divergence=BUDGET, validate=False)

    sorted_primal(), linear()  # warm-up
    t_sort, t_lin, t_old = [], [], []
    for _ in range(repeats):
        t_sort.append(timeit(lambda: torch.sort(ratios, dim=-1), repeats=1, warmup=0))
        t_lin.append(timeit(linear, repeats=1, warmup=0))
        t_old.append(timeit(sorted_primal, repeats=1, warmup=0))
    med = statistics.median
    t_build = timeit(lambda: Breakpoints.build(p, q, validate=False))
    bp = Breakpoints.build(p, q, validate=False)
    bp.for_divergence(BUDGET, "kl")  # fills the KL prefix cache once, excluded below
    sd = bp.sd_acceptance
    t_dual = timeit(lambda: bp.for_acceptance(sd + 0.05, validate=False), repeats=20)
    t_bound = timeit(lambda: bp.for_divergence_bound(BUDGET, "kl", validate=False), repeats=10)
    return dict(sort=med(t_sort), linear=med(t_lin), primal=med(t_old), build=t_build, dual=t_dual, bound=t_bound,
                linear_ratio=med([a / b for a, b in zip(t_lin, t_sort)]),
                primal_ratio=med([a / b for a, b in zip(t_old, t_sort)]))


def bench_single_row(repeats=30):
    """One ``solve`` call on one row (validation on, the default; and off) and per row in a batch."""
    out = {}
    for vocab in (50, 1000, VOCAB):
        p, q = llm_like_pair(1, vocab, torch.float32, seed=3)
        p, q = p[0], q[0]
        reps = repeats if vocab < VOCAB else 7
        out[vocab] = tuple(timeit(lambda v=v: solve(p, q, max_divergence=BUDGET, validate=v), repeats=reps, warmup=2)
                           for v in (True, False))
    p, q = llm_like_pair(64, VOCAB, torch.float32, seed=3)
    out["batch"] = timeit(lambda: solve(p, q, max_divergence=BUDGET, validate=False), repeats=5) / 64
    return out


def _clock(fn):
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - t0, out


BASELINE_DIV = "rkl"  # the notebook's "dkl" is KL(q || pi): mdboost's rkl
OVER = 1e-6  # a row is over budget when its realized divergence exceeds the budget by this, relatively


def _normalized64(p, q):
    p64, q64 = p.to(torch.float64), q.to(torch.float64)
    return p64 / p64.sum(-1, keepdim=True), q64 / q64.sum(-1, keepdim=True)


def baseline_exactness(p, q, budget, accept_of):
    """Exactness over rows, judged in float64 on the rows rescaled to sum to 1.

    ``accept_of(p64, q64) -> (pi, acceptance)``: the distribution a method emits [N, V] and its
    acceptance probability [N]. Returns the share of rows whose realized ``KL(q || pi)`` exceeds
    the budget, the largest realized / budget, the acceptance gap to the exact optimum at the
    budget (min, max) and the acceptance lost against the optimum at the divergence it spends.
    """
    p64, q64 = _normalized64(p, q)
    pi, acc = accept_of(p64, q64)
    realized = f_divergence(pi, q64, BASELINE_DIV, validate=False)
    opt = solve(p64, q64, max_divergence=budget, divergence=BASELINE_DIV).acceptance
    at_own = solve(p64, q64, max_divergence=realized, divergence=BASELINE_DIV).acceptance
    gap = acc - opt
    return dict(over=float((realized > budget * (1 + OVER)).double().mean()), ratio=float(realized.max() / budget),
                gap_min=float(gap.min()), gap_max=float(gap.max()), loss=float((at_own - acc).max()))


def _notebook_accept(p, q, budget, **kwargs):
    def accept_of(p64, q64):
        pis = [emitted_distribution(p64[i], q64[i], notebook_solve(p[i], q[i], budget, **kwargs))
               for i in range(p.shape[0])]
        pi = torch.stack(pis)
        return pi, acceptance_probability(p64, pi, validate=False)
    return accept_of


def _mdboost_accept(p, q, budget):
    def accept_of(p64, q64):
        sol = solve(p, q, max_divergence=budget, divergence=BASELINE_DIV)
        pi = mentored_distribution(p64, q64, sol.a.double(), sol.b.double(), validate=False)
        return pi, sol.acceptance.double()
    return accept_of


def bench_baseline(repeats=5):
    """The notebook port against mdboost's ``solve(divergence="rkl")``, float32 rows, side by side.

    Timed: per row at V = 49152 (8 rows called one by one; mdboost also as one ``[64, V]`` call,
    per row), and one call at V = 1000 and V = 50 (64 rows one by one). The calls are interleaved
    ``repeats`` times; speedups are medians of per-repeat ratios. Exactness over 64 rows each.
    """
    load = os.getloadavg()[0]
    big_p, big_q = llm_like_pair(64, VOCAB, torch.float32, seed=1)
    small_p, small_q = llm_like_pair(64, 1000, torch.float32, seed=3)
    tiny_p, tiny_q = llm_like_pair(64, 50, torch.float32, seed=4)
    one = dict(max_divergence=BUDGET, divergence=BASELINE_DIV)

    def rows(fn, p, q, n):
        def run():
            for i in range(n):
                fn(p[i], q[i])
        return run

    nb = lambda p, q: notebook_solve(p, q, BUDGET)  # noqa: E731
    md = lambda p, q: solve(p, q, **one)  # noqa: E731
    md_raw = lambda p, q: solve(p, q, validate=False, **one)  # noqa: E731
    runs = dict(nb_big=rows(nb, big_p, big_q, 8), md_big=rows(md, big_p, big_q, 8),
                md_raw_big=rows(md_raw, big_p, big_q, 8), md_batch=lambda: solve(big_p, big_q, **one),
                nb_small=rows(nb, small_p, small_q, 64), md_small=rows(md, small_p, small_q, 64),
                md_raw_small=rows(md_raw, small_p, small_q, 64), nb_tiny=rows(nb, tiny_p, tiny_q, 64),
                md_tiny=rows(md, tiny_p, tiny_q, 64), md_raw_tiny=rows(md_raw, tiny_p, tiny_q, 64))
    per_row = dict(nb_big=8, md_big=8, md_raw_big=8, md_batch=64, nb_small=64, md_small=64, md_raw_small=64,
                   nb_tiny=64, md_tiny=64, md_raw_tiny=64)
    for run in runs.values():  # warm-up
        run()
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(_clock(run)[0] / per_row[name])
    med = statistics.median
    out = {name: med(t) for name, t in times.items()}
    for ours, base in (("md_big", "nb_big"), ("md_raw_big", "nb_big"), ("md_batch", "nb_big"),
                       ("md_small", "nb_small"), ("md_raw_small", "nb_small"), ("md_tiny", "nb_tiny"),
                       ("md_raw_tiny", "nb_tiny")):
        out[f"speedup_{ours}"] = med([b / o for b, o in zip(times[base], times[ours])])
    out["exact"] = {
        (v, method): baseline_exactness(p, q, BUDGET, accept)
        for v, p, q in ((VOCAB, big_p, big_q), (1000, small_p, small_q), (50, tiny_p, tiny_q))
        for method, accept in (("notebook", _notebook_accept(p, q, BUDGET)),
                               ("notebook, beta index fixed", _notebook_accept(p, q, BUDGET, fix_beta_index=True)),
                               ("mdboost", _mdboost_accept(p, q, BUDGET)))
    }
    out["repeats"] = repeats
    out["load"] = load
    return out


def baseline_lines(base):
    """The ``md_baseline`` section of bench/RESULTS.md."""
    ms = 1e3
    exact = base["exact"]
    nb_ok = {v: exact[(v, "notebook")]["over"] for v in (VOCAB, 1000, 50)}
    md_ok = {v: exact[(v, "mdboost")]["over"] for v in (VOCAB, 1000, 50)}
    lines = [
        machine_line(),
        load_line(base["load"]),
        "",
        f"The public mentored decoding notebook (Tran-Thien, `vivien000/mentored_decoding`, `notebook.ipynb`, "
        f"`mentored_sampling`, commit `ace0902`), ported line by line in `bench/_notebook.py`: one sort of "
        f"`q / p`, prefix sums, `KL(q || pi)` in O(1) per step, 10 bisection steps on its `alpha`, any step "
        f"within [0.8 D, 1.2 D] accepted, and an off-by-one in its `beta` index (kept). Against mdboost's "
        f"`solve(..., divergence=\"{BASELINE_DIV}\")` (its `dkl` is `KL(q || pi)`), budget D = {BUDGET}, "
        f"LLM-like float32 rows. Times are medians over {base['repeats']} interleaved repeats of the "
        f"notebook's solve (sort to `alpha`, no sampling) and of `solve` (build, query, `pi` and its "
        f"divergence); speedups are medians of per-repeat ratios.",
        "",
        "| per row | notebook port | mdboost `solve` | `solve(validate=False)` | speedup (validated / not) | goal |",
        "|---|---|---|---|---|---|",
        f"| V = {VOCAB}, single-row calls | {base['nb_big'] * ms:.2f} ms | {base['md_big'] * ms:.2f} ms | "
        f"{base['md_raw_big'] * ms:.2f} ms | {base['speedup_md_big']:.2f}x / {base['speedup_md_raw_big']:.2f}x | "
        f">= 5x at equal or better exactness |",
        f"| V = {VOCAB}, mdboost batched `[64, {VOCAB}]` | {base['nb_big'] * ms:.2f} ms | "
        f"{base['md_batch'] * ms:.2f} ms | | {base['speedup_md_batch']:.2f}x | >= 10x |",
        f"| V = 1000, single-row calls | {base['nb_small'] * ms:.3f} ms | {base['md_small'] * ms:.3f} ms | "
        f"{base['md_raw_small'] * ms:.3f} ms | {base['speedup_md_small']:.2f}x / {base['speedup_md_raw_small']:.2f}x"
        f" | <= 0.3 ms and faster |",
        f"| V = 50, single-row calls | {base['nb_tiny'] * ms:.3f} ms | {base['md_tiny'] * ms:.3f} ms | "
        f"{base['md_raw_tiny'] * ms:.3f} ms | {base['speedup_md_tiny']:.2f}x / {base['speedup_md_raw_tiny']:.2f}x"
        f" | |",
        "",
        f"Exactness over 64 rows at each V, judged in float64 on the rows rescaled to sum to 1: the realized "
        f"`KL(q || pi)` of the distribution each method emits (for the notebook: accept `x` with "
        f"`min(1, q_x / (alpha p_x))`, else draw from `(q / beta - p)_+` renormalised); over budget = above "
        f"D (1 + {OVER:g}); gap = acceptance minus the exact optimum at D (float64 `solve`); lost = the "
        f"optimum at the divergence the method spends minus its acceptance.",
        "",
        "| V | method | rows over budget | max realized / D | acceptance gap to the optimum (min, max) | max lost |",
        "|---|---|---|---|---|---|",
    ]
    for (v, method), e in exact.items():
        lines.append(f"| {v} | {method} | {e['over']:.0%} | {e['ratio']:.3f} | {e['gap_min']:+.2e}, "
                     f"{e['gap_max']:+.2e} | {e['loss']:.1e} |")
    equal = all(md_ok[v] <= nb_ok[v] for v in md_ok)
    lines += [
        "",
        "The band `[0.8 D, 1.2 D]` alone bounds the notebook's own estimate by 1.2 D (row \"beta index "
        "fixed\"); the off-by-one adds to it where the token at `n2 - 1` carries mass, i.e. at small V.",
        "",
        f"Goals (issue text): single-row V = {VOCAB} >= 5x: "
        f"{'met' if base['speedup_md_big'] >= 5 and equal else 'not met'} ({base['speedup_md_big']:.2f}x); "
        f"batched >= 10x: {'met' if base['speedup_md_batch'] >= 10 and equal else 'not met'} "
        f"({base['speedup_md_batch']:.2f}x); V = 1000 single call <= 0.3 ms and faster than the notebook: "
        f"{'met' if base['md_small'] <= 3e-4 and base['speedup_md_small'] > 1 else 'not met'} "
        f"({base['md_small'] * ms:.3f} ms, {base['speedup_md_small']:.2f}x).",
    ]
    return lines


def _command(extra=""):
    """The command line that makes a section, as the section states it."""
    device = "" if DEVICE.type == "cpu" else f" --device {DEVICE.type}"
    return f"`python bench/md_core.py{device}{extra}`"


def baseline_section(repeats=5, write=True):
    """Measure the ``md_baseline`` section (``md_baseline_cuda`` on a GPU) and write it unless ``write`` is False."""
    t0 = time.perf_counter()
    lines = baseline_lines(bench_baseline(repeats))
    lines += ["", f"_Total {time.perf_counter() - t0:.0f} s; {_command()} (or with `--baseline` alone)._"]
    text = "\n".join(lines)
    if write:
        update_section(f"md_baseline{_suffix()}",
                       f"## md_baseline{_suffix()}: mdboost against the notebook's algorithm\n\n" + text)
    return text


def verify_inputs(batch, k):
    """``(draft_tokens [B, K], draft_probs [B, K, V], target_probs [B, K + 1, V])`` of the ``verify`` rows."""
    gen = torch.Generator().manual_seed(2)
    p, q = llm_like_pair(batch * (k + 1), VOCAB, torch.float32, seed=2)
    draft = p.reshape(batch, k + 1, VOCAB)[:, :k].contiguous()
    target = q.reshape(batch, k + 1, VOCAB).contiguous()
    tokens = torch.multinomial(draft.reshape(-1, VOCAB).cpu(), 1, generator=gen).reshape(batch, k).to(DEVICE)
    return tokens, draft, target


def bench_verify(batch=8, k=4, repeats=9):
    """SD and MD calls interleaved; MD/SD is the median of the per-repeat ratios."""
    tokens, draft, target = verify_inputs(batch, k)
    out = {}
    for top_k, mode in ((256, "all"), (None, "all"), (256, "needed"), (None, "needed")):
        def run(budget, top_k=top_k, mode=mode):
            verify(tokens, draft, target, max_divergence=budget, top_k=top_k, solve=mode,
                   generator=_generator(0), validate=False)

        run(0.0), run(BUDGET)  # warm-up
        sd_t, md_t = [], []
        for _ in range(repeats):
            sd_t.append(timeit(lambda: run(0.0), repeats=3, warmup=0))
            md_t.append(timeit(lambda: run(BUDGET), repeats=3, warmup=0))
        ratio = statistics.median([m / s for m, s in zip(md_t, sd_t)])
        out[top_k, mode] = (statistics.median(sd_t), statistics.median(md_t), ratio)
    return out


def bench_floor(batch=8, k=4, repeats=9):
    """The least any exact full-vocabulary solve does, next to SD's ``verify`` (one process,
    interleaved, numpy's cheapest spelling of each pass, in place, float32 pairwise sums).

    Every drafted entry must be divided, have ``g`` evaluated where its ratio lies between the
    clamps (the M set's ``D_f`` sum; a pass cannot know the clamps beforehand, so at every
    entry: for ``kl`` a ``log``, a product and a row sum: ``evaluate``), and be classified by
    where its ratio falls against the two unknown clamps, with the masses on each side summed
    (at least one comparison with one threshold and the masked row sums of ``p`` and ``q``:
    ``classify``, which a real solve needs several of, or a histogram). In numpy every
    elementwise step is its own pass over memory, so ``1 + (evaluate + classify) / SD`` bounds
    MD/SD from below for designs made of separate numpy or torch elementwise operations (an
    argument on the passes such a design must make, each timed here; a fused compiled pass is not
    bound by it). CPU only.
    """
    import numpy as np

    tokens, draft, target = verify_inputs(batch, k)
    p_np, q_np = draft.reshape(-1, VOCAB).numpy(), target[:, :k].reshape(-1, VOCAB).numpy()
    buf, inside = np.empty_like(p_np), np.empty(p_np.shape, dtype=bool)

    def sd():
        verify(tokens, draft, target, generator=_generator(0), validate=False)

    def evaluate():  # the ratio, its log, p log r summed per row
        np.divide(p_np, q_np, out=buf)
        np.log(buf, out=buf)
        np.multiply(buf, p_np, out=buf)
        buf.sum(-1)

    def classify():  # one threshold: which entries are above it, their p and q summed per row
        np.divide(p_np, q_np, out=buf)
        np.greater(buf, 1.5, out=inside)
        np.multiply(p_np, inside, out=buf)
        buf.sum(-1)
        np.multiply(q_np, inside, out=buf)
        buf.sum(-1)

    steps = (("sd", sd), ("evaluate", evaluate), ("classify", classify))
    for _, fn in steps:
        fn()
    times = {name: [] for name, _ in steps}
    for _ in range(repeats):
        for name, fn in steps:
            times[name].append(timeit(fn, repeats=3, warmup=0))
    med = {name: statistics.median(t) for name, t in times.items()}
    for name in ("evaluate", "classify"):
        med[f"{name}_ratio"] = statistics.median([x / s for x, s in zip(times[name], times["sd"])])
    med["bound"] = statistics.median([1 + (e + c) / s for e, c, s in zip(times["evaluate"], times["classify"],
                                                                           times["sd"])])
    med["shape"] = (batch, k, VOCAB)
    return med


def floor_lines(floor):
    """The rows of the full-vocabulary floor (:func:`bench_floor`)."""
    ms, (batch, k, vocab) = 1e3, floor["shape"]
    entries = batch * k * vocab
    return [
        f"| least work of an exact solve, `[{batch}, {k}, {vocab}]` full vocabulary (numpy, in place): division, "
        f"`log`, weighted row sum | {floor['evaluate'] * ms:.2f} ms | {floor['evaluate_ratio']:.2f} x SD's `verify` "
        f"({floor['sd'] * ms:.2f} ms) | |",
        f"| and one classification pass (ratio > threshold, masked row sums of `p` and `q`) | "
        f"{floor['classify'] * ms:.2f} ms ({floor['classify'] / entries * 1e9:.2f} ns an entry) | "
        f"{floor['classify_ratio']:.2f} x SD's `verify` | |",
        f"| so MD/SD of `solve=\"all\"` (every drafted position solved) for a design made of separate numpy/torch "
        f"elementwise passes (no fused pass), at least | | {floor['bound']:.2f} | (goal <= 2 above) |",
    ]


def verify_lines(ver):
    """The ``verify`` rows of the ``md_core`` table."""
    ms, lines = 1e3, []
    for (top_k, mode), (sd_t, md_t, ratio) in ver.items():
        label = "top_k=256" if top_k else "full vocabulary"
        goal = ("<= 1.2" if top_k else "<= 2") if mode == "all" else ""
        lines.append(
            f"| `verify` `[8, 4, {VOCAB}]` {label}, solve=\"{mode}\": SD {sd_t * ms:.1f} ms, MD {md_t * ms:.1f} ms | | "
            f"MD/SD {ratio:.2f} | {goal} |"
        )
    return lines


def main(write=True):
    t0, load = time.perf_counter(), os.getloadavg()[0]
    core = bench_build_and_queries()
    single = bench_single_row()
    print(baseline_section(write=write))
    ver = bench_verify()
    ms = 1e3
    lines = [
        machine_line(),
        load_line(load),
        "",
        f"Inputs: LLM-like correlated drafter/target rows, KL budget {BUDGET}. Times are medians; "
        f"ratios are medians of per-repeat ratios (the paired calls interleaved). "
        f"The notebook baseline: section `md_baseline{_suffix()}`.",
        "",
        "| measurement | time | ratio | goal |",
        "|---|---|---|---|",
        f"| `torch.sort` of `[64, {VOCAB}]` float32 | {core['sort'] * ms:.1f} ms | 1 | |",
        f"| exact KL primal, `solve` (expected linear time) | {core['linear'] * ms:.1f} ms | "
        f"{core['linear_ratio']:.3f} x sort | <= 0.25 |",
        f"| exact KL primal, sorted `Breakpoints` build + query | {core['primal'] * ms:.1f} ms | "
        f"{core['primal_ratio']:.2f} x sort | |",
        f"| `Breakpoints.build` | {core['build'] * ms:.1f} ms | {core['build'] / core['sort']:.2f} x sort | |",
        f"| dual query (`for_acceptance`) | {core['dual'] * ms:.2f} ms | {core['dual'] / core['build']:.4f} x build"
        f" | <= 0.1 |",
        f"| bound query (`for_divergence_bound`) | {core['bound'] * ms:.2f} ms | "
        f"{core['bound'] / core['build']:.4f} x build | |",
    ]
    for vocab in (50, 1000, VOCAB):
        on, off = single[vocab]
        goal = "<= 0.3 ms" if vocab == 1000 else ""
        lines.append(f"| single-row `solve`, V = {vocab} float32 | {on * ms:.3f} ms (validate=False: "
                     f"{off * ms:.3f} ms) | | {goal} |")
    lines.append(f"| `solve` per row in a batch of 64, V = {VOCAB} float32 | {single['batch'] * ms:.2f} ms | | |")
    lines += verify_lines(ver)
    if DEVICE.type == "cpu":
        lines += floor_lines(bench_floor())
    lines += ["", f"_Total benchmark time {time.perf_counter() - t0:.0f} s; {_command()}._"]
    text = "\n".join(lines)
    if write:
        update_section(f"md_core{_suffix()}", f"## md_core{_suffix()}: mentored decoding core\n\n" + text)
    print(text)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    part = ap.add_mutually_exclusive_group()
    part.add_argument("--baseline", action="store_true", help="the notebook comparison only (section 2)")
    part.add_argument("--verify", action="store_true", help="the verify rows only, printed (item 4; never written)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    ap.add_argument("--no-write", action="store_true", help="print only; bench/RESULTS.md untouched")
    return ap.parse_args(argv)


def cli(argv=None) -> int:
    global DEVICE
    args = parse_args(argv)
    try:
        DEVICE = torch.device(args.device)
    except RuntimeError as exc:
        print(f"md_core.py: --device {args.device!r}: {exc}", file=sys.stderr)
        return 2
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        print(f"md_core.py: --device {args.device}: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    if args.baseline:
        print(baseline_section(write=not args.no_write))
    elif args.verify:
        load = os.getloadavg()[0]
        ver = bench_verify()
        extra = floor_lines(bench_floor()) if DEVICE.type == "cpu" else []
        print("\n".join([machine_line(), load_line(load), ""] + verify_lines(ver) + extra))
    else:
        main(write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
