"""Prompt-lookup drafter: exact expected drafts, fallbacks, lookback, errors."""

import pytest
import torch

from mdboost.models.ngram import NO_PROPOSAL, NgramDrafter


def t(*ids):
    return torch.tensor(ids, dtype=torch.long)


@pytest.mark.parametrize(
    "context, n, k, expected",
    [
        ((1, 2, 3, 4, 5, 1, 2, 3), 3, 4, (4, 5, 1, 2)),  # full-length match, copy runs on
        ((1, 2, 3, 1, 2, 3), 3, 5, (1, 2, 3, 1, 2)),  # periodic context, periodic draft
        ((5, 1, 2, 9, 7, 1, 2), 3, 3, (9, 7, 1)),  # falls back to the 2-token suffix
        ((4, 8, 9, 8, 6, 8), 3, 2, (6, 8)),  # 1-token suffix, most recent occurrence (index 3)
        ((1, 2, 3, 4), 3, 3, ()),  # no earlier occurrence of any suffix
        ((7,), 3, 3, ()),  # a single token has nothing to match
        ((7, 7), 3, 3, (7, 7, 7)),
        ((1, 2, 3, 1, 2, 3), 3, 0, ()),  # zero draft length
    ],
)
def test_exact_drafts(context, n, k, expected):
    draft = NgramDrafter(n).propose(t(*context), k)
    assert draft.dtype == torch.long
    assert draft.tolist() == list(expected)


def test_longest_suffix_wins_over_more_recent_shorter_match():
    # suffix (1, 2) occurred at index 0 (followed by 5); the single token 2 occurred later at 4 (followed by 6)
    ctx = t(1, 2, 5, 0, 2, 6, 1, 2)
    assert NgramDrafter(2).propose(ctx, 1).tolist() == [5]
    assert NgramDrafter(1).propose(ctx, 1).tolist() == [6]


def test_max_lookback_limits_the_search():
    ctx = t(1, 2, 3, 9, 9, 9, 9, 1, 2, 3)
    assert NgramDrafter(3).propose(ctx, 2).tolist() == [9, 9]
    assert NgramDrafter(3, max_lookback=6).propose(ctx, 2).tolist() == []


def test_matches_brute_force_on_random_contexts():
    gen = torch.Generator().manual_seed(0)
    drafter = NgramDrafter(3)
    for _ in range(200):
        ctx = torch.randint(0, 4, (int(torch.randint(1, 15, (1,), generator=gen)),), generator=gen)
        ids = ctx.tolist()
        expected = []
        for m in range(min(3, len(ids) - 1), 0, -1):
            starts = [j for j in range(len(ids) - m) if ids[j:j + m] == ids[len(ids) - m:]]
            if starts:
                buf = list(ids)
                src = starts[-1] + m
                for i in range(4):
                    buf.append(buf[src + i])
                expected = buf[len(ids):]
                break
        assert drafter.propose(ctx, 4).tolist() == expected, ids


def test_propose_all_rows_equal_prefix_proposals():
    ctx = t(1, 2, 1, 2, 3)
    table = NgramDrafter(3).propose_all(ctx, 2)
    assert table.tolist() == [[-1, -1], [-1, -1], [2, 1], [1, 2], [-1, -1]]
    assert NO_PROPOSAL == -1


@pytest.mark.parametrize("kwargs", [dict(n=0), dict(n=1.5), dict(max_lookback=1)])
def test_bad_constructor_arguments(kwargs):
    with pytest.raises(ValueError):
        NgramDrafter(**kwargs)


def test_bad_inputs():
    with pytest.raises(ValueError, match="input_ids"):
        NgramDrafter().propose(torch.zeros(2, 3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="input_ids"):
        NgramDrafter().propose(torch.zeros(3), 2)
    with pytest.raises(ValueError, match="num_tokens"):
        NgramDrafter().propose(t(1, 2), -1)
