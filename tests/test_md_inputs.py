"""Bad input raises ValueError naming the argument; divergences and logits_to_probs basics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mdboost.md.breakpoints import Breakpoints
from mdboost.md.divergences import GENERATORS, alpha, f_divergence, from_callable, resolve
from mdboost.md.probs import logits_to_probs
from mdboost.md.solve import acceptance_probability, mentored_distribution, solve
from mdboost.md.verify import verify
from tests.test_md_reference import REF, ref_divergence, ref_primal

P = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
Q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(draft_probs=torch.tensor([0.5, float("nan"), 0.5], dtype=torch.float64)), "draft_probs"),
        (dict(target_probs=torch.tensor([0.5, 0.7, -0.2], dtype=torch.float64)), "target_probs"),
        (dict(target_probs=torch.tensor([0.5, 0.3, 0.3], dtype=torch.float64)), "target_probs"),
        (dict(draft_probs=torch.tensor([0.5, 0.5], dtype=torch.float64)), "same shape"),
        (dict(draft_probs=torch.tensor([1, 0, 0])), "draft_probs"),
        (dict(max_divergence=-0.1), "max_divergence"),
        (dict(max_divergence=float("nan")), "max_divergence"),
        (dict(max_divergence=None, min_acceptance=1.5), "min_acceptance"),
        (dict(max_divergence=None, min_acceptance=-0.1), "min_acceptance"),
        (dict(max_divergence=0.1, min_acceptance=0.5), "exactly one"),
        (dict(divergence="nope"), "divergence"),
        (dict(mode="fast"), "mode"),
        (dict(max_divergence=torch.zeros(4)), "max_divergence"),
    ],
)
def test_solve_rejects_bad_input(kwargs, match):
    args = dict(draft_probs=P, target_probs=Q, max_divergence=0.1)
    args.update(kwargs)
    p, q = args.pop("draft_probs"), args.pop("target_probs")
    with pytest.raises(ValueError, match=match):
        solve(p, q, **args)


def test_solve_rejects_a_dual_bound_and_a_non_bool_validate():
    with pytest.raises(ValueError, match=r"^mode='bound' applies to the primal \(max_divergence\) only; the dual "
                                         r"\(min_acceptance\) is solved exactly: leave mode='exact'$"):
        solve(P, Q, min_acceptance=0.5, mode="bound")
    assert float(solve(P, Q, min_acceptance=0.9, mode="exact").acceptance) == pytest.approx(0.9)  # SD: 0.7
    for bad in ("no", 0, None):
        with pytest.raises(TypeError, match=f"^validate must be True or False, got {bad!r}$"):
            solve(P, Q, max_divergence=0.1, validate=bad)
    assert float(solve(P, Q, max_divergence=0.1, validate=np.bool_(False)).acceptance) == pytest.approx(
        float(solve(P, Q, max_divergence=0.1).acceptance))  # a numpy bool (a mask's element) is a bool


def test_verify_rejects_bad_input():
    p = torch.softmax(torch.randn(2, 3, 5), -1)
    q = torch.softmax(torch.randn(2, 4, 5), -1)
    tok = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="draft_tokens"):
        verify(tok + 5, p, q)
    with pytest.raises(ValueError, match="draft_tokens"):
        verify(tok.float(), p, q)
    with pytest.raises(ValueError, match="target_probs"):
        verify(tok, p, q[:, :3])
    with pytest.raises(ValueError, match="max_divergence"):
        verify(tok, p, q, max_divergence=torch.tensor([0.1, -1.0]))
    with pytest.raises(ValueError, match="max_divergence"):
        verify(tok, p, q, max_divergence=torch.zeros(3))
    with pytest.raises(ValueError, match="min_acceptance"):
        verify(tok, p, q, min_acceptance=2.0)
    with pytest.raises(ValueError, match="top_k"):
        verify(tok, p, q, top_k=0)
    with pytest.raises(ValueError, match="generator"):
        verify(tok, p, q, generator=[torch.Generator()])
    onehot = torch.zeros(2, 3, 5)
    onehot[..., 1] = 1
    with pytest.raises(ValueError, match="draft_tokens"):
        verify(tok, onehot, q)


def test_divergence_generators_and_limits():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.0, 0.5], dtype=torch.float64)
    for name in REF:
        got = float(f_divergence(p, q, name))
        assert got == pytest.approx(ref_divergence(p.numpy(), q.numpy(), name)) or (
            math.isinf(got) and math.isinf(ref_divergence(p.numpy(), q.numpy(), name))
        )
    z = torch.linspace(0, 5, 101, dtype=torch.float64)
    for name, div in GENERATORS.items():
        assert float(div(torch.ones((), dtype=torch.float64))) == pytest.approx(0.0, abs=1e-15)
        assert torch.all(div.g(z[1:]) >= -1e-12), name
        if name != "tv":  # f'(1) matches a finite difference
            h = 1e-6
            fd = (div(torch.tensor(1 + h, dtype=torch.float64)) - div(torch.tensor(1 - h, dtype=torch.float64))) / (2 * h)
            assert float(fd) == pytest.approx(div.fprime_one, abs=1e-6)
    with pytest.raises(ValueError, match="alpha"):
        alpha(1.0)
    assert resolve("alpha:1.5").name == "alpha(1.5)"


def test_user_callable_generator_matches_builtin():
    custom = from_callable(lambda z: (z - 1) ** 2)  # Pearson
    assert custom.fprime_one == pytest.approx(0.0, abs=1e-9) and math.isinf(custom.inf_slope)
    a = solve(P, Q, max_divergence=0.1, divergence=lambda z: (z - 1) ** 2)
    b = solve(P, Q, max_divergence=0.1, divergence="pearson")
    assert float(a.acceptance) == pytest.approx(float(b.acceptance), abs=1e-12)
    with pytest.raises(ValueError, match="f\\(1\\) = 0"):
        from_callable(lambda z: z**2)


def test_logits_to_probs():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0], [0.0, -1.0, 5.0, float("-inf")]])
    greedy = logits_to_probs(logits, temperature=0)
    assert torch.equal(greedy, torch.tensor([[0.0, 1, 0, 0], [0, 0, 1, 0]]))
    full = logits_to_probs(logits)
    torch.testing.assert_close(full, torch.softmax(logits, -1))
    top2 = logits_to_probs(logits[1:], top_k=2)
    expected = torch.softmax(torch.tensor([0.0, float("-inf"), 5.0, float("-inf")]), -1)
    torch.testing.assert_close(top2[0], expected)
    nucleus = logits_to_probs(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), top_p=0.75)
    torch.testing.assert_close(nucleus, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.equal(logits, torch.tensor([[1.0, 3.0, 2.0, 3.0], [0.0, -1.0, 5.0, float("-inf")]]))
    for bad in [dict(temperature=-1), dict(top_k=0), dict(top_p=0.0)]:
        with pytest.raises(ValueError, match=next(iter(bad))):
            logits_to_probs(logits, **bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1e-300, 1e-50, 1e-46])
def test_a_temperature_that_rounds_to_zero_in_the_logits_dtype_gives_the_argmax_limit(dtype, temperature):
    """1e-300 is 0 in float32: ``logits / temperature`` is then 0 / 0 at a zero logit and +-inf elsewhere;
    the result is the limit of the softmax (the argmax tokens sharing the mass), as for an overflow."""
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0], [0.0, -1.0, -5.0, float("-inf")], [-2.0, -2.0, -7.0, -3.0]],
                          dtype=dtype)
    probs = logits_to_probs(logits, temperature=temperature)
    expected = torch.tensor([[0.0, 0.5, 0.0, 0.5], [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    assert probs.dtype == torch.float32 and torch.equal(probs, expected)


@st.composite
def _dirichlet_pair(draw):
    n = draw(st.integers(2, 24))
    seed = draw(st.integers(0, 2**31 - 1))
    conc = draw(st.sampled_from([0.1, 0.5, 1.0, 5.0]))
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.full(n, conc)), rng.dirichlet(np.full(n, conc))
    return p / p.sum(), q / q.sum()


@settings(max_examples=40, deadline=None)
@given(
    pair=_dirichlet_pair(),
    name=st.sampled_from(["kl", "rkl", "hellinger", "pearson", "tv", "js"]),
    budget=st.floats(0.0, 2.0),
)
def test_property_random_dirichlet_pairs(pair, name, budget):
    p, q = (torch.tensor(x, dtype=torch.float64) for x in pair)
    sol = solve(p, q, max_divergence=budget, divergence=name)
    pi = mentored_distribution(p, q, sol.a, sol.b)
    assert float(pi.sum()) == pytest.approx(1.0, abs=1e-9)
    assert float(acceptance_probability(p, pi)) == pytest.approx(float(sol.acceptance), abs=1e-9)
    assert float(sol.achieved_divergence) <= budget + 1e-9
    assert float(sol.sd_acceptance) - 1e-12 <= float(sol.acceptance) <= 1 + 1e-12
    assert float(sol.acceptance) == pytest.approx(ref_primal(pair[0], pair[1], budget, name), abs=1e-7)
    bp = Breakpoints.build(p, q)
    dual = bp.for_acceptance(sol.acceptance)
    assert float(dual.a) == pytest.approx(float(sol.a), rel=1e-6, abs=1e-9)


def _negative_zeros(x):  # the exact zeros of x as -0.0
    return torch.where(x == 0, torch.full_like(x, -0.0), x)


@pytest.mark.parametrize("vocab,rows", [(3, 1), (300, 1), (300, 4), (300, 20), (5000, 3)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_negative_zero_entries_are_zeros(vocab, rows, dtype):
    """``-0.0`` in ``q`` (or ``p``) is a zero like ``+0.0``: the same solution on every path (one
    small row, a few rows, many rows, the bucketed vocabulary), the same SD acceptance, and
    ``verify`` never emits a token the target excludes."""
    gen = torch.Generator().manual_seed(vocab + rows)
    p = torch.softmax(torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 2, -1)
    q[:, : max(1, vocab // 4)] = 0.0  # a top-k-like target: zeros where p has mass
    p[:, -1] = 0.0
    q, p = (q / q.sum(-1, keepdim=True)).to(dtype), (p / p.sum(-1, keepdim=True)).to(dtype)
    if rows == 1:
        p, q = p[0], q[0]
    q_neg, p_neg = _negative_zeros(q), _negative_zeros(p)
    assert bool(torch.signbit(q_neg[q == 0]).all())
    for name in ["kl", "hellinger", "rkl", "neyman"]:
        for kw in (dict(max_divergence=0.05), dict(min_acceptance=0.99), dict(min_acceptance=1.0)):
            ref = solve(p, q, divergence=name, **kw)
            for got in (solve(p, q_neg, divergence=name, **kw), solve(p_neg, q_neg, divergence=name, **kw)):
                for field in ("a", "b", "acceptance", "achieved_divergence", "sd_acceptance", "feasible"):
                    assert torch.equal(getattr(got, field), getattr(ref, field)), (name, kw, field)
    bp_ref, bp = Breakpoints.build(p, q), Breakpoints.build(p, q_neg)
    assert torch.equal(bp.sd_acceptance, bp_ref.sd_acceptance)
    assert float(bp_ref.sd_acceptance.max()) < 1.0  # p has mass where q is zero
    # verify: the draft token with q = -0.0 is never accepted, and no emitted token has q = 0
    p2, q2 = p.reshape(-1, vocab)[:1], q_neg.reshape(-1, vocab)[:1]
    tokens = torch.nonzero(q2[0] == 0)[:1].reshape(1, 1)
    target = torch.stack([q2[0], q2[0]])[None]
    for seed in range(20):
        out = verify(tokens, p2[:, None], target, max_divergence=1.0, generator=torch.Generator().manual_seed(seed))
        assert int(out.num_accepted) == 0
        assert float(q2[0, int(out.tokens[0, 0])]) > 0


@pytest.mark.parametrize("name", sorted(GENERATORS) + ["alpha:-3", "alpha:-1.5", "alpha:3"])
def test_generators_read_a_negative_zero_as_zero(name):
    """``f(-0.0) == f(0.0)`` and ``g(-0.0) == g(0.0)`` (``neyman``'s ``(z - 1) ((z - 1) / z)`` and odd
    negative powers would give ``-inf``), so ``D_f`` of a ``pi`` with negative zeros is that with zeros."""
    div = resolve(name)
    z = torch.tensor([-0.0, 0.0], dtype=torch.float64)
    f, g = div(z), div.g(z)
    assert torch.equal(f[0], f[1]) and torch.equal(g[0], g[1]), (f, g)
    pi = torch.tensor([0.5, 0.5, -0.0], dtype=torch.float64)
    q = torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    assert torch.equal(f_divergence(pi, q, name), f_divergence(pi.abs(), q, name))


def test_verify_reads_a_budget_sequence_as_the_tensor_of_its_values():
    """A list or array budget of length B is per row, as a (B,) tensor is (not per position)."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(2, 2, 6, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(2, 3, 6, generator=g, dtype=torch.float64), -1)
    tokens = torch.tensor([[0, 1], [2, 3]])

    def a_of(budget):
        return verify(tokens, p, q, max_divergence=budget, generator=torch.Generator().manual_seed(1)).a

    per_row = a_of(torch.tensor([0.0, 0.5], dtype=torch.float64))
    assert torch.equal(per_row[0], torch.zeros(2)) and bool((per_row[1] > 0).all())
    for budget in ([0.0, 0.5], np.array([0.0, 0.5]), (0.0, 0.5)):
        torch.testing.assert_close(a_of(budget), per_row, rtol=0, atol=0)
    per_position = a_of([[0.0, 0.5], [0.0, 0.5]])
    assert bool((per_position[:, 0] == 0).all()) and bool((per_position[:, 1] > 0).all())
    with pytest.raises(ValueError, match=r"max_divergence given per row must have shape \(2,\), got \(3,\)"):
        a_of([0.0, 0.5, 0.5])
    with pytest.raises(ValueError, match="solve must be one of"):  # checked on every path
        verify(tokens, p, q, mentored_probs=p, solve="bogus")


def test_budgets_beyond_float64_and_wrong_divergence_types_are_named():
    huge = 10 ** 400
    with pytest.raises(ValueError, match="max_divergence holds a number too large for float64"):
        solve(P, Q, max_divergence=huge)
    with pytest.raises(ValueError, match="max_divergence holds a number too large for float64"):
        verify(torch.tensor([[0]]), P.reshape(1, 1, 3), torch.stack([Q, Q]).reshape(1, 2, 3), max_divergence=huge)
    assert float(solve(P, Q, max_divergence=10 ** 300).acceptance) == 1.0  # a large int that fits: no limit
    for bad in (3, None, 1.5):
        with pytest.raises(TypeError, match="divergence must be a name"):
            resolve(bad)
    with pytest.raises(ValueError, match="divergence must be one of"):
        resolve("klx")
