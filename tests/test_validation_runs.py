"""mdboost.validation.runs: merging per-prompt stats and the Rao-Blackwellized acceptance."""

import math

import pytest

from mdboost.engine.stats import GenerationStats
from mdboost.validation.runs import ModeRun, expected_acceptance, merge_stats


def _stats(rows, probs, divergences):
    """Stats of drafts ``rows = [(drafted, accepted), ...]`` with per-position P_acc lists."""
    s = GenerationStats(mode="md", budget=0.1)
    s.add_position_counts([d for d, _ in rows], [a for _, a in rows])
    for p in probs:
        s.add_acceptance_probabilities(p)
    s.num_solved_positions, s.divergence_sum = len(divergences), sum(divergences)
    return s


def test_merge_sums_per_position_lists_of_different_lengths():
    a = _stats([(2, 1), (2, 2)], [[0.5, 0.4], [0.7, 0.9]], [0.01, 0.03])
    b = _stats([(3, 0)], [[0.2, float("nan"), float("nan")]], [0.02])
    m = merge_stats([a, b])
    assert m.draft_tokens_per_position == [3, 3, 1] and m.accepted_tokens_per_position == [2, 1, 0]
    assert m.acceptance_probability_sum_per_position == pytest.approx([1.4, 1.3, 0.0])
    assert m.acceptance_probability_count_per_position == [3, 2, 0]
    assert m.num_solved_positions == 3 and m.mean_divergence == pytest.approx(0.02)
    assert expected_acceptance(m) == pytest.approx(1.4 / 3)
    assert ModeRun(m).metrics()["expected_acceptance"] == pytest.approx(1.4 / 3)
    assert ModeRun(m).metrics()["realized_acceptance"] == pytest.approx(2 / 3)


def test_expected_acceptance_is_nan_when_not_every_first_draft_has_p_acc():
    partial = _stats([(1, 1), (1, 0)], [[0.6]], [0.01])  # "needed": one draft unsolved
    assert math.isnan(expected_acceptance(partial))
    assert math.isnan(expected_acceptance(GenerationStats()))
    with pytest.raises(ValueError, match="parts"):
        merge_stats([])


def test_interleaved_modes_equal_separate_runs():
    """run_modes interleaves modes per prompt; each mode's outputs equal a separate run's."""
    import torch

    from mdboost.models.tiny import tiny_llama
    from mdboost.validation.runs import run_mode, run_modes

    target, drafter = tiny_llama(seed=0), tiny_llama(seed=1)
    prompts = [torch.tensor([1, 5, 7]), torch.tensor([2, 9, 4, 3])]
    common = dict(max_new_tokens=6, temperature=1.0, gamma=2, seed=3)
    modes = {"ar": dict(mode="ar"), "sd": dict(mode="sd", drafter=drafter),
             "md": dict(mode="md", drafter=drafter, max_divergence=0.2)}
    runs = run_modes(target, prompts, modes, **common)
    for name, kwargs in modes.items():
        alone = run_mode(target, prompts, **kwargs, **common)
        assert runs[name].outputs == alone.outputs
        assert runs[name].stats.num_accepted_tokens == alone.stats.num_accepted_tokens
    with pytest.raises(ValueError, match="modes"):
        run_modes(target, prompts, {})


def test_passes_repeat_the_same_generations():
    """passes=2 runs the interleaved sequence twice with the same seeds: the second pass makes the
    first's tokens, each pass's stats are a single run's, and the merged stats sum the passes."""
    import torch

    from mdboost.models.tiny import tiny_llama
    from mdboost.validation.runs import run_modes

    target, drafter = tiny_llama(seed=0), tiny_llama(seed=1)
    prompts = [torch.tensor([1, 5, 7]), torch.tensor([2, 9, 4, 3])]
    common = dict(max_new_tokens=6, temperature=1.0, gamma=2, seed=3)
    modes = {"ar": dict(mode="ar"), "md": dict(mode="md", drafter=drafter, max_divergence=0.2)}
    once = run_modes(target, prompts, modes, **common)
    twice = run_modes(target, prompts, modes, passes=2, **common)
    for name in modes:
        assert twice[name].outputs == once[name].outputs * 2
        assert len(twice[name].passes) == 2 and len(once[name].passes) == 1
        for part in twice[name].passes:
            assert part.num_accepted_tokens == once[name].stats.num_accepted_tokens
            assert part.num_target_calls == once[name].stats.num_target_calls
        assert twice[name].stats.num_new_tokens == 2 * once[name].stats.num_new_tokens
        assert twice[name].stats.time_total == pytest.approx(sum(p.time_total for p in twice[name].passes))
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match=f"passes must be a positive integer, got {bad!r}"):
            run_modes(target, prompts, modes, passes=bad, **common)


def test_a_cell_of_another_rule_runs_that_rule():
    """A ranking row of another rule than MD on sampled drafts runs with GenerationSettings.rule
    (mdboost.ranking.rule_points.row_rule); MD rows keep their budget arguments."""
    from types import SimpleNamespace

    from mdboost.md.rules import Block, Mentored, Threshold
    from mdboost.validation.points import _cell_modes

    pool = {"d": SimpleNamespace(kind="model", model="the drafter model")}
    base = {"drafter": "d", "gamma": "3", "md_solve": "needed", "divergence": "kl"}
    threshold = _cell_modes(dict(base, rule="threshold", drafting="greedy", max_divergence="0.2"), pool)
    assert threshold["mode"] == "md" and threshold["rule"] == Threshold.for_budget(0.2, "kl")
    block = _cell_modes(dict(base, rule="block", drafting="sampled", max_divergence="0"), pool)
    assert block["mode"] == "sd" and block["rule"] == Block()
    greedy_md = _cell_modes(dict(base, rule="mentored", drafting="greedy", max_divergence="0.5"), pool)
    assert greedy_md["rule"] == Mentored(max_divergence=0.5, drafting="greedy")
    md = _cell_modes(dict(base, rule="mentored", drafting="sampled", max_divergence="0.5"), pool)
    assert md == dict(mode="md", drafter="the drafter model", gamma=3, max_divergence=0.5, divergence="kl",
                      md_solve="needed")
    settings, _ = __import__("mdboost.validation.runs", fromlist=["_mode_arguments"])._mode_arguments(
        {k: v for k, v in threshold.items() if k != "drafter"} | {"drafter": None, "mode": "ar"})
    assert settings.rule == threshold["rule"] and settings.greedy_drafts


def test_batched_runs_give_each_prompt_its_own_greedy_output():
    """At batch size 2 (left-padded prompts of different lengths, the last batch smaller) greedy
    decoding gives every prompt the tokens it gets alone, and SD (lossless, greedy) the same tokens;
    the stats count one generation per batch and every row's tokens."""
    import torch

    from mdboost.models.tiny import tiny_llama
    from mdboost.validation.runs import run_modes

    target, drafter = tiny_llama(seed=0), tiny_llama(seed=1)
    prompts = [torch.tensor([1, 5, 7]), torch.tensor([2, 9, 4, 3, 8]), torch.tensor([6, 2])]
    common = dict(max_new_tokens=7, temperature=0.0, gamma=3)
    modes = {"ar": dict(mode="ar"), "sd": dict(mode="sd", drafter=drafter)}
    alone = run_modes(target, prompts, modes, **common)
    batched = run_modes(target, prompts, modes, batch_size=2, **common)
    assert batched["ar"].outputs == alone["ar"].outputs == batched["sd"].outputs
    assert [len(o) for o in batched["ar"].outputs] == [7, 7, 7]
    assert batched["ar"].stats.num_new_tokens == 21
    assert batched["ar"].stats.num_target_calls == 7 * 2  # two batches of 7 steps each
    with pytest.raises(ValueError, match="batch_size"):
        run_modes(target, prompts, modes, batch_size=0, **common)


def _generation(tokens, first, total, longest=None):
    from mdboost.validation.runs import Generation

    stats = GenerationStats(num_new_tokens=tokens, num_target_calls=longest or tokens, time_first_step=first,
                            time_total=total)
    return Generation(stats, longest or tokens)


def test_equal_work_speedup_is_the_tokens_per_second_ratio_at_equal_lengths():
    """Where the cell and plain decoding make the same lengths, plain decoding's time at the cell's
    lengths is its own time: the equal-work speedup is the ratio of tokens per second exactly."""
    from mdboost.validation.runs import equal_work_speedup

    ar = [_generation(8, 0.5, 1.2), _generation(5, 0.3, 0.9), _generation(1, 0.4, 0.4)]
    cell = [_generation(8, 0.6, 1.0), _generation(5, 0.35, 0.8), _generation(1, 0.5, 0.5)]
    tps = sum(g.stats.num_new_tokens for g in cell) / sum(g.stats.time_total for g in cell)
    ar_tps = sum(g.stats.num_new_tokens for g in ar) / sum(g.stats.time_total for g in ar)
    assert equal_work_speedup(cell, ar) == pytest.approx(tps / ar_tps, rel=1e-12)


def test_equal_work_speedup_prices_plain_decoding_at_the_cells_lengths():
    """A cell that stops at EOS early is compared with plain decoding's prefill and as many of its
    steps: computed by hand, per batch, and a plain run with one step takes the pooled step."""
    from mdboost.validation.runs import equal_work_speedup

    ar = [_generation(11, 1.0, 2.0), _generation(1, 0.8, 0.8), _generation(5, 0.5, 1.3)]  # steps 0.1, -, 0.2
    cell = [_generation(6, 1.1, 1.3), _generation(3, 0.9, 1.0), _generation(9, 0.6, 2.0, longest=7)]
    pooled = (1.0 + 0.8) / (10 + 4)
    plain = (1.0 + 5 * 0.1) + (0.8 + 2 * pooled) + (0.5 + 6 * 0.2)
    assert equal_work_speedup(cell, ar) == pytest.approx(plain / (1.3 + 1.0 + 2.0), rel=1e-12)
    # no plain generation ran a second step: a cell of one token per batch needs none
    ones = [_generation(1, 0.8, 0.8), _generation(1, 0.5, 0.5)]
    assert equal_work_speedup([_generation(1, 0.4, 0.4), _generation(1, 0.9, 0.9)], ones) == pytest.approx(1.3 / 1.3)
    assert math.isnan(equal_work_speedup([_generation(2, 0.4, 0.6), _generation(1, 0.9, 0.9)], ones))
    with pytest.raises(ValueError, match="cell and ar must hold the same batches"):
        equal_work_speedup(cell, ar[:2])


def test_run_modes_records_each_generation_and_its_first_step():
    """run_modes keeps every generation of every pass in order: its stats (the first step timed
    within the call) and its longest row, which is the row's new tokens at batch size 1."""
    import torch

    from mdboost.models.tiny import tiny_llama
    from mdboost.validation.runs import run_modes

    target, drafter = tiny_llama(seed=0), tiny_llama(seed=1)
    prompts = [torch.tensor([1, 5, 7]), torch.tensor([2, 9, 4, 3]), torch.tensor([4])]
    runs = run_modes(target, prompts, {"ar": dict(mode="ar"), "sd": dict(mode="sd", drafter=drafter)},
                     max_new_tokens=5, temperature=1.0, gamma=2, seed=1, passes=2, eos_token_id=3)
    for run in runs.values():
        assert len(run.generations) == 2 and all(len(part) == len(prompts) for part in run.generations)
        for part, merged in zip(run.generations, run.passes):
            assert [g.longest for g in part] == [g.stats.num_new_tokens for g in part]
            assert sum(g.stats.num_new_tokens for g in part) == merged.num_new_tokens
            assert all(0 < g.stats.time_first_step <= g.stats.time_total for g in part)
        assert [len(o) for o in run.outputs] == [g.longest for part in run.generations for g in part]


def test_target_nll_scores_a_repeated_output_once_and_counts_it_each_time():
    """The outputs of a validation's passes repeat (same seeds, same tokens): each distinct
    (prompt, continuation) is scored once and weighted by its count. Reference: the mean NLL
    computed here token by token from the model's own log-softmax."""
    import torch

    from mdboost.models.tiny import tiny_llama
    from mdboost.validation.runs import target_nll

    model = tiny_llama(seed=0).eval()
    calls = []
    model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(1), with_kwargs=True)
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 5])]
    conts = [[7, 8], [9]]

    def nll(ids, cont):
        seq = torch.tensor([ids.tolist() + cont])
        with torch.no_grad():
            logp = torch.log_softmax(model(seq).logits[0].float(), -1)
        return [-float(logp[ids.numel() - 1 + j, t]) for j, t in enumerate(cont)]

    terms = nll(prompts[0], conts[0]) * 3 + nll(prompts[1], conts[1])  # the first pair three times
    calls.clear()
    with torch.no_grad():
        got = target_nll(model, [prompts[0], prompts[1], prompts[0], prompts[0]], [conts[0], conts[1], conts[0], conts[0]])
    assert len(calls) == 2 and got == pytest.approx(sum(terms) / len(terms), rel=1e-6)
