"""The core and the engine on every available device, against CPU float64 references.

Each test runs on CPU and, where ``torch.cuda.is_available()``, on CUDA (``bench/gpu.sh`` runs
this file on a GPU machine); the tests of the core also on CPU with the core forced onto its torch
namespace (``"cpu-torch"``: the code path of accelerators on CPU tensors, by the explicit
``namespace=TORCH`` of ``mdboost.md.solve._solve``; ``mdboost.md._router``). Results
equal the CPU float64 sorted reference within the contract's tolerances (``mdboost.md.contract``),
outputs stay on the input's device, and the engine keeps its exactness properties (greedy SD =
greedy AR, zero budget = SD).
"""

import functools

import numpy as np
import pytest
import torch

from mdboost.engine import GenerationSettings, ModelDrafter, NgramAdapter, generate
from mdboost.md._xp import TORCH
from mdboost.md.breakpoints import Breakpoints
from mdboost.md.contract import tolerance
from mdboost.md.divergences import f_divergence
from mdboost.md.solve import _solve, mentored_distribution, solve
from mdboost.md.verify import PLACEHOLDER_TOKEN_ID, draw_uniforms, verify
from mdboost.models.drafters import early_exit_model
from mdboost.models.ngram import NgramDrafter
from mdboost.models.tiny import EOS_ID, tiny_llama
from tests._md_pairs import RESCUE_P, RESCUE_Q
from tests._sd_reference import reference_sd

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CORE_DEVICES = ["cpu", "cpu-torch"] + DEVICES[1:]  # the core's entry points take an explicit namespace
DIVERGENCES = ["kl", "rkl", "hellinger", "js", "tv"]
# 50 and 1000: the sorted breakpoints; 6000: the linear-time bucketed path (from 4096 entries on)
VOCABS = [50, 1000, 6000]
BUDGETS = [0.01, 0.05, 0.3]


def _use(device):
    """``(torch device, solve)`` of a test's ``device``: ``"cpu-torch"`` solves CPU tensors with
    ``namespace=TORCH`` (no numpy namespace, numpy sums or checks, no one-row routes), the path
    CUDA tensors take."""
    if device != "cpu-torch":
        return device, solve
    return "cpu", functools.partial(_solve, namespace=TORCH)


def _pair(rows, vocab, seed):  # float64 [rows, vocab] x2, CPU: correlated, heavy-tailed rows
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 2.5
    p = torch.softmax(base + 0.8 * torch.randn(rows, vocab, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(base + 0.8 * torch.randn(rows, vocab, generator=gen, dtype=torch.float64), -1)
    return p, q


def _acc_tol(dtype):
    """Acceptance agreement with the float64 reference: the contract's sum tolerance, plus the
    float32 rounding of the inputs (about 1e-7 relative per entry) where the rows are float32."""
    return 1e-8 if dtype == torch.float64 else 2e-5


@pytest.mark.parametrize("device", CORE_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("div", DIVERGENCES)
def test_primal_matches_the_cpu_sorted_reference(device, dtype, vocab, div):
    p, q = _pair(len(BUDGETS), vocab, seed=vocab)
    budget = torch.tensor(BUDGETS, dtype=torch.float64)
    ref = Breakpoints.build(*(x.to(dtype).to(torch.float64) for x in (p, q))).for_divergence(budget, div)
    device, solve_on = _use(device)
    sol = solve_on(p.to(device, dtype), q.to(device, dtype), max_divergence=budget.to(device), divergence=div)
    assert sol.acceptance.device.type == device and sol.acceptance.dtype == dtype
    p_in, q_in = (x.to(dtype).to(torch.float64) for x in (p, q))  # the rows the device solved, in float64
    assert torch.allclose(sol.acceptance.cpu().double(), ref.acceptance, atol=_acc_tol(dtype), rtol=0)
    # the emitted distribution stays within the budget (the contract's tolerance)
    p64, q64 = p_in / p_in.sum(-1, keepdim=True), q_in / q_in.sum(-1, keepdim=True)
    pi = mentored_distribution(p64, q64, sol.a.cpu().double(), sol.b.cpu().double())
    tol = tolerance(dtype)
    realized = f_divergence(pi, q64, div)
    assert torch.all(realized <= budget * (1 + tol.divergence_rel) + tol.divergence_abs + 2e-6 * (dtype != torch.float64))


@pytest.mark.parametrize("device", CORE_DEVICES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_dual_and_bound_on_the_device(device, vocab):
    p, q = _pair(3, vocab, seed=vocab + 1)
    bp = Breakpoints.build(p, q)
    target = bp.sd_acceptance + torch.tensor([0.0, 0.02, 0.1], dtype=torch.float64)
    ref = bp.for_acceptance(target)
    ref_div = bp.divergence_at(ref.acceptance, "kl")
    device, solve_on = _use(device)
    dual = solve_on(p.to(device), q.to(device), min_acceptance=target.to(device), divergence="kl")
    assert dual.acceptance.device.type == device
    assert torch.allclose(dual.acceptance.cpu(), ref.acceptance, atol=1e-9, rtol=0)
    assert torch.allclose(dual.achieved_divergence.cpu(), ref_div, atol=1e-9, rtol=1e-7)
    # the bound mode never spends more than the budget, and the exact mode accepts at least as much
    budget = torch.full((3,), 0.05, dtype=torch.float64)
    bound = solve_on(p.to(device), q.to(device), max_divergence=budget.to(device), mode="bound")
    exact = solve_on(p.to(device), q.to(device), max_divergence=budget.to(device))
    pi = mentored_distribution(p, q, bound.a.cpu(), bound.b.cpu())
    assert torch.all(f_divergence(pi, q, "kl") <= budget * (1 + 1e-9) + 1e-12)
    assert torch.all(exact.acceptance.cpu() >= bound.acceptance.cpu() - 1e-9)


def _verify_inputs(batch, k, vocab, seed):
    p, q = _pair(batch * (k + 1), vocab, seed)
    draft = p.reshape(batch, k + 1, vocab)[:, :k].contiguous()
    target = q.reshape(batch, k + 1, vocab).contiguous()
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=gen).reshape(batch, k)
    return tokens, draft, target


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab", [40, 6000])
def test_zero_budget_verify_is_textbook_sd_on_the_device(device, vocab):
    tokens, draft, target = _verify_inputs(16, 3, vocab, seed=vocab)
    seed = 5
    res = verify(tokens.to(device), draft.to(device), target.to(device),
                 generator=torch.Generator(device=device).manual_seed(seed))
    assert res.tokens.device.type == device
    u = draw_uniforms(16, 3, dtype=torch.float64, device=device,
                      generator=torch.Generator(device=device).manual_seed(seed)).cpu().numpy()
    ref = reference_sd(tokens.numpy(), draft.numpy(), target.numpy(), u)
    np.testing.assert_array_equal(res.tokens.cpu().numpy(), ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab,top_k", [(40, None), (6000, None), (6000, 64)])
@pytest.mark.parametrize("solve_mode", ["all", "needed"])
def test_verify_stats_match_cpu(device, vocab, top_k, solve_mode):
    tokens, draft, target = _verify_inputs(6, 4, vocab, seed=vocab + 7)
    budget = torch.tensor([0.0, 0.01, 0.05, 0.1, 0.3, 1.0], dtype=torch.float64)
    # the reference solves every position (its stats do not depend on the uniforms)
    cpu = verify(tokens, draft, target, max_divergence=budget, top_k=top_k, solve="all",
                 generator=torch.Generator().manual_seed(3))
    dev = verify(tokens.to(device), draft.to(device), target.to(device), max_divergence=budget.to(device),
                 top_k=top_k, solve=solve_mode, generator=torch.Generator(device=device).manual_seed(3))
    assert dev.a.device.type == torch.device(device).type
    assert torch.allclose(dev.sd_acceptance.cpu(), cpu.sd_acceptance, atol=1e-12, rtol=0)
    solved = ~torch.isnan(dev.a.cpu())  # "needed": the reached positions SD rejects (at least the first rejection)
    assert bool(solved.all()) if solve_mode == "all" else bool(solved.any())
    for name in ("a", "b", "acceptance_probability", "divergence"):
        got, want = getattr(dev, name).cpu(), getattr(cpu, name)
        assert torch.equal(torch.isnan(got), ~solved), name
        assert torch.allclose(got[solved], want[solved], atol=1e-7, rtol=1e-6), name
    # the emitted rows: accepted drafts, then one token of positive probability, then padding
    k = tokens.shape[1]
    for i in range(6):
        n = int(dev.num_accepted[i])
        row = dev.tokens[i].cpu()
        tok = int(row[n])
        assert torch.equal(row[:n], tokens[i, :n]) and torch.all(row[n + 1:] == PLACEHOLDER_TOKEN_ID)
        if top_k is not None:  # from the target's top-k at that position
            assert tok in set(torch.topk(target[i, n], top_k).indices.tolist())
        elif n == k:  # the bonus token, from the target
            assert target[i, k, tok] > 0
        else:  # the first rejection's residual ((1 - b) q - p)_+ (SD's (q - p)_+ at budget 0)
            b = float(dev.b[i, n])
            resid = (1 - b) * target[i, n] - draft[i, n]
            assert resid[tok] > 0 or not bool((resid > 0).any())


@pytest.fixture(scope="module")
def tiny_models():
    target = tiny_llama(vocab_size=32, num_layers=3, seed=0)
    drafter = tiny_llama(vocab_size=32, num_layers=1, seed=1)
    return target, drafter


@pytest.mark.parametrize("device", DEVICES)
def test_engine_keeps_its_exactness_on_the_device(device, tiny_models):
    target, drafter = (m.to(device) for m in tiny_models)
    try:
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(4, 32, (2, 6), generator=gen)
        ids = torch.cat([ids, ids, ids[:, :2]], dim=1).to(device)  # repetitive: prompt lookup proposes something
        greedy = dict(max_new_tokens=16, temperature=0, eos_token_id=EOS_ID)
        ar = generate(target, ids, GenerationSettings(**greedy))
        assert ar.sequences.device.type == torch.device(device).type
        # lossless: greedy SD is the target's greedy output, with a private-cache model drafter, an early
        # exit on the target's own KV cache and prompt lookup
        for draft in (ModelDrafter(drafter), ModelDrafter(early_exit_model(target, 1)), NgramAdapter(NgramDrafter(2))):
            sd = generate(target, ids, GenerationSettings(gamma=3, **greedy), drafter=draft)
            assert torch.equal(sd.sequences, ar.sequences)
        sampled = dict(max_new_tokens=12, gamma=3)
        runs = {}
        for budget in (0.0, 0.1):
            out = generate(target, ids.repeat(16, 1), GenerationSettings(max_divergence=budget, **sampled),
                           drafter=ModelDrafter(drafter), generator=torch.Generator(device=device).manual_seed(2))
            again = generate(target, ids.repeat(16, 1), GenerationSettings(max_divergence=budget, **sampled),
                             drafter=ModelDrafter(drafter), generator=torch.Generator(device=device).manual_seed(2))
            assert torch.equal(out.sequences, again.sequences)  # the generator is the only randomness
            assert out.stats.max_divergence <= budget + 1e-5
            runs[budget] = out.stats.acceptance_rate
        assert runs[0.1] > runs[0.0]
    finally:
        for m in tiny_models:
            m.to("cpu")



@pytest.mark.parametrize("device", DEVICES)
def test_hf_custom_generate_on_the_device(device, tiny_models):
    """``model.generate(custom_generate=mentored_generate)`` on device tensors: greedy equals
    transformers' own greedy output, and a sampled MD run stays within its budget."""
    from mdboost.hf import mentored_generate

    target, drafter = (m.to(device) for m in tiny_models)
    try:
        ids = torch.randint(4, 32, (2, 6), generator=torch.Generator().manual_seed(4)).to(device)
        plain = target.generate(ids, do_sample=False, max_new_tokens=16)
        ours = target.generate(ids, custom_generate=mentored_generate, drafter=drafter, do_sample=False,
                               max_new_tokens=16)
        assert ours.device.type == torch.device(device).type and torch.equal(ours, plain)
        out = target.generate(ids, custom_generate=mentored_generate, drafter=drafter, max_divergence=0.05,
                              do_sample=True, max_new_tokens=16, return_dict_in_generate=True,
                              generator=torch.Generator(device=device).manual_seed(1))
        assert out.stats.mode == "md" and out.stats.max_divergence <= 0.05 * (1 + 1e-5)
    finally:
        for m in tiny_models:
            m.to("cpu")


@pytest.mark.parametrize("device", CORE_DEVICES)
def test_rows_lost_to_rounding_are_rescued_on_the_device(device):
    """The fuzz-found pearson row the batched small-row search loses to rounding: the Python-float
    search of its row (copied to the host off the CPU) finds the optimum, not the curve's start."""
    p1, q1 = torch.tensor(RESCUE_P, dtype=torch.float64), torch.tensor(RESCUE_Q, dtype=torch.float64)
    p = torch.stack([p1, torch.full_like(p1, 1 / 16)])  # two rows: the array search
    q = torch.stack([q1, torch.softmax(torch.arange(16, dtype=torch.float64) / 4, -1)])
    budget = 15.417473254491748
    one = solve(p1, q1, max_divergence=budget, divergence="pearson")  # one CPU row: the scalar search
    device, solve_on = _use(device)
    batch = solve_on(p.to(device), q.to(device), max_divergence=budget, divergence="pearson")
    assert float(batch.acceptance[0]) > 0.98 > float(batch.sd_acceptance[0])
    assert abs(float(batch.acceptance[0]) - float(one.acceptance)) <= 1e-12
    pi = mentored_distribution(p1, q1, batch.a[0].cpu(), batch.b[0].cpu())
    assert 0 < float(f_divergence(pi, q1, "pearson")) <= budget * (1 + 1e-9)


def test_fuzzed_inputs_keep_the_contract_on_the_accelerator_path():
    """The seeded fuzz harness of the core (``tests/_fuzz_core.py``: CPU tensors over the whole float
    range) with its exact solves on the accelerator path (``namespace=TORCH``; plain CPU:
    ``tests/test_fuzz_core.py``)."""
    from tests import _fuzz_core

    report = _fuzz_core.run(20261202, 250, (torch.float64, torch.float32), time_budget=30.0,
                            routing=lambda *request: dict(namespace=TORCH))
    assert report.total >= 200
    for kind in _fuzz_core.KINDS:
        assert report.count(kind) == 0, f"{report.count(kind)} {kind}: {report.failures[kind][:3]}"


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_models_keep_the_budget_on_the_device(device, tiny_models):
    """The pool loads models in bfloat16 on CUDA: MD on bfloat16 logits (solved in float32, the
    core's compute dtype for half precision) stays within its budget and is seeded."""
    target, drafter = (m.to(device, torch.bfloat16) for m in tiny_models)
    try:
        ids = torch.randint(4, 32, (8, 6), generator=torch.Generator().manual_seed(5)).to(device)
        settings = GenerationSettings(max_new_tokens=10, gamma=3, max_divergence=0.1)
        runs = [generate(target, ids, settings, drafter=ModelDrafter(drafter),
                         generator=torch.Generator(device=device).manual_seed(0)) for _ in range(2)]
        assert torch.equal(runs[0].sequences, runs[1].sequences)
        s = runs[0].stats
        assert s.mode == "md" and s.num_budget_accepted > 0 and s.max_divergence <= 0.1 * (1 + 1e-5) + 1e-7
        assert int(runs[0].sequences.max()) < 32 and int(runs[0].sequences.min()) >= 0
    finally:
        for m in tiny_models:
            m.to("cpu", torch.float32)


# A fuzz case (bfloat16, pearson, seed 8): q down to subnormals; D_f jumps from 0.12 to 1.4e33 within
# 0.006 of acceptance, so the budget's crossing lies ~1e-19 from an excess mass of ~0.47, below float64's
# resolution there: every exact search loses it and the bound search's point is the answer.
_SUBNORMAL_P = [0.006195068359375, 0.193359375, 0.041748046875, 0.0693359375, 0.361328125, 0.12158203125, 0.20703125]
_SUBNORMAL_Q = [1.1479437019748901e-38, 9.183549615799121e-41, 0.0087890625, 1.1479437019748901e-38, 0.87109375,
                0.1220703125, 0.0]


@pytest.mark.parametrize("device", CORE_DEVICES)
def test_rows_every_exact_search_loses_take_the_bound_point(device):
    p1 = torch.tensor(_SUBNORMAL_P, dtype=torch.bfloat16)
    q1 = torch.tensor(_SUBNORMAL_Q, dtype=torch.bfloat16)
    budget = 1.0359972466620255
    device, solve_on = _use(device)
    for p, q in ((p1, q1), (torch.stack([p1, torch.full_like(p1, 1 / 7)]), torch.stack([q1, torch.full_like(q1, 1 / 7)]))):
        p, q = p.to(device), q.to(device)
        exact = solve_on(p, q, max_divergence=budget, divergence="pearson")
        bound = solve_on(p, q, max_divergence=budget, divergence="pearson", mode="bound")
        acc, acc_bound, sd = (float(x.reshape(-1)[0]) for x in (exact.acceptance, bound.acceptance, exact.sd_acceptance))
        assert acc >= acc_bound - 1e-5 and acc > sd + 0.02  # not the curve's start (0.491)
        p64, q64 = (x.reshape(-1, 7)[0].double().cpu() for x in (p, q))
        p64, q64 = p64 / p64.sum(), q64 / q64.sum()
        a, b = (float(x.reshape(-1)[0]) for x in (exact.a, exact.b))
        pi = mentored_distribution(p64, q64, torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64))
        assert 0 < float(f_divergence(pi, q64, "pearson")) <= budget * (1 + 1e-5)
