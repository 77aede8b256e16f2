"""Model-free drafter: prompt lookup (n-gram copy from the context).

The draft continues the most recent earlier occurrence of the context's last ``n`` tokens
(falling back to shorter suffixes, down to one token). It is deterministic, so its draft
distribution is one-hot; mentored decoding accepts the proposed token ``x`` with probability
``min(1, (1 + a) q_x)`` (``docs/theory.md``, "Sampling at (a, b)", with
``p_x = 1``). It costs almost nothing,
which makes it the pool member most likely to give real speedups on CPU, especially on code.
"""

from __future__ import annotations

import torch

from mdboost.md._checks import check_positive_int

NO_PROPOSAL = -1  # placeholder token id for "no draft" in padded tensors


class NgramDrafter:
    """Prompt-lookup drafter.

    Parameters
    ----------
    n : int, default=3
        Longest suffix length to match, ``>= 1``. When the last ``n`` tokens never occurred
        before, suffixes of length ``n - 1, ..., 1`` are tried in turn; the first (longest)
        suffix with an earlier occurrence wins, and among its occurrences the most recent one.
    max_lookback : int or None, default=None
        Only search the last ``max_lookback`` tokens of the context (``None``: all of it).

    Notes
    -----
    The continuation is copied LZ77-style: if the matched occurrence ends close to the end of
    the context, the copy runs on into the tokens it has just proposed, so a periodic context
    yields a full-length periodic draft. With a match the draft therefore always has
    ``num_tokens`` tokens; without one it is empty.
    """

    kind = "ngram"

    def __init__(self, n: int = 3, max_lookback: int | None = None):
        self.n = check_positive_int("n", n, allow_none=False)  # integral floats and tensors too; NaN, inf refused
        self.max_lookback = check_positive_int("max_lookback", max_lookback)
        if self.max_lookback is not None and self.max_lookback < 2:
            raise ValueError(f"max_lookback must be an integer >= 2 or None, got {max_lookback!r}")

    def __repr__(self) -> str:
        return f"NgramDrafter(n={self.n}, max_lookback={self.max_lookback})"

    def match(self, input_ids: torch.Tensor) -> tuple[int, int] | None:  # input_ids: [T]
        """Return ``(start, length)`` of the chosen earlier occurrence, or ``None``.

        ``start`` indexes ``input_ids`` (after the lookback window is applied).
        """
        ids = self._check(input_ids)
        offset = 0
        if self.max_lookback is not None and ids.numel() > self.max_lookback:
            offset = ids.numel() - self.max_lookback
            ids = ids[offset:]
        total = ids.numel()
        for m in range(min(self.n, total - 1), 0, -1):
            windows = ids.unfold(0, m, 1)[:-1]  # [T - m, m]: every window but the suffix itself
            hits = (windows == ids[total - m:]).all(dim=1).nonzero()
            if hits.numel():
                return offset + int(hits[-1]), m
        return None

    def propose(self, input_ids: torch.Tensor, num_tokens: int) -> torch.Tensor:  # [T] -> [k]
        """Propose up to ``num_tokens`` next tokens for the context ``input_ids``.

        Parameters
        ----------
        input_ids : torch.LongTensor of shape (T,)
            The context (prompt plus tokens generated so far).
        num_tokens : int
            Draft length, ``>= 0``.

        Returns
        -------
        torch.LongTensor of shape (k,)
            ``k == num_tokens`` when a suffix of the context occurred earlier, else ``k == 0``.
            On the device of ``input_ids``.
        """
        if int(num_tokens) != num_tokens or num_tokens < 0:
            raise ValueError(f"num_tokens must be a non-negative integer, got {num_tokens!r}")
        ids = self._check(input_ids)
        found = self.match(ids) if num_tokens else None
        if found is None:
            return ids.new_empty(0)
        start, m = found
        source = start + m  # first token after the occurrence; always <= T - 1
        total = ids.numel()
        period = total - source  # the copy repeats with this period once it runs past the end
        index = source + torch.arange(num_tokens, device=ids.device) % period
        return ids[index]

    def propose_all(self, input_ids: torch.Tensor, num_tokens: int = 1) -> torch.Tensor:  # [T] -> [T, L]
        """Proposals for every prefix: row ``t`` is ``propose(input_ids[:t + 1], num_tokens)``.

        Rows without a match are filled with ``NO_PROPOSAL`` (-1). Used by the logit cache.
        """
        ids = self._check(input_ids)
        out = torch.full((ids.numel(), num_tokens), NO_PROPOSAL, dtype=torch.long, device=ids.device)
        for t in range(ids.numel()):
            draft = self.propose(ids[: t + 1], num_tokens)
            out[t, : draft.numel()] = draft
        return out

    @staticmethod
    def _check(input_ids) -> torch.Tensor:
        if not torch.is_tensor(input_ids) or input_ids.ndim != 1:
            shape = tuple(input_ids.shape) if torch.is_tensor(input_ids) else type(input_ids).__name__
            raise ValueError(f"input_ids must be a 1-D LongTensor [T], got {shape}")
        if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
        return input_ids.long()
