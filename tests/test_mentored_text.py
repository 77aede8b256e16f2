"""Continuations sampled by a lossy rule itself (prompt lookup; MD and SGLang's threshold): the
sampler against a plain loop, its emission law against the core's solution and the rule's law,
the rows files, and the ranking on them."""

import csv
import dataclasses

import pytest
import torch
from scipy import stats

from mdboost.cache import mentored as mentored_module
from mdboost.cache.mentored import (_acceptor, _emit, attach_mentored, load_mentored, mentored_path, open_or_sample_mentored,
                                    sample_mentored)

from mdboost.md.solve import mentored_distribution, solve
from mdboost.md.divergences import resolve
from mdboost.md.onehot import one_hot_primal
from mdboost.md.rules import Threshold
from mdboost.models.ngram import NgramDrafter
from mdboost.models.tiny import tiny_llama
from mdboost.ranking.mentored import mentored_pair_rows
from tests.test_rank_pipeline import _config as rank_config

PROMPT = torch.tensor([5, 9, 14, 3, 22, 5, 9, 14, 3, 40, 7])
POINTS = [("mentored", "kl", 0.2), ("threshold", "tv", 0.5), ("mentored", "hellinger", 1.0)]


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def test_sampler_equals_a_plain_loop(model):
    """One shared prefill and a batched KV cache draw exactly what a plain loop draws: a full
    forward per token, the position's own lookup, the closed-form t, the same generator."""
    gens = [torch.Generator().manual_seed(7 + i) for i in range(len(POINTS))]
    ref_gens = [torch.Generator().manual_seed(7 + i) for i in range(len(POINTS))]
    out = sample_mentored(model, PROMPT, NgramDrafter(2), POINTS, 0.8, 14, gens, k=8, width=4)
    drafter = NgramDrafter(2)
    for (rule, div, budget), part, gen in zip(POINTS, out, ref_gens):
        ids = PROMPT.clone()
        with torch.no_grad():
            for j in range(14):
                logits = model(ids[None]).logits[0, -1].float()
                props = drafter.propose(ids, 4)
                assert part["proposals"][j, :props.numel()].tolist() == props.tolist()
                assert (part["proposals"][j, props.numel():] == -1).all()
                token = _emit(logits, int(props[0]) if props.numel() else -1, 0.8, _acceptor(rule, budget, resolve(div)),
                              gen)
                assert int(part["tokens"][j]) == token
                torch.testing.assert_close(part["topk_logits"][j], torch.topk(logits, 8).values, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(part["lse"][j], torch.logsumexp(logits.double() / 0.8, -1), atol=1e-4,
                                           rtol=1e-6)
                ids = torch.cat([ids, torch.tensor([token])])
        assert part["tokens"].numel() == 14


def test_k_above_the_vocabulary_keeps_every_logit(model):
    """As the logit cache build does: ``k > V`` keeps all ``V`` logits, sorted (``mdboost rank``
    with ``cache.k`` 128 on the 64-token tiny target once raised ``selected index k out of range``)."""
    vocab = model.config.vocab_size
    out = sample_mentored(model, PROMPT, NgramDrafter(2), [("mentored", "tv", 0.5)], 1.0, 3, [torch.Generator().manual_seed(0)],
                          k=vocab + 5, width=2)
    with torch.no_grad():
        logits = model(PROMPT[None]).logits[0, -1].float()
    assert out[0]["topk_ids"].shape[-1] == vocab
    torch.testing.assert_close(out[0]["topk_logits"][0], torch.sort(logits, descending=True).values, atol=1e-4, rtol=1e-4)


def test_sampler_stops_after_eos(model):
    logits = model(PROMPT[None]).logits[0, -1]
    eos = int(logits.argmax())
    out = sample_mentored(model, PROMPT, NgramDrafter(2), [("mentored", "tv", 1.0)], 1e-3, 10, [torch.Generator().manual_seed(0)],
                          eos_token_id=eos, k=4, width=2)
    assert out[0]["tokens"].tolist()[-1] == eos and out[0]["tokens"].numel() == 1


@pytest.mark.parametrize("div, budget", [("kl", 0.05), ("hellinger", 0.2), ("tv", 0.3)])
def test_emission_law_is_the_mentored_distribution(div, budget):
    """The token drawn at a drafted position follows ``pi``, the core's exact solution for the
    one-hot draft (chi-square over 20000 draws)."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(12, generator=g) * 1.5
    q = torch.softmax(logits.double(), -1)
    x = 4
    p = torch.zeros(12, dtype=torch.float64)
    p[x] = 1.0
    sol = solve(p, q, max_divergence=budget, divergence=div)  # independent: the dense solver
    pi = mentored_distribution(p, q, sol.a, sol.b)
    draws = torch.tensor([_emit(logits, x, 1.0, _acceptor("mentored", budget, resolve(div)), g) for _ in range(20000)])
    counts = torch.bincount(draws, minlength=12).double()
    expected = pi * counts.sum()
    keep = expected > 5
    chi = stats.chisquare(counts[keep].numpy(), expected[keep].numpy() * counts[keep].sum().item() / expected[keep].sum().item())
    assert chi.pvalue > 1e-3
    t = float(one_hot_primal(q[x].reshape(1), torch.tensor([budget], dtype=torch.float64), resolve(div)).acceptance[0])
    assert abs(float(pi[x]) - t) < 1e-6


@pytest.mark.parametrize("div, budget", [("kl", 0.2), ("tv", 0.5), ("hellinger", 0.3)])
def test_threshold_emission_law_is_the_rules_law(div, budget):
    """SGLang's lossy threshold: the token drawn at a drafted position follows the rule's own
    closed-form law on the full vocabulary (chi-square over 20000 draws), not only on the two
    slots the sampler reads."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(12, generator=g) * 1.5
    q = torch.softmax(logits.double(), -1)
    x = int(torch.argsort(q)[6])  # a middling token: accepted with probability strictly inside (0, 1)
    p = torch.zeros(12, dtype=torch.float64)
    p[x] = 1.0
    law = Threshold.for_budget(budget, div).law(p, q)
    assert 0 < float(law.acceptance) < 1
    draws = torch.tensor([_emit(logits, x, 1.0, _acceptor("threshold", budget, resolve(div)), g) for _ in range(20000)])
    counts = torch.bincount(draws, minlength=12).double()
    expected = law.emitted * counts.sum()
    keep = expected > 5
    chi = stats.chisquare(counts[keep].numpy(), expected[keep].numpy() * counts[keep].sum().item() / expected[keep].sum().item())
    assert chi.pvalue > 1e-3


def test_no_proposal_draws_from_the_target():
    g = torch.Generator().manual_seed(1)
    logits = torch.tensor([2.0, 0.5, -1.0, 0.0])
    draws = torch.tensor([_emit(logits, -1, 1.0, _acceptor("mentored", 0.5, resolve("tv")), g) for _ in range(20000)])
    counts = torch.bincount(draws, minlength=4).double()
    q = torch.softmax(logits.double(), -1)
    assert stats.chisquare(counts.numpy(), (q * counts.sum()).numpy()).pvalue > 1e-3


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    """The tiny pipeline with a sampled acceptance cache, so prompt lookup's MD and threshold
    points get their own texts."""
    from pipelines.rank_pool import run

    tmp = tmp_path_factory.mktemp("mentored")
    rules = [{"rule": "mentored", "drafting": "sampled"}, {"rule": "threshold", "drafting": "greedy"}]
    cfg = rank_config(tmp, cache={"acceptance_source": "sampled", "acceptance_max_new_tokens": 8},
                      pool={"pairs": "target"}, md={"rules": rules})
    return tmp, cfg, run(cfg)


def _rows(tmp):
    with open(tmp / "out" / "ranking.csv") as f:
        return list(csv.DictReader(f))


def test_ranking_predicts_lookup_budgets_on_mentored_text(ranked):
    tmp, cfg, _ = ranked
    rows = _rows(tmp)
    for r in rows:
        lossy_lookup = r["drafter"].startswith("ngram") and float(r["max_divergence"]) > 0
        assert r["process_text"] == ("own" if lossy_lookup else "target"), r
    assert {r["rule"] for r in rows if r["process_text"] == "own"} == {"mentored", "threshold"}
    files = sorted(p.name for p in (tmp / "cache").iterdir() if p.name.startswith("mentored-"))
    # 2 temperatures x 2 divergences x the one budget > 0 x 2 lossy rules, for the one lookup drafter
    assert len(files) == 2 * len(cfg.md.divergences) * 2


def test_rerun_reuses_the_files_and_switch_off_restores_target_text(ranked, monkeypatch):
    from pipelines.rank_pool import run

    tmp, cfg, first = ranked

    def boom(*a, **k):
        raise AssertionError("a finished rows file was sampled again")

    monkeypatch.setattr(mentored_module, "sample_mentored", boom)
    again = run(cfg)
    assert [r["predicted_speedup"] for r in again["rows"]] == [r["predicted_speedup"] for r in first["rows"]]
    off = run(dataclasses.replace(cfg, cache=dataclasses.replace(cfg.cache, mentored_text=False),
                                  output_dir=str(tmp / "off")))
    assert {r["process_text"] for r in off["rows"]} == {"target"}
    def key(r):
        return r["drafter"], r["temperature"], r["rule"], r["drafting"], r["divergence"], r["max_divergence"], r["gamma"]

    by_key = {key(r): r for r in off["rows"]}
    assert len(by_key) == len(off["rows"])
    changed = {r["rule"] for r in first["rows"]
               if r["process_text"] == "own" and r["predicted_speedup"] != by_key[key(r)]["predicted_speedup"]}
    assert changed == {"mentored", "threshold"}  # each rule's own text changes its prediction
    plain = [r for r in first["rows"] if r["process_text"] == "target"]
    assert all(r["predicted_speedup"] == by_key[key(r)]["predicted_speedup"] for r in plain)


def test_rows_file_against_the_model(ranked, model):
    """A rows file's target rows are the target's own distribution on the stored text (a fresh
    forward pass per sequence), and its proposals the drafter's lookups on it."""
    tmp, cfg, _ = ranked
    spec = cfg.cache_spec(1.0)
    path = mentored_path(spec, "ngram:2", "kl", 0.3, cfg.speed.gamma_max)
    tensors = load_mentored(path)
    from mdboost.models.pool import build_pool

    target = build_pool("tiny", []).target.model
    from mdboost.ranking.rank import PairRows, PairSide
    from mdboost.ranking.support import rows_from_proposals

    dummy = rows_from_proposals(torch.full((1,), -1), torch.zeros(1, dtype=torch.long))
    acc = PairRows(PairSide("ngram:2", dummy, None, 0.01), PairSide("tiny", dummy, None, 1.0), [0])
    rows = mentored_pair_rows(tensors, acc, 1.0)
    off, starts = tensors["seq_offsets"].tolist(), tensors["starts"].tolist()
    r = 0
    for i, (a, b, s) in enumerate(zip(off[:-1], off[1:], starts)):
        ids = tensors["ids"][a:b]
        with torch.no_grad():
            logp = torch.log_softmax(target(ids[None]).logits[0, s - 1:-1].double(), -1)  # [n, V]
        n = b - a - s
        kept = rows.target.rows
        torch.testing.assert_close(kept.logp[r:r + n], logp.gather(1, kept.ids[r:r + n]), atol=2e-4, rtol=0)
        torch.testing.assert_close(kept.true_logp[r:r + n], logp.gather(1, ids[s:, None]).squeeze(1), atol=2e-4, rtol=0)
        props = NgramDrafter(2).propose_all(ids, cfg.speed.gamma_max)[s - 1:-1]
        assert torch.equal(rows.layout.proposals(cfg.speed.gamma_max)[r:r + n], props.long())
        assert (rows.layout.sequence[r:r + n] == i).all() and int(rows.layout.prompt_lengths[i]) == s
        r += n
    assert r == len(rows.labels)


def test_bad_input_is_named(ranked):
    tmp, cfg, _ = ranked
    spec = cfg.cache_spec(1.0)
    with pytest.raises(ValueError, match="drafter must be a prompt-lookup member.*'early_exit:2'"):
        open_or_sample_mentored(spec, "early_exit:2", [("mentored", "kl", 0.1)], 4)
    with pytest.raises(ValueError, match="points must have budgets > 0"):
        open_or_sample_mentored(spec, "ngram:2", [("mentored", "kl", 0.0)], 4)
    with pytest.raises(ValueError, match="rule must be one of .*'block'"):
        open_or_sample_mentored(spec, "ngram:2", [("block", "kl", 0.1)], 4)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sample_mentored(tiny_llama(), PROMPT, NgramDrafter(2), [("mentored", "kl", 0.1)], 0.0, 3, [torch.Generator()])


def test_keys_differ_by_point_and_sampler(ranked):
    tmp, cfg, _ = ranked
    spec = cfg.cache_spec(1.0)
    paths = {mentored_path(spec, "ngram:2", d, b, 6) for d in ("kl", "tv") for b in (0.1, 0.3)}
    assert len(paths) == 4
    assert mentored_path(spec, "ngram:2", "kl", 0.1, 6) != mentored_path(spec, "ngram:2", "kl", 0.1, 8)
    assert mentored_path(cfg.cache_spec(0.7), "ngram:2", "kl", 0.1, 6) != mentored_path(spec, "ngram:2", "kl", 0.1, 6)
    assert mentored_path(spec, "ngram:2", "kl", 0.1, 6, rule="threshold") != mentored_path(spec, "ngram:2", "kl", 0.1, 6)


def test_attach_skips_greedy_and_reference(ranked):
    from mdboost.cache import open_or_build_cache

    tmp, cfg, _ = ranked
    spec = cfg.cache_spec(1.0)
    pc, _ = open_or_build_cache(spec)
    assert attach_mentored(dataclasses.replace(spec, acceptance_source="reference"), pc, ["kl"], [0.3], 6) is pc
    assert attach_mentored(spec, pc, ["kl"], [0.0], 6) is pc
    attached = attach_mentored(spec, pc, ["kl"], [0.0, 0.3], cfg.speed.gamma_max)
    assert set(attached.mentored) == {"ngram:2"} and set(attached.mentored["ngram:2"]) == {("mentored", "kl", 0.3)}
    both = attach_mentored(spec, pc, ["kl"], [0.3], cfg.speed.gamma_max, rules=("mentored", "threshold"))
    assert set(both.mentored["ngram:2"]) == {("mentored", "kl", 0.3), ("threshold", "kl", 0.3)}


def test_cluster_location_carries_the_mentored_files(ranked):
    from mdboost.cache import open_or_build_cache
    from mdboost.ranking.scaleout import CacheLocation, score_cached_pair

    tmp, cfg, _ = ranked
    spec = cfg.cache_spec(1.0)
    pc, _ = open_or_build_cache(spec)
    pc = attach_mentored(spec, pc, cfg.md.divergences, cfg.md.budgets, cfg.speed.gamma_max)
    reopened = CacheLocation.of(pc).open(("ngram:2", "tiny"))
    assert {k: str(v) for k, v in reopened.mentored["ngram:2"].items()} == \
        {k: str(v) for k, v in pc.mentored["ngram:2"].items()}
    settings = cfg.score_settings(1.0)
    a = score_cached_pair(pc, "ngram:2", "tiny", settings).rows
    b = score_cached_pair(reopened, "ngram:2", "tiny", settings).rows
    assert [r["predicted_speedup"] for r in a] == [r["predicted_speedup"] for r in b]
