"""The numerical contract of the core (docs/theory.md, section 9): the fuzzer's findings as regressions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mdboost.boosting import SelfNormalizedBoostClassifier, TableScorer
from mdboost.md.breakpoints import Breakpoints
from mdboost.md.contract import tolerance
from mdboost.md.divergences import f_divergence
from mdboost.md.probs import logits_to_probs
from mdboost.md.solve import acceptance_probability, mentored_distribution, solve
from mdboost.md.verify import verify

T64 = dict(dtype=torch.float64)


def _t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def _assert_contract(p, q, sol, budget, div, dtype=torch.float64):
    """pi(a, b) sums to 1, P_acc(pi) is the acceptance, D_f(pi || q) within the budget (recomputed)."""
    tol = tolerance(dtype)
    for x in (sol.a, sol.b, sol.acceptance, sol.achieved_divergence):
        assert not torch.isnan(x).any()
    pi = mentored_distribution(p, q, sol.a, sol.b, validate=False).double()
    assert torch.all((pi.sum(-1) - 1).abs() <= tol.sum + 1e-12)
    assert torch.allclose(acceptance_probability(p.double(), pi, validate=False), sol.acceptance.double(), atol=tol.sum)
    limit = budget * (1 + tol.divergence_rel) + tol.divergence_abs
    assert torch.all(sol.achieved_divergence >= 0) and torch.all(sol.achieved_divergence <= limit)
    recomputed = f_divergence(pi, q.double(), div, validate=False)
    assert torch.all(recomputed <= limit), (recomputed, budget)


@pytest.mark.parametrize("p,q,div,budget", [
    ([0.3, 0.7], [5e-324, 1.0], "pearson", 1e-12),  # was a = NaN
    ([0.3, 0.7, 1e-300], [0.9993, 0.0007, 1e-320], "kl", 0.028),  # was achieved 4.47
    ([2e-5, 0, 0.004, 0.99598], [2e-49, 1, 1e-25, 0], "kl", 0.0262),  # bound mode was 0.206
    ([0.145, 0.136, 0.107, 0.186, 0.058, 0.158, 0.21],
     [0.2198, 2.26e-60, 2.26e-9, 2.26e-38, 0.1373, 0.6429, 2.26e-38], "alpha:-1.5", 1.16),  # bound off the curve
])
@pytest.mark.parametrize("mode", ["exact", "bound"])
def test_extreme_entries_keep_the_contract(p, q, div, budget, mode):
    p, q = _t(p), _t(q)
    p, q = p / p.sum(), q / q.sum()
    sol = solve(p, q, max_divergence=budget, divergence=div, mode=mode)
    _assert_contract(p, q, sol, budget, div)
    if mode == "bound":
        exact = solve(p, q, max_divergence=budget, divergence=div)
        assert float(exact.acceptance) >= float(sol.acceptance) - 1e-12


def test_the_bound_mode_on_the_reported_case_stays_within_its_budget():
    p, q = _t([2e-5, 0, 0.004, 0.99598]), _t([2e-49, 1, 1e-25, 0])
    sol = solve(p / p.sum(), q, max_divergence=0.0262, divergence="kl", mode="bound")
    pi = mentored_distribution(p / p.sum(), q, sol.a, sol.b)
    assert float(f_divergence(pi, q, "kl")) <= 0.0262


@pytest.mark.parametrize("temperature", [0.05, 0.1])
@pytest.mark.parametrize("div", ["kl", "js"])
def test_llm_like_logits_at_low_temperature_stay_on_the_curve(temperature, div):
    """float32 softmax of wide logit gaps (subnormal entries): every row's point is on the curve."""
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(64, 1000, generator=gen) * 4
    p = logits_to_probs(base + torch.randn(64, 1000, generator=gen), temperature)
    q = logits_to_probs(base, temperature)
    assert (q[q > 0] < 1e-38).any()  # the regime of the report: subnormal float32 entries
    budgets = torch.tensor([0.01, 0.1, 1.0], **T64)[:, None].expand(3, 64)
    for mode in ("exact", "bound"):
        sol = solve(p.expand(3, 64, 1000), q.expand(3, 64, 1000), max_divergence=budgets, divergence=div, mode=mode)
        _assert_contract(p.expand(3, 64, 1000), q.expand(3, 64, 1000), sol, budgets, div, torch.float32)


def test_dual_at_the_returned_acceptance_gives_back_the_primal_point():
    """The ill-conditioned case: a within 1e-5 of 1 acceptance, tiny q(A), budget near 1e-20."""
    p, q = _t([6.2e-6, 1 - 6.2e-6]), _t([3e-14, 1.0])
    for budget in (1e-20, 1e-16, 1e-12):
        sol = solve(p, q, max_divergence=budget)
        dual = Breakpoints.build(p, q).for_acceptance(sol.acceptance)
        assert float(dual.a) == float(sol.a) and float(dual.b) == float(sol.b)
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, q = (torch.from_numpy(rng.dirichlet(np.full(6, 0.3))) for _ in range(2))
        sol = solve(p, q, max_divergence=float(10 ** rng.uniform(-20, 0)), divergence="hellinger")
        dual = Breakpoints.build(p, q).for_acceptance(sol.acceptance)
        assert float(dual.a) == pytest.approx(float(sol.a), rel=1e-9, abs=1e-12)
        assert float(dual.b) == pytest.approx(float(sol.b), rel=1e-9, abs=1e-12)


def test_inputs_that_require_grad_are_read_detached():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 9, generator=gen, requires_grad=True)
    p = torch.softmax(logits, -1)  # a graph: what a caller without torch.no_grad() passes
    q = torch.softmax(torch.randn(2, 3, 9, generator=gen), -1)
    with_grad = solve(p, q, max_divergence=0.1)
    plain = solve(p.detach(), q, max_divergence=0.1)
    assert torch.equal(with_grad.a, plain.a) and not with_grad.acceptance.requires_grad
    bp = Breakpoints.build(p, q)
    for point in (bp.for_divergence(0.1), bp.for_divergence_bound(0.1), bp.for_acceptance(0.9)):
        assert not point.a.requires_grad
    target = torch.softmax(torch.randn(2, 4, 9, generator=gen), -1).requires_grad_(True)
    tokens = p.detach().reshape(-1, 9).multinomial(1, generator=gen).reshape(2, 3)
    res = verify(tokens, p, target, max_divergence=0.1, generator=torch.Generator().manual_seed(1))
    assert not res.acceptance_probability.requires_grad and not res.sd_acceptance.requires_grad
    assert logits_to_probs(logits).requires_grad  # the plain formula keeps its graph


@pytest.mark.parametrize("shape", [(3, 0, 5), (0, 5)])
def test_empty_batch_dimensions_give_empty_outputs(shape):
    p = torch.zeros(shape, **T64)
    batch = shape[:-1]
    for kwargs in (dict(max_divergence=0.1), dict(max_divergence=0.1, mode="bound"), dict(min_acceptance=0.5)):
        sol = solve(p, p, **kwargs)
        assert sol.a.shape == batch and sol.achieved_divergence.shape == batch
    bp = Breakpoints.build(p, p)
    assert bp.for_acceptance(0.5).a.shape == batch
    assert bp.for_divergence(0.1).a.shape == batch and bp.for_divergence_bound(0.1).b.shape == batch
    assert bp.for_divergence_with_value(0.1)[1].shape == batch
    assert bp.divergence_at(0.5).shape == batch and bp.sd_acceptance.shape == batch
    assert bp.curve().a.shape == batch + (2 * shape[-1] + 1,)
    with pytest.raises(ValueError, match="max_divergence"):  # a bad budget is reported without rows too
        bp.for_divergence(-1.0)


def _verify_args(batch=2, k=1):
    p = torch.softmax(torch.randn(batch, k, 4, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(batch, k + 1, 4, dtype=torch.float64), -1)
    return torch.zeros(batch, k, dtype=torch.long), p, q


P2 = torch.softmax(torch.randn(2, 4, dtype=torch.float64), -1)


@pytest.mark.parametrize("call,name,error", [
    (lambda: solve(torch.zeros(2, 4, device="meta"), P2, max_divergence=0.1), "draft_probs", ValueError),
    (lambda: solve(P2.to(torch.complex128), P2, max_divergence=0.1), "draft_probs", ValueError),
    (lambda: solve(P2, P2, max_divergence="0.1"), "max_divergence", TypeError),
    (lambda: solve(P2, P2, max_divergence=1j), "max_divergence", TypeError),
    (lambda: solve(P2, P2, min_acceptance=torch.tensor(0.5, dtype=torch.complex64)), "min_acceptance", TypeError),
    (lambda: Breakpoints.build(P2, P2).for_divergence_bound(math.nan), "max_divergence", ValueError),
    (lambda: logits_to_probs(torch.randn(4), temperature="1"), "temperature", TypeError),
    (lambda: logits_to_probs(torch.randn(4), temperature=1j), "temperature", TypeError),
    (lambda: logits_to_probs(torch.randn(4), top_k=math.inf), "top_k", ValueError),
    (lambda: logits_to_probs(torch.randn(4), top_k=math.nan), "top_k", ValueError),
    (lambda: logits_to_probs(torch.randn(4), top_p=[0.5]), "top_p", TypeError),
    (lambda: logits_to_probs(torch.zeros(4, device="meta")), "logits", ValueError),
    (lambda: logits_to_probs(torch.zeros(4, dtype=torch.complex64)), "logits", ValueError),
    (lambda: logits_to_probs(torch.full((2, 3), -math.inf)), "logits", ValueError),
    (lambda: logits_to_probs(torch.full((2, 3), -math.inf), temperature=0), "logits", ValueError),  # greedy too
    (lambda: logits_to_probs(_t([[0.0, -math.inf], [-math.inf, -math.inf]]), temperature=0.0, top_k=1), "logits",
     ValueError),
    (lambda: verify(*_verify_args(), generator=3), "generator", TypeError),
    (lambda: verify(*_verify_args(), top_k=math.inf, max_divergence=0.1), "top_k", ValueError),
    (lambda: verify(*_verify_args(k=0), max_divergence=-1.0), "max_divergence", ValueError),  # K = 0
    (lambda: verify(*_verify_args(batch=0), min_acceptance=2.0), "min_acceptance", ValueError),  # B = 0
    (lambda: verify(*_verify_args(), max_divergence=1j), "max_divergence", TypeError),
    (lambda: f_divergence(_t([math.nan, 1.0]), _t([0.5, 0.5])), "output_probs", ValueError),
    (lambda: f_divergence(_t([0.5, 0.5]), _t([1.5, -0.5])), "target_probs", ValueError),
    (lambda: f_divergence(_t([0.5, 0.5]), _t([0.2, 0.3, 0.5])), "output_probs", ValueError),
    (lambda: mentored_distribution(_t([0.5, 0.5]), _t([0.5, 0.5]), 0.0, 2.0), "b", ValueError),
    (lambda: mentored_distribution(_t([0.5, 0.5]), _t([0.5, 0.5]), -1.0, 0.0), "a", ValueError),
    (lambda: mentored_distribution(_t([0.5, 0.5]), _t([0.2, 0.3, 0.5]), 0.0, 0.0), "same shape", ValueError),
    (lambda: mentored_distribution(_t([0.5, math.nan]), _t([0.5, 0.5]), 0.0, 0.0), "draft_probs", ValueError),
])
def test_malformed_input_raises_naming_the_argument(call, name, error):
    with pytest.raises(error, match=name):
        call()


def test_logits_to_probs_takes_the_limits():
    for dtype in (torch.float32, torch.float64):
        inf = _t([0.0, math.inf, 1.0, math.inf], dtype)
        assert torch.equal(logits_to_probs(inf), _t([0.0, 0.5, 0.0, 0.5], dtype))
        cold = logits_to_probs(_t([[0.0, 1.0, 2.0], [5.0, -1.0, 4.999]], dtype), temperature=1e-40)
        assert torch.equal(cold, _t([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype))
        masked = logits_to_probs(_t([-math.inf, 0.0, -math.inf], dtype), top_k=2, top_p=0.5)
        assert torch.equal(masked, _t([0.0, 1.0, 0.0], dtype))


def test_rows_inside_the_sum_tolerance_are_not_rejected():
    """float32 rows off by 5e-4 (inside the 1e-3 tolerance): a derived acceptance never rounds below 0."""
    gen = torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn(4, 3, 50, generator=gen) * 6, -1) * (1 - 5e-4)
    q = torch.softmax(torch.randn(4, 4, 50, generator=gen) * 6, -1) * (1 + 5e-4)
    tokens = p.reshape(-1, 50).multinomial(1, generator=gen).reshape(4, 3)
    for kwargs in (dict(min_acceptance=0.5), dict(min_acceptance=0.0), dict(max_divergence=1e-9)):
        res = verify(tokens, p, q, generator=torch.Generator().manual_seed(0), **kwargs)
        assert torch.all(res.acceptance_probability >= 0) and torch.all(res.divergence >= 0)
    sol = solve(p[:, 0], q[:, 0], max_divergence=1e-9)
    assert torch.all(sol.achieved_divergence >= 0) and torch.all(sol.acceptance >= sol.sd_acceptance - 1e-6)


def test_half_precision_is_computed_in_float32_within_its_tolerance():
    p = _t([[0.255859375, 0.1376953125, 0.23828125, 0.3671875]], torch.bfloat16)  # sums to 0.999
    q = _t([[0.10546875, 0.1845703125, 0.2353515625, 0.474609375]], torch.bfloat16)
    for mode in ("exact", "bound"):
        sol = solve(p, q, max_divergence=1.87e-12, divergence="alpha:-1.5", mode=mode)
        assert sol.a.dtype == torch.float32
        assert float(sol.achieved_divergence) <= 1.87e-12 * (1 + 1e-5) + 1e-7


@pytest.mark.parametrize("method", ["fit", "predict", "predict_proba", "decision_function", "score", "margins",
                                    "staged_predict", "staged_predict_proba", "staged_decision_function",
                                    "staged_score"])
@pytest.mark.parametrize("bad", [[[10]], [[-1]], [[np.nan]], [[2.5]], [[np.inf]]])
def test_pool_mode_checks_row_indices_at_the_boundary(method, bad):
    rng = np.random.RandomState(0)
    pool = [TableScorer(rng.randn(10, 3)) for _ in range(2)]
    X, y = np.arange(10)[:, None], np.arange(10) % 3
    clf = SelfNormalizedBoostClassifier(pool=pool, n_estimators=2)
    bad = np.array(bad, dtype=np.float64)
    with pytest.raises(ValueError, match="X"):
        if method == "fit":
            clf.fit(np.concatenate([X, bad]), np.concatenate([y, [0]]))
        else:
            out = getattr(clf.fit(X, y), method)(*((bad, np.array([0])) if "score" in method or method == "margins"
                                                   else (bad,)))
            list(out) if method.startswith("staged") else None


def test_pool_mode_reports_an_index_error_of_a_scorer_without_n_rows():
    class Rows:
        def __init__(self, table):
            self.table, self.classes_ = table, np.arange(table.shape[1])

        def decision_function(self, X):
            return self.table[np.asarray(X)[:, 0].astype(np.intp)]

    rng = np.random.RandomState(1)
    clf = SelfNormalizedBoostClassifier(pool=[Rows(rng.randn(10, 3))], n_estimators=2)
    clf.fit(np.arange(10)[:, None], np.arange(10) % 3)
    with pytest.raises(ValueError, match="X holds a row index"):
        clf.predict(np.array([[10]]))
