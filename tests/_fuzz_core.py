"""A seeded fuzz harness over the mentored decoding core and the estimator's pool mode.

Shared by ``tests/test_fuzz_core.py`` (a fixed seed and a time budget in the fast suite) and
``bench/fuzz_core.py`` (the large run whose counts go to ``bench/RESULTS.md``). Each case draws
one call of a public entry point (``solve``, ``Breakpoints``, ``curve``, ``verify``,
``f_divergence``, ``mentored_distribution``, ``logits_to_probs``, the pool-mode estimator) on
inputs across the whole float range: subnormal and near-overflow entries, exact zeros (also -0.0), one-hot
rows, LLM-like logits at low temperature, empty batch dimensions, inputs that require grad,
and half-precision inputs; or a malformed version of such a call (one argument spoiled).

Outcomes, counted per kind (the goal is 0 of each) against the numerical contract of
``docs/theory.md`` ("The numerical contract", :mod:`mdboost.md.contract`):

- ``bad_exception``: an exception other than ValueError/TypeError, a ValueError/TypeError whose
  message does not name the spoiled argument, or a malformed call that raised nothing;
- ``nan``: a NaN output on valid input;
- ``violation``: a contract violation on valid input (valid input rejected, pi not summing to
  1, divergence above the budget, exact acceptance below the bound's, a negative output, ...).

The budget is checked twice for every primal point: the divergence the solver reports, and
``D_f(pi(a, b) || q)`` recomputed in float64 at the returned ``(a, b)`` (in their output dtype)
on the rows as solved (:func:`_solved_rows`: rescaled to sum 1), the low-precision contract of
:mod:`mdboost.md.contract`. ``verify``'s ``sd_acceptance`` is checked against ``1 - TV`` of those
rows. Every :func:`run` starts with the fixed regression cases (:data:`REGRESSIONS`,
:data:`MALFORMED_REGRESSIONS`): inputs earlier fuzz runs found, kept as they were found.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from mdboost.md import contract
from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import f_divergence
from mdboost.md.probs import logits_to_probs
from mdboost.md._checks import compute_dtype
from mdboost.md.solve import _rows64, _solve, acceptance_probability, mentored_distribution, solve
from mdboost.md.verify import PLACEHOLDER_TOKEN_ID, verify

DIVS = ("kl", "rkl", "hellinger", "pearson", "neyman", "tv", "js", "alpha:-1.5", "alpha:2", "alpha:-3")
TINY = (5e-324, 1e-320, 1e-310, 1e-300, 1e-200, 1e-60, 2e-49, 1e-45, 1e-40, 1e-38, 1e-30, 1e-25, 3e-14, 1e-9)
KINDS = ("bad_exception", "nan", "violation")


@dataclass
class Report:
    """Counts of one fuzz run."""

    cases: Counter = field(default_factory=Counter)  # per api (valid and malformed)
    malformed: int = 0
    failures: dict = field(default_factory=lambda: {k: [] for k in KINDS})
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.cases.values())

    def count(self, kind: str) -> int:
        return len(self.failures[kind])

    def add(self, kind, api, desc, msg):
        self.failures[kind].append((api, desc, msg))


class _Fail(Exception):
    def __init__(self, kind, msg):
        super().__init__(msg)
        self.kind = kind


def _check(cond, msg, kind="violation"):
    """Raise a failure of ``kind`` unless ``cond``; ``msg`` may be a callable (built on failure only)."""
    if not bool(cond):
        raise _Fail(kind, msg() if callable(msg) else msg)


def _no_nan(name, *tensors):
    for t in tensors:
        if torch.is_tensor(t) and t.is_floating_point() and torch.isnan(t).any():
            raise _Fail("nan", f"{name} has NaN")


# ---------------------------------------------------------------------------- inputs
def _row(rng, v):
    """One float64 probability row of length v across the float range."""
    kind = rng.choice(["dirichlet", "logits", "onehot", "tiny", "zeros"], p=[0.3, 0.3, 0.1, 0.2, 0.1])
    if kind == "onehot":
        x = np.zeros(v)
        x[rng.integers(v)] = 1.0
        return x
    if kind == "logits":  # LLM-like logits at a (low) temperature; float64 softmax reaches 1e-300
        t = rng.choice([1e-3, 0.01, 0.05, 0.1, 0.3, 1.0, 2.0])
        z = rng.standard_normal(v) * rng.choice([1.0, 3.0, 8.0]) / t
        z -= z.max()
        x = np.exp(z)
        return x / x.sum()
    x = rng.dirichlet(np.full(v, rng.choice([0.05, 0.3, 1.0, 5.0])))
    if kind == "tiny" and v > 1:
        idx = rng.choice(v, size=rng.integers(1, v), replace=False)
        x[idx] = rng.choice(TINY, size=idx.size)
    if kind == "zeros" and v > 1:
        idx = rng.choice(v, size=rng.integers(1, v), replace=False)
        x[idx] = -0.0 if idx.size % 2 else 0.0  # a negative zero is a zero too (no extra draw)
    if x.sum() == 0:
        x[rng.integers(v)] = 1.0
    return x / x.sum()


def _pair_rows(rng, n, v):
    p = np.stack([_row(rng, v) for _ in range(n)]) if n else np.zeros((0, v))
    mode = rng.choice(["indep", "equal", "near"], p=[0.8, 0.1, 0.1])
    if mode == "indep":
        q = np.stack([_row(rng, v) for _ in range(n)]) if n else np.zeros((0, v))
    elif mode == "equal":
        q = p.copy()
    else:
        q = p * np.exp(rng.standard_normal(p.shape) * 1e-3)
        q /= np.maximum(q.sum(-1, keepdims=True), 1e-300)
    return p, q


def _tensor(x, dtype, grad):
    t = torch.from_numpy(np.ascontiguousarray(x)).to(dtype)
    if dtype in (torch.float16, torch.bfloat16, torch.float32):  # re-normalise in the low dtype
        t = t.double()
        t = (t / t.sum(-1, keepdim=True).clamp_min(1e-300)).to(dtype)
    return t.requires_grad_(True) if grad else t


def _batch_shape(rng):
    return [(), (3,), (2, 2), (0,), (3, 0), (1,)][rng.choice(6, p=[0.25, 0.35, 0.15, 0.08, 0.07, 0.1])]


def _vocab(rng):
    return int(rng.choice([1, 2, 3, 4, 7, 16, 50, 300, 2100], p=[0.04, 0.16, 0.14, 0.12, 0.14, 0.14, 0.12, 0.1, 0.04]))


def _pair(rng, dtype, shape=None, v=None):
    shape = _batch_shape(rng) if shape is None else shape
    v = _vocab(rng) if v is None else v
    n = int(np.prod(shape)) if shape else 1
    p, q = _pair_rows(rng, n, v)
    grad = rng.random() < 0.08
    return (_tensor(p.reshape(*shape, v), dtype, grad), _tensor(q.reshape(*shape, v), dtype, grad), shape)


def _budget(rng, shape, upper=None):
    pick = rng.choice(["zero", "tiny", "small", "mid", "big", "inf", "tensor"], p=[0.08, 0.12, 0.2, 0.25, 0.1, 0.05, 0.2])
    if upper is not None:  # an acceptance target in [0, 1]
        vals = [0.0, 1e-9, 0.3, 0.9, 0.999999, 1.0]
        if pick == "tensor":
            return torch.tensor(rng.choice(vals, size=shape), dtype=torch.float64)
        return float(rng.choice(vals))
    scale = {"zero": 0.0, "tiny": 10.0 ** rng.uniform(-22, -10), "small": 10.0 ** rng.uniform(-6, -2),
             "mid": rng.uniform(0.01, 1.0), "big": 10.0 ** rng.uniform(0, 4), "inf": math.inf}
    if pick == "tensor":
        return torch.tensor(10.0 ** rng.uniform(-8, 1, size=shape), dtype=torch.float64)
    return float(scale[pick])


def _dtype(rng, base):
    if rng.random() < 0.08:
        return [torch.float16, torch.bfloat16][rng.integers(2)]
    return base


# ---------------------------------------------------------------------------- contract checks
def _d64(p, q):
    return p.detach().double(), q.detach().double()


def _check_point(name, p, q, a, b, acc, dtype):
    """(a, b) with its acceptance is a point of the curve within the contract."""
    tol = contract.tolerance(dtype)
    _no_nan(name, a, b, acc)
    _check((a >= 0).all() and (b >= 0).all() and (b <= 1).all(), f"{name}: a, b out of range")
    _check(((acc >= 0) & (acc <= 1)).all(), f"{name}: acceptance outside [0, 1]")
    if a.numel() == 0:
        return
    p64, q64 = _d64(p, q)
    dev = (p64.sum(-1) - 1).abs() + (q64.sum(-1) - 1).abs()
    # pi in the compute dtype of the inputs (the dtype's own overflow rule), summed in float64
    pi = mentored_distribution(p.detach(), q.detach(), a.detach(), b.detach(), validate=False).double()
    _no_nan(name + " pi", pi)
    err = (pi.sum(-1) - 1).abs()
    _check((err <= tol.sum + dev).all(), lambda: f"{name}: pi sums to 1 +- {float(err.max()):.3g}")
    got = acceptance_probability(p64, pi, validate=False)
    _check(((got - acc.detach().double()).abs() <= tol.sum + dev).all(),
           lambda: f"{name}: P_acc(pi) {got.flatten()[:3].tolist()} != acceptance {acc.flatten()[:3].tolist()}")


def _check_divergence(name, value, budget, dtype):
    tol = contract.tolerance(dtype)
    _no_nan(name, value)
    _check((value >= 0).all(), lambda: f"{name}: negative divergence {float(value.min()):.3g}")
    b = torch.as_tensor(budget, dtype=torch.float64)
    bad = value.detach().double() > b * (1 + tol.divergence_rel) + tol.divergence_abs
    _check(not bad.any(), f"{name}: divergence above the budget")


def _solved_rows(p, q):  # [..., V] x2 -> float64 [..., V] x2
    """The rows as the solvers read them: in the compute dtype (its overflow rule: a ratio
    ``p_i / q_i`` beyond its range counts as ``q_i = 0``), then rescaled to sum 1 in float64."""
    dtype = compute_dtype(torch.promote_types(p.dtype, q.dtype))
    return _rows64(p.detach().to(dtype), q.detach().to(dtype), True)


def _check_budget_kept(name, p, q, a, b, budget, div, dtype):
    """The returned ``(a, b)`` themselves respect the budget: ``D_f(pi(a, b) || q)`` on the rows as
    solved (:func:`_solved_rows`), ``pi`` evaluated in float64 at ``(a, b)`` in their output dtype."""
    if a.numel() == 0:
        return
    p64, q64 = _solved_rows(p, q)
    pi = mentored_distribution(p64, q64, a.detach().double(), b.detach().double(), validate=False)
    d = f_divergence(pi, q64, div, validate=False)
    _check_divergence(f"{name}: D_f(pi(a, b) || q) {float(d.max()):.6g} ({div})", d, budget, dtype)


def _routed(routing, p, q, value, dual: bool, div):
    """``solve`` of the exact primal (dual) with the ``route=`` / ``namespace=`` arguments of
    ``mdboost.md.solve._solve`` that ``routing(p, q, value, dual, div)`` returns (a dict);
    ``routing`` None: ``solve`` itself."""
    kwargs = dict(min_acceptance=value) if dual else dict(max_divergence=value)
    if routing is None:
        return solve(p, q, divergence=div, **kwargs)
    return _solve(p, q, divergence=div, **routing(p, q, value, dual, div), **kwargs)


def _case_solve(rng, dtype, routing=None):
    dtype = _dtype(rng, dtype)
    p, q, shape = _pair(rng, dtype)
    div = str(rng.choice(DIVS))
    if rng.random() < 0.2:
        target = _budget(rng, shape, upper=1.0)
        sol = _routed(routing, p, q, target, True, div)
        _check_point("solve dual", p, q, sol.a, sol.b, sol.acceptance, dtype)
        tol = contract.tolerance(dtype)
        bp = Breakpoints.build(p, q)
        want = torch.minimum(torch.as_tensor(target, dtype=torch.float64), bp.max_acceptance.double())
        _check((sol.acceptance.double() >= want - tol.sum).all(), "solve dual: acceptance below the target")
        _no_nan("solve dual", sol.achieved_divergence)
        return
    _check_primal(p, q, _budget(rng, shape), div, dtype, routing)


def _check_primal(p, q, budget, div, dtype, routing=None):
    """The primal ``solve`` (exact and bound) at ``budget`` within the contract."""
    exact = _routed(routing, p, q, budget, False, div)
    bound = solve(p, q, max_divergence=budget, divergence=div, mode="bound")
    tol = contract.tolerance(dtype)
    for mode, sol in (("exact", exact), ("bound", bound)):
        _check_point(f"solve {mode}", p, q, sol.a, sol.b, sol.acceptance, dtype)
        _check_divergence(f"solve {mode} achieved", sol.achieved_divergence, budget, dtype)
        _check_budget_kept(f"solve {mode}", p, q, sol.a, sol.b, budget, div, dtype)
        _check((sol.acceptance.double() >= sol.sd_acceptance.double() - tol.sum).all(), f"solve {mode}: below SD")
        _check(not sol.acceptance.requires_grad, f"solve {mode}: output requires grad")
    _check((exact.acceptance.double() >= bound.acceptance.double() - tol.sum).all(), "exact acceptance < bound")


def _case_breakpoints(rng, dtype):
    dtype = _dtype(rng, dtype)
    p, q, shape = _pair(rng, dtype)
    div = str(rng.choice(DIVS))
    bp = Breakpoints.build(p, q)
    tol = contract.tolerance(dtype)
    sd, top = bp.sd_acceptance, bp.max_acceptance
    _no_nan("sd/max acceptance", sd, top)
    _check((sd <= top + tol.sum).all(), "sd_acceptance > max_acceptance")
    _check(((sd >= 0) & (top <= 1)).all(), "sd/max acceptance outside [0, 1]")
    what = rng.choice(["dual", "exact", "bound", "value", "at", "curve"])
    if what == "dual":
        pt = bp.for_acceptance(_budget(rng, shape, upper=1.0))
        _check_point("for_acceptance", p, q, pt.a, pt.b, pt.acceptance, dtype)
    elif what in ("exact", "bound", "value"):
        budget = _budget(rng, shape)
        if what == "value":
            pt, value = bp.for_divergence_with_value(budget, div)
            _check_divergence("for_divergence_with_value", value, budget, dtype)
        else:
            pt = (bp.for_divergence if what == "exact" else bp.for_divergence_bound)(budget, div)
        _check_point(f"for_divergence {what}", p, q, pt.a, pt.b, pt.acceptance, dtype)
        _check_budget_kept(f"for_divergence {what}", p, q, pt.a, pt.b, budget, div, dtype)
    elif what == "at":
        acc = _budget(rng, shape, upper=1.0)
        _check_divergence("divergence_at", bp.divergence_at(acc, div), math.inf, dtype)
        _check_divergence("divergence_at bound", bp.divergence_at(acc, div, bound=True), math.inf, dtype)
    else:
        cp = bp.curve()
        _check(cp.a.shape == tuple(shape) + (2 * p.shape[-1] + 1,), "curve: shape")
        valid = ~torch.isnan(cp.acceptance)
        _check(torch.equal(valid, ~torch.isnan(cp.a)) and torch.equal(valid, ~torch.isnan(cp.b)), "curve: NaN slots differ")
        _check(valid[..., 0].all() if valid.numel() else True, "curve: no start point")
        acc = torch.where(valid, cp.acceptance.double(), 2.0)
        _check((acc.diff(dim=-1)[valid[..., 1:]] >= -tol.sum).all(), "curve: acceptance decreases")
        pts = torch.where(valid, cp.a.double(), 0.0), torch.where(valid, cp.b.double(), 0.0)
        pd, qd = p.detach(), q.detach()  # in their own dtype (its overflow rule)
        pe, qe = pd.unsqueeze(-2).expand(cp.a.shape + p.shape[-1:]), qd.unsqueeze(-2).expand(cp.a.shape + p.shape[-1:])
        fill = acceptance_probability(pe, mentored_distribution(pe, qe, pts[0], pts[1], validate=False),
                                      validate=False).double()
        _check_point("curve", pe, qe, pts[0], pts[1], torch.where(valid, cp.acceptance.double(), fill.clamp(0, 1)), dtype)


def _case_verify(rng, dtype):
    dtype = _dtype(rng, dtype) if rng.random() < 0.5 else dtype
    batch, k, v = int(rng.choice([0, 1, 3])), int(rng.choice([0, 1, 3])), _vocab(rng)
    p, _, _ = _pair(rng, dtype, (batch, k), v)
    q_rows = np.stack([_row(rng, v) for _ in range(batch * (k + 1))]) if batch else np.zeros((0, v))
    q = _tensor(q_rows.reshape(batch, k + 1, v), dtype, rng.random() < 0.1)
    pd = p.detach().double().reshape(-1, v)
    tokens = (torch.multinomial(pd, 1, generator=torch.Generator().manual_seed(int(rng.integers(1 << 30))))
              .reshape(batch, k) if pd.shape[0] else torch.zeros((batch, k), dtype=torch.long))
    div = str(rng.choice(DIVS))
    kwargs = dict(divergence=div, solve=str(rng.choice(["all", "reached", "needed"])),
                  generator=torch.Generator().manual_seed(int(rng.integers(1 << 30))))
    if rng.random() < 0.3:
        kwargs["top_k"] = int(rng.choice([1, 2, 5, 1000]))
    dual = rng.random() < 0.2
    budget = _budget(rng, (batch, k), upper=1.0 if dual else None)
    kwargs["min_acceptance" if dual else "max_divergence"] = budget
    _check_verify(tokens, p, q, kwargs, dtype)


def _check_verify(tokens, p, q, kwargs, dtype):
    """``verify(tokens, p, q, **kwargs)`` within the contract (p [B, K, V], q [B, K + 1, V])."""
    (batch, k, v), div = p.shape, kwargs.get("divergence", "kl")
    dual = "min_acceptance" in kwargs
    budget = kwargs["min_acceptance" if dual else "max_divergence"]
    res = verify(tokens, p, q, **kwargs)
    _check(res.tokens.shape == (batch, k + 1) and res.num_accepted.shape == (batch,), "verify: shapes")
    if batch:
        _check(((res.num_accepted >= 0) & (res.num_accepted <= k)).all(), "verify: num_accepted range")
        first = res.tokens.gather(1, res.num_accepted.unsqueeze(1))
        _check(((first >= 0) & (first < v)).all(), "verify: emitted token out of range")
        after = torch.arange(k + 1) > res.num_accepted.unsqueeze(1)
        _check((res.tokens[after] == PLACEHOLDER_TOKEN_ID).all(), "verify: padding")
    tol = contract.tolerance(dtype)
    lazy = kwargs.get("solve", "all") != "all"
    solved = ~torch.isnan(res.a) if lazy else torch.ones_like(res.a, dtype=torch.bool)
    if not lazy:
        _no_nan("verify stats", res.a, res.b, res.acceptance_probability, res.divergence)
    _no_nan("verify sd_acceptance", res.sd_acceptance)
    _check(((res.sd_acceptance >= 0) & (res.sd_acceptance <= 1)).all(), "verify: sd_acceptance outside [0, 1]")
    if "top_k" not in kwargs and batch and k:  # 1 - TV of the rows as solved (rescaled to sum 1 in float64)
        p64, q64 = (x.detach().double() for x in (p, q[:, :k]))
        want = torch.minimum(p64 / p64.sum(-1, keepdim=True), q64 / q64.sum(-1, keepdim=True)).sum(-1)
        _check(((res.sd_acceptance.double() - want).abs() <= tol.sum).all(),
               lambda: f"verify: sd_acceptance {float(res.sd_acceptance.max()):.6g} != 1 - TV {float(want.max()):.6g}")
    acc, sd = res.acceptance_probability[solved].double(), res.sd_acceptance[solved].double()
    dev = ((p.detach().double().sum(-1) - 1).abs() + (q.detach().double()[:, :k].sum(-1) - 1).abs())[solved]
    _check(((acc >= 0) & (acc <= 1)).all() and (acc >= sd - tol.sum - dev).all(), "verify: acceptance outside [sd, 1]")
    if not dual:
        b = torch.as_tensor(budget, dtype=torch.float64).expand(batch, k)[solved] if k and batch else 0.0
        _check_divergence("verify divergence", res.divergence[solved], b, dtype)
        if batch and k and "top_k" not in kwargs:  # the clamps of the full rows (top_k solves on restricted ones)
            zero = torch.zeros((), dtype=res.a.dtype)
            a0, b0 = torch.where(solved, res.a, zero), torch.where(solved, res.b, zero)
            budgets = torch.as_tensor(budget, dtype=torch.float64).expand(batch, k)
            _check_budget_kept("verify", p, q[:, :k], a0, b0, budgets, div, dtype)


def _case_f_divergence(rng, dtype):
    dtype = _dtype(rng, dtype)
    p, q, _ = _pair(rng, dtype)
    d = f_divergence(p, q, str(rng.choice(DIVS)))
    _no_nan("f_divergence", d)
    _check((d >= 0).all(), "f_divergence: negative")


def _case_mentored(rng, dtype):
    p, q, shape = _pair(rng, dtype)
    a = torch.tensor(10.0 ** rng.uniform(-12, 40, size=shape), dtype=torch.float64) * (rng.random() < 0.9)
    b = torch.tensor(rng.choice([0.0, 1e-12, 0.5, 1 - 1e-12, 1.0], size=shape), dtype=torch.float64)
    pi = mentored_distribution(p, q, a, b)
    _no_nan("mentored_distribution", pi)
    _check((pi >= 0).all(), "mentored_distribution: negative")


def _case_logits(rng, dtype):
    dtype = _dtype(rng, dtype)
    shape, v = _batch_shape(rng), _vocab(rng)
    z = torch.from_numpy(rng.standard_normal(tuple(shape) + (v,)) * rng.choice([1.0, 30.0, 1e4, 1e38])).to(dtype)
    if v > 1 and z.numel() and rng.random() < 0.3:
        flat = z.view(-1)
        idx = torch.from_numpy(rng.choice(flat.numel(), size=min(flat.numel(), 3), replace=False))
        flat[idx] = float(rng.choice([math.inf, -math.inf]))
    z = z.reshape(tuple(shape) + (v,))
    if z.numel():  # a row keeps at least one finite-or-+inf entry (an all -inf row is malformed)
        dead = torch.isneginf(z).all(-1, keepdim=True)
        z = torch.where(dead & (torch.arange(v) == 0), torch.zeros((), dtype=dtype), z)
    kwargs = dict(temperature=float(rng.choice([0.0, 1e-40, 1e-6, 0.1, 1.0, 3.0])))
    if rng.random() < 0.3:
        kwargs["top_k"] = int(rng.choice([1, 2, 10, 10**6]))
    if rng.random() < 0.3:
        kwargs["top_p"] = float(rng.choice([1e-9, 0.5, 0.9, 1.0]))
    out = logits_to_probs(z, **kwargs)
    _no_nan("logits_to_probs", out)
    tol = contract.tolerance(out.dtype)
    _check((out >= 0).all(), "logits_to_probs: negative")
    _check(((out.double().sum(-1) - 1).abs() <= tol.sum).all(), "logits_to_probs: rows do not sum to 1")


def _case_pool(rng, dtype):
    from sklearn.exceptions import NotFittedError  # noqa: F401  (imported for a clear failure message)

    from mdboost.boosting import SelfNormalizedBoostClassifier, TableScorer

    n_rows, n_cls = int(rng.integers(4, 30)), int(rng.integers(2, 6))
    tables = [rng.standard_normal((n_rows, n_cls)) for _ in range(2)]
    pool = [TableScorer(t) for t in tables]
    X = np.arange(n_rows)[:, None]
    y = rng.integers(0, n_cls, n_rows)
    clf = SelfNormalizedBoostClassifier(pool=pool, n_estimators=3).fit(X, y)
    Xt = rng.integers(0, n_rows, (int(rng.integers(1, 6)), 1))
    proba = clf.predict_proba(Xt)
    _no_nan("predict_proba", torch.from_numpy(proba))
    _check(np.all(np.abs(proba.sum(1) - 1) < 1e-9) if len(Xt) else True, "predict_proba rows")
    _check(np.array_equal(clf.classes_[proba.argmax(1)], clf.predict(Xt)) if len(Xt) else True, "argmax != predict")
    clf.decision_function(Xt)
    if len(Xt):
        clf.score(Xt, y[Xt[:, 0]])
        clf.margins(Xt, y[Xt[:, 0]])


# ---------------------------------------------------------------------------- fixed regression cases
def _regression_solve_rounded_b(routing=None):
    """Float32 ``b = 1 - 6e-12`` rounded to nearest was ``b = 1``: ``pi_2 = 0``, an infinite ``rkl``
    against the budget 0.6 (also in half precision, and the dual at the same point)."""
    for dtype in (torch.float32, torch.float16):
        p, q = torch.tensor([1.0, 0.0], dtype=dtype), torch.tensor([0.97582394, 0.02417603], dtype=dtype)
        for div in ("rkl", "neyman", "alpha:-3"):
            _check_primal(p, q, 0.6, div, dtype, routing)
            for what in ("exact", "bound"):
                bp = Breakpoints.build(p, q)
                pt = (bp.for_divergence if what == "exact" else bp.for_divergence_bound)(0.6, div)
                _check_budget_kept(f"for_divergence {what}", p, q, pt.a, pt.b, 0.6, div, dtype)


def _regression_verify_half_overlap(routing=None):  # verify has no routing argument
    """Two equal float16 rows summing to 1.0005 (within the input tolerance) overlapped by 1.0005:
    ``sd_acceptance`` above 1."""
    row = torch.tensor([0.3335, 0.3335, 0.3335], dtype=torch.float16)
    p, q = row.expand(2, 1, 3).clone(), row.expand(2, 2, 3).clone()
    tokens = torch.tensor([[0], [2]])
    for kwargs in (dict(max_divergence=0.0), dict(max_divergence=0.1, divergence="rkl"), dict(min_acceptance=0.5)):
        _check_verify(tokens, p, q, dict(kwargs, generator=torch.Generator().manual_seed(0)), torch.float16)


def _regression_greedy_dead_row():
    """An all ``-inf`` row was a one-hot on token 0 at ``temperature=0`` (an error at 1)."""
    z = torch.tensor([[0.0, 1.0], [-math.inf, -math.inf]])
    return [("logits", "logits", lambda t=t: logits_to_probs(z, temperature=t)) for t in (0.0, 1.0)]


REGRESSIONS = dict(solve=_regression_solve_rounded_b, verify=_regression_verify_half_overlap)  # valid input
MALFORMED_REGRESSIONS = (_regression_greedy_dead_row,)  # each gives (api, argument, thunk) triples


VALID = dict(solve=_case_solve, breakpoints=_case_breakpoints, verify=_case_verify, f_divergence=_case_f_divergence,
             mentored_distribution=_case_mentored, logits_to_probs=_case_logits, pool=_case_pool)
WEIGHTS = dict(solve=0.25, breakpoints=0.2, verify=0.17, f_divergence=0.08, mentored_distribution=0.07,
               logits_to_probs=0.13, pool=0.1)


# ---------------------------------------------------------------------------- malformed calls
def _spoiled(rng):
    """A spoiled value of a probability tensor (and what makes it bad)."""
    base = torch.softmax(torch.randn(2, 4, dtype=torch.float64), -1)
    return [
        torch.zeros(2, 4, device="meta"),
        base.to(torch.complex128),
        (base * 1000).long(),
        base.bool(),
        base.numpy(),
        "0.5",
        None,
        torch.full((2, 4), math.nan, dtype=torch.float64),
        base - 0.5,
        base * 2,
        torch.softmax(torch.randn(2, 5, dtype=torch.float64), -1),
        torch.ones(2, 0, dtype=torch.float64),
        torch.tensor(1.0, dtype=torch.float64),
    ][rng.integers(13)]


def _bad_number(rng, kind):
    vals = ["1", 1j, [math.nan], math.nan, -1.0, None if kind != "temperature" else -0.5, object(),
            torch.tensor([1.0, 2.0, 3.0]), torch.tensor(0.1, dtype=torch.complex64), True if kind != "budget" else "x"]
    if kind in ("acceptance",):
        vals += [1.5, math.inf]
    if kind == "top_k":
        vals = [math.inf, math.nan, 0, -3, 2.5, "5", [2], 1j, True]
    if kind == "top_p":
        vals = [[0.5], "0.5", 0.0, 1.5, math.nan, 1j, -0.1, True]
    return vals[rng.integers(len(vals))]


def _malformed_case(rng):
    """``(api, argument name, thunk)`` of one call with one spoiled argument."""
    p = torch.softmax(torch.randn(2, 4, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(2, 4, dtype=torch.float64), -1)
    api = rng.choice(["solve", "breakpoints", "verify", "f_divergence", "mentored", "logits", "pool"])
    which = rng.integers(4)
    if api == "solve":
        if which < 2:
            name = ["draft_probs", "target_probs"][which]
            args = dict(draft_probs=p, target_probs=q)
            args[name] = _spoiled(rng)
            return api, name, lambda: solve(args["draft_probs"], args["target_probs"], max_divergence=0.1)
        if which == 2:
            bad = _bad_number(rng, "budget")
            return api, "max_divergence", lambda: solve(p, q, max_divergence=bad)
        bad = _bad_number(rng, "acceptance")
        return api, "min_acceptance", lambda: solve(p, q, min_acceptance=bad)
    if api == "breakpoints":
        bp = Breakpoints.build(p, q)
        if which == 0:
            bad = _spoiled(rng)
            return api, "draft_probs", lambda: Breakpoints.build(bad, q)
        if which == 1:
            bad = _bad_number(rng, "acceptance")
            return api, "min_acceptance", lambda: bp.for_acceptance(bad)
        if which == 2:
            bad = _bad_number(rng, "budget")
            meth = [bp.for_divergence, bp.for_divergence_bound, bp.for_divergence_with_value][rng.integers(3)]
            return api, "max_divergence", lambda: meth(bad)
        bad = _bad_number(rng, "acceptance")
        return api, "acceptance", lambda: bp.divergence_at(bad)
    if api == "verify":
        pv, qv = p[:, None].expand(2, 1, 4).contiguous(), torch.softmax(torch.randn(2, 2, 4, dtype=torch.float64), -1)
        tok = torch.zeros(2, 1, dtype=torch.long)
        kwargs = {}
        choice = rng.integers(7)
        if choice == 0:
            name, kwargs["top_k"] = "top_k", _bad_number(rng, "top_k")
        elif choice == 1:
            name, kwargs["generator"] = "generator", [3, "seed", [torch.Generator()], 1.5][rng.integers(4)]
        elif choice == 2:
            name, kwargs["max_divergence"] = "max_divergence", _bad_number(rng, "budget")
            if rng.random() < 0.5:  # the budget is checked without drafts too
                pv, qv, tok = pv[:, :0], qv[:, :1], tok[:, :0]
        elif choice == 3:
            bad = _bad_number(rng, "acceptance")
            name, kwargs["min_acceptance"] = "min_acceptance", (1.5 if bad is None else bad)  # None: plain SD
            if rng.random() < 0.5:
                pv, qv, tok = pv[:0], qv[:0], tok[:0]
        elif choice == 4:
            name, tok = "draft_tokens", [tok + 9, tok.float(), tok.numpy(), tok[:, :0], tok - 2][rng.integers(5)]
        elif choice == 5:
            name, pv = "draft_probs", [pv.to("meta"), pv.to(torch.complex128), pv[0], pv * 3][rng.integers(4)]
        else:
            name, kwargs["solve"] = "solve", ["fast", 1, None][rng.integers(3)]
        return api, name, lambda: verify(tok, pv, qv, **kwargs)
    if api == "f_divergence":
        if which < 2:
            name = ["output_probs", "target_probs"][which]
            args = dict(output_probs=p, target_probs=q)
            args[name] = [torch.full((2, 4), math.nan, dtype=torch.float64), p - 0.5, torch.zeros(2, 4, device="meta"),
                          p.to(torch.complex128), torch.ones(3, 4, dtype=torch.float64), "x"][rng.integers(6)]
            return api, name, lambda: f_divergence(args["output_probs"], args["target_probs"])
        return api, "divergence", lambda: f_divergence(p, q, ["nope", 3, None][rng.integers(3)])
    if api == "mentored":
        if which < 2:
            name = ["draft_probs", "target_probs"][which]
            args = dict(draft_probs=p, target_probs=q)
            args[name] = [torch.full((2, 4), math.nan, dtype=torch.float64), p - 0.5, torch.ones(3, 4, dtype=torch.float64),
                          "x", p.to(torch.complex128)][rng.integers(5)]
            return api, name, lambda: mentored_distribution(args["draft_probs"], args["target_probs"], 0.1, 0.1)
        name = ["a", "b"][which - 2]
        bad = [-1.0, math.nan, "x", 1j, torch.zeros(5)] + ([1.5] if name == "b" else [])
        val = bad[rng.integers(len(bad))]
        ab = dict(a=0.1, b=0.1)
        ab[name] = val
        return api, name, lambda: mentored_distribution(p, q, ab["a"], ab["b"])
    if api == "logits":
        z = torch.randn(2, 4)
        if which == 0:
            bad = [torch.zeros(2, 4, device="meta"), torch.zeros(2, 4, dtype=torch.complex64), torch.full((2, 4), math.nan),
                   torch.full((2, 4), -math.inf), "x", torch.zeros(()), torch.zeros(2, 0)][rng.integers(7)]
            # an all -inf row is an error at every temperature (greedy too) and with top_k / top_p
            kwargs = dict(temperature=float(rng.choice([0.0, 1e-40, 0.5, 1.0])))
            if rng.random() < 0.3:
                kwargs["top_k"] = int(rng.choice([1, 3]))
            if rng.random() < 0.3:
                kwargs["top_p"] = 0.9
            return api, "logits", lambda: logits_to_probs(bad, **kwargs)
        name = ["temperature", "top_k", "top_p"][which - 1]
        bad = _bad_number(rng, name)
        return api, name, lambda: logits_to_probs(z, **{name: bad})
    return _malformed_pool(rng)


class _NoRows:
    """A row-index scorer that does not declare ``n_rows`` (it indexes its table directly)."""

    def __init__(self, table):
        self.table = np.asarray(table, dtype=np.float64)
        self.classes_ = np.arange(self.table.shape[1])

    def decision_function(self, X):
        return self.table[np.asarray(X)[:, 0].astype(np.intp)]


def _malformed_pool(rng):
    from mdboost.boosting import SelfNormalizedBoostClassifier, TableScorer

    n_rows = 10
    tables = [rng.standard_normal((n_rows, 3)) for _ in range(2)]
    X = np.arange(n_rows)[:, None]
    y = np.arange(n_rows) % 3
    if rng.random() < 0.7:  # scorers that declare n_rows: X is checked as row indices up front
        pool = [TableScorer(t) for t in tables]
        bad = [np.array([[n_rows]]), np.array([[-1]]), np.array([[np.nan]]), np.array([[1.5]]), np.array([[10**12]]),
               np.array([[np.inf]])][rng.integers(6)]
    else:  # scorers without n_rows (a cache-backed scorer): their IndexError is reported as X
        pool = [_NoRows(t) for t in tables]
        bad = [np.array([[n_rows]]), np.array([[np.nan]]), np.array([[10**12]])][rng.integers(3)]
    clf = SelfNormalizedBoostClassifier(pool=pool, n_estimators=2)
    method = rng.choice(["fit", "predict", "predict_proba", "decision_function", "score", "margins",
                         "staged_predict", "staged_predict_proba", "staged_decision_function", "staged_score"])
    if method == "fit":
        Xb = np.concatenate([X, bad])
        return "pool", "X", lambda: clf.fit(Xb, np.concatenate([y, [0]]))
    clf.fit(X, y)
    fn = getattr(clf, method)
    if method in ("score", "margins", "staged_score"):
        return "pool", "X", lambda: list(fn(bad, np.array([0]))) if method == "staged_score" else fn(bad, np.array([0]))
    return "pool", "X", (lambda: list(fn(bad))) if method.startswith("staged") else (lambda: fn(bad))


# ---------------------------------------------------------------------------- the run
def replay(api: str, desc) -> None:
    """Re-run one failed valid case of a :class:`Report` (``api`` and ``desc`` from its failures)."""
    dtype, state = desc
    rng = np.random.default_rng()
    rng.bit_generator.state = state
    VALID[api](rng, dtype)


def run(seed: int, n_cases: int, dtypes=(torch.float64, torch.float32), *, malformed_share: float = 0.2,
        time_budget: float | None = None, routing=None) -> Report:
    """Run the fixed regression cases, then ``n_cases`` drawn cases per dtype of ``dtypes`` (stopping
    early past ``time_budget`` seconds); ``routing``: the exact solves' route and namespace (see
    :func:`_routed`)."""
    rng = np.random.default_rng(seed)
    report = Report()
    apis, weights = list(VALID), np.array([WEIGHTS[k] for k in VALID])
    start = time.perf_counter()
    torch.manual_seed(seed)
    _run_regressions(report, routing)
    for i in range(n_cases * len(dtypes)):
        if time_budget is not None and time.perf_counter() - start > time_budget:
            break
        dtype = dtypes[i % len(dtypes)]
        if rng.random() < malformed_share:
            _run_malformed(report, *_malformed_case(rng))
            continue
        api = apis[rng.choice(len(apis), p=weights / weights.sum())]
        state = rng.bit_generator.state
        _run_valid(report, api, (dtype, state),
                   lambda: VALID[api](rng, dtype, **({"routing": routing} if routing is not None and api == "solve" else {})))
    report.seconds = time.perf_counter() - start
    return report


def _run_regressions(report: Report, routing=None) -> None:
    """The fixed regression cases (counted under ``"<api> (regression)"``; a failure's ``desc`` is
    the case's name, which :func:`replay` does not take); ``routing``: see :func:`run`."""
    for api, case in REGRESSIONS.items():
        _run_valid(report, api, case.__name__, lambda case=case: case(routing=routing), label=f"{api} (regression)")
    for make in MALFORMED_REGRESSIONS:
        for api, name, thunk in make():
            _run_malformed(report, api, name, thunk, label=f"{api} (malformed regression)")


def _run_valid(report: Report, api: str, desc, thunk, label: str | None = None) -> None:
    """One call on valid input: its failures counted by kind."""
    report.cases[label or api] += 1
    try:
        thunk()
    except _Fail as fail:
        report.add(fail.kind, api, desc, str(fail))
    except ValueError as exc:
        report.add("violation", api, desc, f"valid input rejected: {exc}")
    except Exception as exc:  # noqa: BLE001 - counted, that is the point
        report.add("bad_exception", api, desc, f"{type(exc).__name__}: {exc}")


def _run_malformed(report: Report, api: str, name: str, thunk, label: str | None = None) -> None:
    """One call with the argument ``name`` spoiled: a ValueError/TypeError naming it, else counted."""
    report.cases[label or f"{api} (malformed)"] += 1
    report.malformed += 1
    try:
        thunk()
    except (ValueError, TypeError) as exc:
        if name not in str(exc):
            report.add("bad_exception", api, name, f"{type(exc).__name__} not naming {name}: {exc}")
    except Exception as exc:  # noqa: BLE001 - counted, that is the point
        report.add("bad_exception", api, name, f"{type(exc).__name__}: {exc}")
    else:
        report.add("bad_exception", api, name, "no error raised")
