"""Drafter adapters: how the engine gets ``K`` draft tokens and their distribution ``p``.

Two kinds, one interface (``start`` / ``propose`` / ``commit``):

- :class:`ModelDrafter` wraps any causal LM of the pool (a smaller model, an early-exit or
  int8 drafter) with its own KV cache (:class:`mdboost.engine.kv.CachedLM`). It samples each
  draft token from ``p = logits_to_probs(drafter logits)`` with the same settings as the
  target, so ``p`` and ``q`` are comparable (math note, section 1).
- :class:`NgramAdapter` wraps the model-free prompt-lookup drafter: one-hot draft
  distributions, no cache, possibly fewer than ``K`` tokens per row (``lengths``).

The drafter cache holds every token of a row except its "pending" ones (at most two: the last
accepted draft when all ``K`` were accepted, and the token the target emitted). The next
``propose`` feeds the pending tokens in one forward, then one token per draft step.
"""

from __future__ import annotations

import torch

from mdboost.engine.kv import CachedLM, left_pad
from mdboost.md.probs import logits_to_probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:  # [B, V] -> [B]
    """One token per row from ``probs``; exact argmax for one-hot (greedy) rows."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class ModelDrafter:
    """A causal LM drafter with its own KV cache.

    Parameters
    ----------
    model : transformers causal LM
        Must share the target's vocabulary (same logits width).
    """

    kind = "model"

    def __init__(self, model):
        self.model = model
        self._lm: CachedLM | None = None
        self._pending: list[list[int]] = []
        self._fed_pending = 0  # width of the pending chunk fed by the last propose (0: none)
        self._drafts: list[list[int]] = []

    def start(self, prompts: list[list[int]], device: torch.device) -> None:
        """Begin a generation: the whole prompt of each row is pending."""
        self._lm = CachedLM(self.model, len(prompts), device)
        self._pending = [list(p) for p in prompts]
        self._fed_pending = 0

    @torch.no_grad()
    def propose(
        self, k: int, sampling: dict, generator: torch.Generator | None, contexts: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Draft ``k`` tokens per row.

        Returns
        -------
        tokens : torch.LongTensor of shape (B, k)
        probs : torch.Tensor of shape (B, k, V)
            The drafter distribution each token was sampled from.
        lengths : list of int
            Valid drafts per row (always ``k`` here).
        """
        lm, batch = self._lm, len(self._pending)
        device = lm.valid.device
        tokens = torch.empty(batch, k, dtype=torch.long, device=device)
        probs = []
        self._fed_pending = 0
        if k:
            chunk, valid = left_pad(self._pending, 0, device)
            self._fed_pending = chunk.shape[1]
            logits = lm.forward(chunk, valid, logits_to_keep=1)[:, -1]  # [B, V]
            for j in range(k):
                if j:
                    logits = lm.forward(tokens[:, j - 1 : j], logits_to_keep=1)[:, -1]
                probs.append(logits_to_probs(logits, **sampling))
                tokens[:, j] = sample(probs[-1], generator)
        self._drafts = tokens.tolist()
        vocab = self.model.config.get_text_config().vocab_size
        stacked = torch.stack(probs, dim=1) if probs else torch.empty(batch, 0, vocab, device=device)
        return tokens, stacked, [k] * batch

    def commit(self, num_accepted: list[int], new_tokens: list[int]) -> None:
        """Keep each row's pending tokens and accepted drafts; drop the rest."""
        if not self._fed_pending:  # nothing was fed: the new token just joins the pending ones
            for row, tok in zip(self._pending, new_tokens):
                row.append(tok)
            return
        k = len(self._drafts[0])
        fed_drafts = k - 1  # the last draft token was sampled but never fed
        keep = [self._fed_pending + min(n, fed_drafts) for n in num_accepted]
        self._lm.keep(keep)
        self._pending = [
            drafts[min(n, fed_drafts) : n] + [tok]
            for drafts, n, tok in zip(self._drafts, num_accepted, new_tokens)
        ]
        self._fed_pending = 0


class NgramAdapter:
    """Prompt lookup as a drafter: one-hot ``p``, no cache, ``0..K`` tokens per row.

    Parameters
    ----------
    ngram : mdboost.models.ngram.NgramDrafter
        Anything with ``propose(input_ids [T], num_tokens) -> LongTensor [k <= num_tokens]``.
    vocab_size : int
        Width of the one-hot draft distributions (the target's logits width).
    """

    kind = "ngram"

    def __init__(self, ngram, vocab_size: int):
        self.ngram = ngram
        self.vocab_size = int(vocab_size)
        self._device = None

    def start(self, prompts: list[list[int]], device: torch.device) -> None:
        self._device = device

    def propose(
        self, k: int, sampling: dict, generator: torch.Generator | None, contexts: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Up to ``k`` prompt-lookup tokens per row, padded with token 0 (see ``lengths``)."""
        drafts = [self.ngram.propose(torch.tensor(c, dtype=torch.long), k).tolist() if k else [] for c in contexts]
        lengths = [len(d) for d in drafts]
        width = max(lengths, default=0)
        tokens = torch.zeros(len(contexts), width, dtype=torch.long)
        for i, d in enumerate(drafts):
            tokens[i, : len(d)] = torch.tensor(d, dtype=torch.long)
        tokens = tokens.to(self._device)
        probs = torch.zeros(len(contexts), width, self.vocab_size, device=self._device)
        probs.scatter_(-1, tokens.unsqueeze(-1), 1.0)
        return tokens, probs, lengths

    def commit(self, num_accepted: list[int], new_tokens: list[int]) -> None:
        """Nothing to roll back: prompt lookup reads the context afresh each time."""


def as_drafter(drafter, vocab_size: int):
    """Wrap a pool member (causal LM, n-gram drafter, or an adapter) in the drafter interface."""
    if drafter is None or hasattr(drafter, "commit"):
        return drafter
    if hasattr(drafter, "propose"):
        return NgramAdapter(drafter, vocab_size)
    if hasattr(drafter, "config") and callable(drafter):
        width = drafter.config.get_text_config().vocab_size
        if width != vocab_size:
            raise ValueError(f"drafter vocab_size ({width}) must equal the target's ({vocab_size})")
        return ModelDrafter(drafter)
    raise ValueError(f"drafter must be a causal LM, an n-gram drafter or None, got {type(drafter).__name__}")
