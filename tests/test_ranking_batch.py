"""The batched speed model (mdboost.ranking.batch) and the step-count law against exhaustive enumeration."""

import itertools

import numpy as np
import pytest
import torch

from mdboost.ranking.batch import batch_totals, expected_max, expected_max_of
from mdboost.ranking.process import run_process, step_count_law
from tests.test_ranking_process import _loop


def _outcome_tables(chain: np.ndarray, length: int):
    """Every outcome table of a row (draft i of a step at s accepted or not) with its probability."""
    width = chain.shape[1]
    for bits in itertools.product((0, 1), repeat=length * width):
        table = np.array(bits).reshape(length, width)
        prob = float(np.prod(np.where(table == 1, chain[:length], 1 - chain[:length])))
        if prob:
            yield table, prob


def _steps_law(chain, gamma, offered, length) -> dict:
    law = {}
    for table, prob in _outcome_tables(chain, length):
        starts, *_ = _loop(table, length, gamma, offered)
        law[len(starts)] = law.get(len(starts), 0.0) + prob
    return law


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_step_count_law_equals_exhaustive_enumeration(gamma):
    gen = torch.Generator().manual_seed(10 + gamma)
    length, width = 5, 3
    chain = torch.rand(3, length + 1, width, generator=gen, dtype=torch.float64)
    chain[0, 1, 0] = 1.0
    offered = torch.randint(0, width + 1, (3, length + 1), generator=gen)
    offered[2] = width
    lengths = torch.tensor([length, length - 2, length])
    law = step_count_law(chain, gamma, draft_len=offered, lengths=lengths)
    res = run_process(chain, gamma, draft_len=offered, lengths=lengths)
    for b in range(3):
        n = int(lengths[b])
        expected = _steps_law(chain[b].numpy(), gamma, offered[b].tolist(), n)
        want = np.zeros(law.shape[1])
        for j, pr in expected.items():
            want[j] = pr
        np.testing.assert_allclose(law[b].numpy(), want, atol=1e-12)
        # its mean is the process's expected steps
        assert float((law[b] * torch.arange(law.shape[1])).sum()) == pytest.approx(float(res.steps[b]), abs=1e-12)


def test_step_count_law_with_a_floor_matches_the_process():
    chain = torch.full((1, 6, 3), 0.6, dtype=torch.float64)
    floor = torch.tensor([[2, 1, 0, 3, 1, 2]])
    law = step_count_law(chain, 3, floor_len=floor)
    res = run_process(chain, 3, floor_len=floor)
    assert float(law.sum()) == pytest.approx(1.0, abs=1e-12)
    assert float((law[0] * torch.arange(law.shape[1])).sum()) == pytest.approx(float(res.steps[0]), abs=1e-12)


def test_a_row_of_length_zero_takes_no_step():
    law = step_count_law(torch.full((2, 3, 2), 0.5, dtype=torch.float64), 2, lengths=torch.tensor([0, 3]))
    assert law[0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_expected_max_of_equals_enumerating_the_draws():
    values = torch.tensor([3.0, 1.0, 4.0, 1.5], dtype=torch.float64)
    weights = torch.tensor([[1.0, 2.0, 0.5, 1.5], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    for b in (1, 2, 3):
        got = expected_max_of(values, weights, b)
        for r in range(2):
            w = (weights[r] / weights[r].sum()).tolist()
            brute = sum(np.prod([w[i] for i in idx]) * max(float(values[i]) for i in idx)
                        for idx in itertools.product(range(4), repeat=b))
            assert float(got[r]) == pytest.approx(brute, abs=1e-12)


def test_expected_max_refuses_a_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        expected_max(torch.tensor([1.0]), 0)


def test_batch_steps_equal_enumerating_batches_of_independent_rows():
    """Two sequences, rows drawn i.i.d. from them (weights 1 : 3): the expected steps of a batch of
    two (the slowest row's) equal the enumeration over compositions and outcome tables."""
    gen = torch.Generator().manual_seed(3)
    length, gamma = 4, 2
    chain = torch.rand(2, length, gamma, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([4, 3])
    res = run_process(chain, gamma, lengths=lengths)
    law = step_count_law(chain, gamma, lengths=lengths)
    weights = torch.tensor([[1.0, 3.0]], dtype=torch.float64)

    def mix(x):  # [n, ...] -> [1, ...]
        return torch.einsum("rb,b...->r...", weights, x) / weights.sum()

    totals = batch_totals(mix, res.steps, res.steps_by_draft_len, res.steps_by_forwards, res.draft_tokens, 2, law)
    laws = [_steps_law(chain[b].numpy(), gamma, [gamma] * length, int(lengths[b])) for b in range(2)]
    w = [0.25, 0.75]
    brute = 0.0
    for i, j in itertools.product(range(2), repeat=2):
        for (ni, pi), (nj, pj) in itertools.product(laws[i].items(), laws[j].items()):
            brute += w[i] * w[j] * pi * pj * max(ni, nj)
    assert float(totals.steps[0]) == pytest.approx(brute, abs=1e-12)
    # the widest draft of a step: P(max of two rows' K <= k) = F(k)^2 over the steps' mixture
    hist = mix(res.steps_by_draft_len)[0]
    cdf = hist.cumsum(-1) / hist.sum()
    want = torch.diff(cdf ** 2, prepend=torch.zeros(1, dtype=torch.float64))
    torch.testing.assert_close(totals.steps_by_draft_len[0] / totals.steps[0], want)


def test_a_batch_of_one_is_the_pooled_single_sequence_model():
    gen = torch.Generator().manual_seed(5)
    chain = torch.rand(3, 7, 3, generator=gen, dtype=torch.float64)
    floor = torch.randint(0, 4, (3, 7), generator=gen)
    res = run_process(chain, 3, lengths=torch.tensor([7, 5, 6]), floor_len=floor)
    weights = torch.tensor([[1.0, 2.0, 0.0]], dtype=torch.float64)

    def mix(x):
        return torch.einsum("rb,b...->r...", weights, x) / weights.sum()

    totals = batch_totals(mix, res.steps, res.steps_by_draft_len, res.steps_by_forwards, res.draft_tokens, 1)
    torch.testing.assert_close(totals.steps, mix(res.steps))
    torch.testing.assert_close(totals.steps_by_draft_len, mix(res.steps_by_draft_len))
    torch.testing.assert_close(totals.drafter_forwards, mix(res.drafter_forwards))
    torch.testing.assert_close(totals.solved, mix(res.draft_tokens))
    # and through the step law the same (E[max of 1] is the mean)
    law = step_count_law(chain, 3, lengths=torch.tensor([7, 5, 6]), floor_len=floor)
    torch.testing.assert_close(expected_max(mix(law.cumsum(-1)), 1), mix(res.steps))
