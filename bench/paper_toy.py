"""The paper's Section 5 toy study, reproduced: figures (Tables 2-6) and its claims checked numerically.

Setting: ``p`` (drafter) and ``q`` (target) uniform on the simplex (Dirichlet(1)), ``n = 100``,
nine generators: ``kl``, ``rkl``, ``hellinger``, ``neyman``, ``pearson``, ``tv``, ``tv2``,
``alpha:-1.5``, ``alpha:1.5``. ``tv2`` is **reconstructed** (the paper's Table 1 was lost in
extraction; it "replaces parts of the TV generator by steeper segments and half lines"):
``f(z) = max(|z - 1| / 2, 3 |z - 1| / 2 - 1 / 2)``, i.e. TV's slopes ``±1/2`` for
``|z - 1| <= 1/2`` and ``±3/2`` beyond (convex, ``f(1) = 0``, not differentiable at 1).

Figures (``docs/img/paper/``; read with ``docs/paper.md``):

- ``curve.png`` (Table 2): left, the curve of ``(a, b)`` in C(p, q); right, the budget ``D`` as a
  function of the optimal acceptance ``P_acc(MD)``, per generator;
- ``bound_band.png`` (Table 3): ``D`` and the Theorem 3.12 band (lower and upper bounds) from
  ``P_acc(SD)`` to ``1.25 P_acc(SD)``;
- ``d_and_p_vs_ab.png`` (Table 4): ``D`` and ``P_acc`` against ``a`` and against ``b``;
- ``k.png`` (Table 5): ``k = sqrt((1+a)/(1-b))`` against ``P_acc`` and against ``a``;
- ``beta.png`` (Table 6): ``n = 1000``, ``p``, ``q`` discretized Beta densities, indices sorted by
  ``q_i / p_i``, the mentored distribution for ``b = 0, 0.1, ..., 1`` and the acceptance area
  ``min(pi, p)`` (KL; the curve is the same for every strictly convex ``f``, Theorem 3.13).

Claims checked and printed (section ``paper_toy`` of ``bench/RESULTS.md``):

1. for every generator differentiable at 1 the right-derivative of ``D(P)`` at ``P_acc(SD)`` is 0
   (finite differences ``D(P_SD + h) / h`` for ``h = 1e-2 ... 1e-5`` go to 0; for ``tv`` and
   ``tv2`` they stay at a positive slope) and ``+10%`` acceptance (``P = 1.1 P_acc(SD)``, relative)
   costs a small ``D`` (reported);
2. ``k`` stays near 1 at ``+10%`` (reported);
3. ``k`` is near-linear in ``a`` (``R^2`` of a least-squares line over ``[P_SD, 1.25 P_SD]``).

``--drafter-cache DIR --target-cache DIR`` draws the same figures (suffix ``_real``) for one
position of a real pair read from two existing member caches over the same text
(``mdboost.cache.LogitCache``, model members; no model is run): the position with the median SD
acceptance, on the pair's common support (the top-k union plus one tail bucket; coordinates with equal ratios
merge exactly, ``docs/theory.md`` section 4).

Run: ``.venv/bin/python bench/paper_toy.py [--drafter-cache DIR --target-cache DIR]``
(a few seconds; one thread).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._results import machine_line, update_section  # noqa: E402
from mdboost.md.divergences import Divergence, f_divergence, resolve  # noqa: E402
from mdboost.md.solve import mentored_distribution, solve  # noqa: E402

IMG = Path(__file__).resolve().parents[1] / "docs" / "img" / "paper"
GRID = 400


def _tv2(z: torch.Tensor) -> torch.Tensor:
    d = (z - 1).abs()
    return torch.maximum(d / 2, 1.5 * d - 0.5)


TV2 = Divergence("tv2", _tv2, fprime_one=0.0, inf_slope=1.5, standardize=False)
GENERATORS = {name: resolve(name) for name in ("kl", "rkl", "hellinger", "neyman", "pearson", "tv")}
GENERATORS["tv2"] = TV2
GENERATORS.update({name: resolve(name) for name in ("alpha:-1.5", "alpha:1.5")})
SMOOTH = [n for n in GENERATORS if n not in ("tv", "tv2")]  # differentiable at 1


def toy_pair(n: int = 100, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``p``, ``q`` uniform on the simplex (Dirichlet(1)), float64."""
    rng = np.random.default_rng(seed)
    return tuple(torch.tensor(rng.dirichlet(np.ones(n)), dtype=torch.float64) for _ in range(2))


def beta_pair(n: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    """``p`` ~ Beta(2, 5), ``q`` ~ Beta(4, 3) densities on ``n`` midpoints, normalized."""
    from scipy.stats import beta

    x = (np.arange(n) + 0.5) / n
    p, q = beta.pdf(x, 2, 5), beta.pdf(x, 4, 3)
    return torch.tensor(p / p.sum()), torch.tensor(q / q.sum())


def curve(p: torch.Tensor, q: torch.Tensor, acceptances: torch.Tensor) -> dict:
    """The dual solution at each acceptance (the curve is f-independent): a, b, P_acc, pi [G, V],
    D per generator and the Theorem 3.12 band."""
    g = acceptances.numel()
    sol = solve(p.expand(g, -1), q.expand(g, -1), min_acceptance=acceptances)
    pi = mentored_distribution(p.expand(g, -1), q.expand(g, -1), sol.a, sol.b)
    out = {"a": sol.a.numpy(), "b": sol.b.numpy(), "acceptance": sol.acceptance.numpy(), "pi": pi,
           "k": sol.boost_coefficient.numpy(), "D": {}, "lower": {}, "upper": {}}
    r = (p / q).expand(g, -1)
    in_a = r > (1 + sol.a)[:, None]
    in_b = r < (1 - sol.b)[:, None]
    q_a, q_b = (q * in_a).sum(-1), (q * in_b).sum(-1)
    q_m = 1 - q_a - q_b
    for name, div in GENERATORS.items():
        out["D"][name] = f_divergence(pi, q.expand(g, -1), div, validate=False).numpy()
        ga, gb = div.g(1 + sol.a), div.g(1 - sol.b)
        low = ga * q_a + gb * q_b
        out["lower"][name] = low.numpy()
        out["upper"][name] = (low + q_m * torch.maximum(ga, gb)).numpy()
    return out


def claims(p: torch.Tensor, q: torch.Tensor) -> dict:
    """The numbers behind the paper's claims (module docstring)."""
    sd = float(torch.minimum(p, q).sum())
    top = float(solve(p, q, max_divergence=math.inf).acceptance)
    steps = [1e-2, 1e-3, 1e-4, 1e-5]
    fd = curve(p, q, torch.tensor([sd + h for h in steps], dtype=torch.float64))
    plus10 = curve(p, q, torch.tensor([min(1.1 * sd, top)], dtype=torch.float64))
    span = curve(p, q, torch.linspace(sd, min(1.25 * sd, top), 200, dtype=torch.float64))
    a, k = span["a"], span["k"]
    fit = np.polyfit(a, k, 1)
    resid = k - np.polyval(fit, a)
    r2 = 1 - float(np.sum(resid ** 2) / np.sum((k - k.mean()) ** 2))
    return {"sd": sd, "max": top, "steps": steps,
            "slopes": {n: [float(d) / h for d, h in zip(fd["D"][n], steps)] for n in GENERATORS},
            "d_plus10": {n: float(plus10["D"][n][0]) for n in GENERATORS}, "k_plus10": float(plus10["k"][0]),
            "a_plus10": float(plus10["a"][0]), "b_plus10": float(plus10["b"][0]), "r2": r2,
            "k_slope": float(fit[0])}


def _plots(p, q, out: Path, suffix=""):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    sd = float(torch.minimum(p, q).sum())
    top = float(solve(p, q, max_divergence=math.inf).acceptance)
    full = curve(p, q, torch.linspace(sd, top, GRID, dtype=torch.float64))
    band = curve(p, q, torch.linspace(sd, min(1.25 * sd, top), GRID, dtype=torch.float64))
    names = list(GENERATORS)
    written = []

    def save(fig, name):
        path = out / f"{name}{suffix}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    ax[0].plot(full["a"], full["b"], color="purple")
    ax[0].set(xlabel="a", ylabel="b", title="C(p, q): (a, b) from the dual query (Lemma 5.3)")
    for n in names:
        ax[1].plot(full["acceptance"], full["D"][n], label=n)
    ax[1].axvline(sd, color="red", ls=":", lw=1)
    ax[1].set(xlabel="P_acc(MD)", ylabel="D", yscale="symlog", title="budget D against the optimal acceptance")
    ax[1].set_yscale("symlog", linthresh=1e-3)
    ax[1].set_ylim(bottom=0)
    ax[1].legend(fontsize=7)
    save(fig, "curve")

    fig, axes = plt.subplots(3, 3, figsize=(12, 9), sharex=True)
    for axis, n in zip(axes.flat, names):
        x = band["acceptance"]
        axis.fill_between(x, band["lower"][n], band["upper"][n], color="green", alpha=0.3, label="Thm 3.12 band")
        axis.plot(x, band["D"][n], color="black", lw=1, label="D")
        axis.plot([sd], [0], "o", color="red")
        axis.set_title(n, fontsize=9)
    axes.flat[0].legend(fontsize=7)
    for axis in axes[-1]:
        axis.set_xlabel("P_acc(MD)")
    save(fig, "bound_band")

    fig, ax = plt.subplots(2, 2, figsize=(11, 7))
    for n in names:
        ax[0, 0].plot(full["a"], full["D"][n], label=n)
        ax[0, 1].plot(full["b"], full["D"][n], label=n)
    for axis, x in ((ax[0, 0], "a"), (ax[0, 1], "b")):
        axis.set(xlabel=x, ylabel="D")
        axis.set_yscale("symlog", linthresh=1e-3)
        axis.set_ylim(bottom=0)
    ax[0, 0].legend(fontsize=7)
    ax[1, 0].plot(full["a"], full["acceptance"], color="purple")
    ax[1, 1].plot(full["b"], full["acceptance"], color="purple")
    ax[1, 0].set(xlabel="a", ylabel="P_acc(MD)")
    ax[1, 1].set(xlabel="b", ylabel="P_acc(MD)")
    save(fig, "d_and_p_vs_ab")

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    ax[0].plot(band["acceptance"], band["k"], color="purple")
    ax[0].axvline(1.1 * sd, color="gray", ls=":", lw=1, label="+10%")
    ax[0].set(xlabel="P_acc(MD)", ylabel="k = sqrt((1+a)/(1-b))", title="k against acceptance")
    ax[0].legend(fontsize=7)
    ax[1].plot(band["a"], band["k"], color="purple")
    ax[1].set(xlabel="a", ylabel="k", title="k against a")
    save(fig, "k")
    return written


def _beta_plot(out: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p, q = beta_pair()
    order = torch.argsort(q / p)
    p, q = p[order], q[order]
    fig, axes = plt.subplots(3, 4, figsize=(14, 8), sharex=True, sharey=True)
    x = np.arange(p.numel())
    for axis, bval in zip(axes.flat, [i / 10 for i in range(11)]):
        m = float(((1 - bval) * q - p).clamp(min=0).sum())  # F(b): the point of C(p, q) with this b
        sol = solve(p, q, min_acceptance=1 - m)
        pi = mentored_distribution(p, q, sol.a, sol.b)
        axis.fill_between(x, torch.minimum(pi, p).numpy(), color="purple", alpha=0.35)
        axis.plot(x, p.numpy(), color="blue", lw=0.7)
        axis.plot(x, q.numpy(), color="red", lw=0.7)
        axis.plot(x, pi.numpy(), color="purple", lw=2)
        axis.set_title(f"b = {bval:.1f} ({float(sol.acceptance):.3f})", fontsize=9)
    axes.flat[-1].axis("off")
    fig.tight_layout()
    path = out / "beta.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def real_pair(drafter_cache: str, target_cache: str, temperature: float = 1.0, drafter: str | None = None,
              target: str | None = None):
    """One position of a real pair from two existing member caches (module docstring): ``p``,
    ``q`` on the common support (float64), the members and the row used."""
    from mdboost.cache.reader import LogitCache
    from mdboost.ranking.support import align_topk

    d, t = LogitCache.open(drafter_cache), LogitCache.open(target_cache)
    if d.num_rows != t.num_rows or not torch.equal(d.true_tokens(), t.true_tokens()):
        raise ValueError(f"{drafter_cache} and {target_cache} do not cover the same text (rows differ)")
    names = drafter or d.members[0], target or t.members[0]
    (di, dp, dt), (ti, tp, tt) = (c.kept_probs(m, temperature=temperature, tail="uniform") for c, m in zip((d, t), names))
    al = align_topk(di, dp.double().log(), dt.double(), ti, tp.double().log(), tt.double(), t.vocab_size)
    p_all, q_all = al.p_mass, al.q_mass
    acc = torch.minimum(p_all, q_all).sum(-1)
    rows = torch.nonzero(acc < 1 - 1e-6).flatten()
    if not rows.numel():
        raise ValueError(f"no position of {names[0]!r} / {names[1]!r} has p != q")
    row = int(rows[torch.argsort(acc[rows])[rows.numel() // 2]])
    keep = (p_all[row] > 0) | (q_all[row] > 0)
    p, q = p_all[row][keep], q_all[row][keep]
    return p / p.sum(), q / q.sum(), names, row


def _markdown(c: dict, label: str) -> str:
    lines = [f"**{label}**: P_acc(SD) = {c['sd']:.4f}, largest acceptance {c['max']:.4f}.", "",
             "| generator | D(P_SD+h)/h, h = " + ", ".join(f"{h:g}" for h in c["steps"]) + " | D at +10% |",
             "|---|---|---|"]
    for n in GENERATORS:
        slopes = ", ".join(f"{s:.3g}" for s in c["slopes"][n])
        lines.append(f"| {n}{'' if n in SMOOTH else ' (not differentiable at 1)'} | {slopes} | {c['d_plus10'][n]:.3g} |")
    lines += ["", f"At +10% acceptance (P = 1.1 P_acc(SD)): a = {c['a_plus10']:.4f}, b = {c['b_plus10']:.4f}, "
                  f"k = {c['k_plus10']:.4f}. k against a over [P_SD, 1.25 P_SD]: slope {c['k_slope']:.3f}, "
                  f"R^2 = {c['r2']:.5f}."]
    return "\n".join(lines)


def _verdict(c: dict) -> list[str]:
    """Pass/fail of each claim (printed)."""
    out = []
    for n in SMOOTH:
        s = c["slopes"][n]
        out.append(f"{n}: right-derivative -> 0: {s[-1] < 1e-3 and s[-1] < s[0]}")
    for n in ("tv", "tv2"):
        out.append(f"{n}: right-derivative stays positive: {c['slopes'][n][-1] > 0.1}")
    gain = 0.1  # relative acceptance gain of the +10% point
    out.append(f"k at +10% acceptance: {c['k_plus10']:.4f} (k - 1 = {c['k_plus10'] - 1:.3f} for a relative "
               f"acceptance gain of {gain:g})")
    out.append(f"k near-linear in a: {c['r2'] > 0.99} (R^2 = {c['r2']:.5f})")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drafter-cache", help="an existing member cache folder of the drafter (real pair)")
    parser.add_argument("--target-cache", help="the target's member cache folder over the same text")
    parser.add_argument("--temperature", type=float, default=1.0, help="of the real pair (one the caches store)")
    parser.add_argument("--drafter", help="drafter member name (default: the drafter cache's first member)")
    parser.add_argument("--target", help="target member name (default: the target cache's first member)")
    parser.add_argument("--out", default=str(IMG), help="folder of the figures (default docs/img/paper)")
    parser.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md")
    args = parser.parse_args(argv)
    if bool(args.drafter_cache) != bool(args.target_cache):
        parser.error("give both --drafter-cache and --target-cache, or neither")
    torch.set_num_threads(1)
    p, q = toy_pair(seed=args.seed)
    toy = claims(p, q)
    out = Path(args.out)
    written = _plots(p, q, out) + [_beta_plot(out)]
    sections = [machine_line(), "", "Command: `.venv/bin/python bench/paper_toy.py`"
                + (f" `--drafter-cache {args.drafter_cache} --target-cache {args.target_cache}`"
                   if args.drafter_cache else ""),
                "", _markdown(toy, f"toy pair (n = 100, Dirichlet(1), seed {args.seed})")]
    print(_markdown(toy, "toy pair"))
    print("\n".join(_verdict(toy)))
    if args.drafter_cache:
        try:
            rp, rq, names, row = real_pair(args.drafter_cache, args.target_cache, args.temperature, args.drafter,
                                           args.target)
        except (OSError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        real = claims(rp, rq)
        written += _plots(rp, rq, out, suffix="_real")
        label = (f"real pair {names[0]} -> {names[1]} at temperature {args.temperature:g} "
                 f"(cache row {row}, {rp.numel()} support slots)")
        sections += ["", _markdown(real, label)]
        print(_markdown(real, label))
        print("\n".join(_verdict(real)))
    for path in written:
        print("wrote", path)
    if not args.no_results:
        update_section("paper_toy", "## paper_toy\n\n" + "\n".join(sections))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
