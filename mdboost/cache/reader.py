"""Read a logit cache: top-k entries, exact normalizers, and dense or sparse distributions.

Rows are cached positions: row ``r`` predicts ``true_tokens()[r]`` from its prefix in sequence
``row_sequence()[r]``. Temperature and the top-k approximation (documented in
``docs/models_and_cache.md``):

- Logits are cached at temperature 1. The top-k *set* is the same at every ``T > 0``, and the
  build stores the exact ``logsumexp(logits / T)`` for each requested temperature, so kept
  probabilities ``exp(l_i / T - lse_T)`` are exact at those temperatures; the tail mass
  ``1 - sum(kept)`` is then known exactly too. At ``T = 0`` (greedy) the argmax is kept.
- ``tail="drop"`` renormalizes over the top-k (this IS ``logits_to_probs(logits, T, top_k=k)``,
  works at any ``T``); ``tail="uniform"`` keeps exact kept probabilities and spreads the known
  tail mass uniformly over the other tokens (needs the stored ``logsumexp`` at ``T``);
  ``tail="full"`` uses the kept full-vocabulary logits (exact; needs ``keep_full``).
- Either approximation ``p_hat`` is within total variation ``tail_p`` of the full distribution,
  so an acceptance ``1 - TV(p, q)`` computed from cached entries is within
  ``tail_p + tail_q`` of the exact one (tested against the full path).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from mdboost.md.probs import logits_to_probs

from .manifest import TOKENS, CacheCorruptionError, check_layout, lse_key, read_manifest, shard_name, verify_shards

TAILS = ("drop", "uniform", "full")


class LogitCache:
    """A finished logit cache (see :func:`mdboost.cache.build.build_cache`)."""

    def __init__(self, out_dir: Path, manifest: dict, tokens: dict):
        self.out_dir, self.manifest, self._tokens = out_dir, manifest, tokens
        self._data: dict = {}
        counts = (tokens["row_offsets"][1:] - tokens["row_offsets"][:-1])
        self._row_seq = torch.repeat_interleave(torch.arange(counts.numel()), counts)

    @classmethod
    def open(cls, out_dir: str | os.PathLike, verify: bool = True) -> "LogitCache":
        """Open ``out_dir``; with ``verify`` every shard's SHA-256 is checked first.

        Always checked: the manifest (valid JSON, its own checksum) and its layout against the
        token file (:func:`~mdboost.cache.manifest.check_layout`); shards are checked again for
        their row counts and widths when read. Anything off raises
        :class:`~mdboost.cache.manifest.CacheCorruptionError` naming the file.
        """
        out_dir = Path(out_dir)
        manifest = read_manifest(out_dir)
        if not manifest.get("complete"):
            raise ValueError(f"out_dir {str(out_dir)!r} holds an unfinished cache; run build_cache again to resume it")
        bad = verify_shards(out_dir, manifest) if verify else []
        if bad:
            raise CacheCorruptionError(f"corrupted or missing cache shards in {out_dir}: {bad}; rebuild it "
                                       "(build_cache resumes it; or delete the folder and run again)")
        tokens = _load(out_dir / TOKENS)
        check_layout(out_dir, manifest, tokens)
        cache = cls(out_dir, manifest, tokens)
        if verify:
            cache._check_headers()
        return cache

    # ---- layout -------------------------------------------------------------------------
    @property
    def members(self) -> list[str]:
        return [m["name"] for m in self.manifest["members"]]

    @property
    def num_rows(self) -> int:
        return int(self._tokens["row_offsets"][-1])

    @property
    def num_sequences(self) -> int:
        return int(self._tokens["starts"].numel())

    @property
    def k(self) -> int:
        return int(self.manifest["k"])

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    def kind(self, member: str) -> str:
        return self._info(member)["kind"]

    def true_tokens(self) -> torch.Tensor:  # [R]
        return self._tokens["true_next"].long()

    def row_sequence(self) -> torch.Tensor:  # [R]
        """Sequence index of every row."""
        return self._row_seq.clone()

    def row_position(self) -> torch.Tensor:  # [R]
        """Position (within its sequence) of the token each row predicts."""
        starts = self._tokens["starts"][self._row_seq]
        first = self._tokens["row_offsets"][self._row_seq]
        return starts + torch.arange(self.num_rows) - first

    def prompt_lengths(self) -> torch.Tensor:  # [num_sequences]
        """Tokens before each sequence's first row (its prompt, as encoded), per sequence."""
        return self._tokens["starts"].long()

    def sequence(self, index: int) -> tuple[torch.Tensor, int]:
        """``(ids [T], start)`` of sequence ``index``; rows predict ``ids[start:]``."""
        if not 0 <= index < self.num_sequences:
            raise ValueError(f"index must be in [0, {self.num_sequences}), got {index!r}")
        a, b = self._tokens["seq_offsets"][index:index + 2].tolist()
        return self._tokens["ids"][a:b].long(), int(self._tokens["starts"][index])

    # ---- raw per-member tensors -----------------------------------------------------------
    def topk(self, member: str, rows=None) -> tuple[torch.Tensor, torch.Tensor]:  # [R, k], [R, k]
        """Top-k token ids (long) and logits (float32), best first."""
        return self._get(member, "topk_ids", rows).long(), self._get(member, "topk_logits", rows).float()

    def logsumexp(self, member: str, rows=None, temperature: float = 1.0) -> torch.Tensor:  # [R]
        """Exact full-vocabulary ``logsumexp(logits / temperature)`` (stored temperatures only)."""
        if float(temperature) not in self.manifest["temperatures"]:
            raise ValueError(f"temperature {temperature!r} not cached; stored: {self.manifest['temperatures']}")
        return self._get(member, lse_key(temperature), rows)

    def true_logit(self, member: str, rows=None) -> torch.Tensor:  # [R]
        return self._get(member, "true_logit", rows)

    def logit_sum(self, member: str, rows=None) -> torch.Tensor:  # [R]
        """Sum of all ``V`` logits (boosting's ``S``)."""
        return self._get(member, "logit_sum", rows)

    def full_logits(self, member: str, rows=None) -> torch.Tensor:  # [R, V]
        if not self.manifest["keep_full"]:
            raise ValueError("full logits were not kept; build with keep_full=True")
        return self._get(member, "full_logits", rows).float()

    def ngram_proposals(self, member: str, rows=None) -> torch.Tensor:  # [R, L]
        """Proposed tokens per row (``-1`` padded; row of ``-1`` = no proposal)."""
        if self.kind(member) != "ngram":
            raise ValueError(f"member {member!r} is not an ngram drafter")
        return self._get(member, "proposals", rows).long()

    # ---- distributions --------------------------------------------------------------------
    def kept_probs(self, member: str, rows=None, temperature: float = 1.0, tail: str = "uniform"):
        """``(ids [R, k], probs [R, k], tail_mass [R])`` of a model member at ``temperature``."""
        if tail not in ("drop", "uniform"):
            raise ValueError(f"tail must be 'drop' or 'uniform' here, got {tail!r}")
        if self.kind(member) == "ngram":
            raise ValueError(f"member {member!r} is an ngram drafter: use ngram_proposals or pair_probs")
        ids, logits = self.topk(member, rows)
        if temperature == 0:
            probs = torch.zeros_like(logits)
            probs[:, 0] = 1.0
        elif tail == "drop":
            probs = torch.softmax(logits / temperature, dim=-1)
        else:
            probs = torch.exp(logits / temperature - self.logsumexp(member, rows, temperature)[:, None])
        return ids, probs, (1.0 - probs.sum(-1)).clamp_min(0.0)

    def probs(self, member: str, rows=None, temperature: float = 1.0, tail: str = "drop") -> torch.Tensor:  # [R, V]
        """Dense ``[R, V]`` distributions (see the module docstring for ``tail``)."""
        if tail not in TAILS:
            raise ValueError(f"tail must be one of {TAILS}, got {tail!r}")
        if tail == "full":
            return logits_to_probs(self.full_logits(member, rows), temperature)
        ids, kept, rest = self.kept_probs(member, rows, temperature, tail)
        fill = rest / max(self.vocab_size - ids.shape[1], 1)
        dense = fill[:, None].expand(-1, self.vocab_size).clone() if tail == "uniform" else torch.zeros(ids.shape[0], self.vocab_size)
        return dense.scatter_(1, ids, kept)

    def sparse(self, member: str, rows=None, temperature: float = 1.0, tail: str = "drop"):
        """A member's kept entries: ``(ids [R, k], log-probs [R, k], tail mass [R], valid [R])``.

        ``tail="drop"``: the top-k renormalized, tail mass 0; ``"uniform"``: the exact kept
        probabilities and their tail mass. An ngram is one-hot on its first proposal (``-1``,
        invalid: no proposal). :func:`mdboost.ranking.support.pair_probs` puts two members on
        their common support.
        """
        if self.kind(member) == "ngram":
            first = self.ngram_proposals(member, rows)[:, :1]  # [R, 1]
            logp = torch.where(first >= 0, 0.0, float("-inf")).double()
            return first, logp, torch.zeros(first.shape[0], dtype=torch.float64), first[:, 0] >= 0
        ids, kept, rest = self.kept_probs(member, rows, temperature, tail)
        spread = rest if tail == "uniform" else torch.zeros_like(rest)
        return ids, kept.double().log(), spread.double(), torch.ones(ids.shape[0], dtype=torch.bool)

    # ---- internals ------------------------------------------------------------------------
    def _info(self, member: str) -> dict:
        for info in self.manifest["members"]:
            if info["name"] == member:
                return info
        raise ValueError(f"member {member!r} is not in this cache; members: {self.members}")

    def _get(self, member: str, key: str, rows):
        self._info(member)
        if (member, key) not in self._data:
            count = -(-self.num_sequences // self.manifest["shard_size"])
            parts = []
            for index in range(count):
                path = self.out_dir / shard_name(member, index)
                shard = _load(path)
                if key not in shard:
                    raise ValueError(f"member {member!r} has no {key!r} in this cache")
                self._check_shape(path, key, tuple(shard[key].shape), self._shard_rows(index))
                parts.append(shard[key])
            self._data[member, key] = torch.cat(parts)
        data = self._data[member, key]
        return data if rows is None else data[_as_index(rows, self.num_rows)]

    def _shard_rows(self, index: int) -> int:
        size, offsets = self.manifest["shard_size"], self._tokens["row_offsets"]
        return int(offsets[min((index + 1) * size, self.num_sequences)] - offsets[index * size])

    def _check_headers(self) -> None:
        """Every shard's tensor shapes (read from the safetensors headers only) against the manifest."""
        count = -(-self.num_sequences // self.manifest["shard_size"])
        for member in self.members:
            for index in range(count):
                path = self.out_dir / shard_name(member, index)
                with safe_open(str(path), "pt") as fh:
                    for key in fh.keys():
                        self._check_shape(path, key, fh.get_slice(key).get_shape(), self._shard_rows(index))

    def _check_shape(self, path: Path, key: str, shape, rows: int) -> None:
        """A shard tensor must hold its sequences' rows and the manifest's widths."""
        width = {"topk_ids": min(self.k, self.vocab_size), "topk_logits": min(self.k, self.vocab_size),
                 "full_logits": self.vocab_size, "proposals": self.manifest.get("ngram_lookahead")}.get(key)
        shape = tuple(shape)
        if shape[:1] != (rows,) or (width is not None and shape[1:] != (width,)):
            want = (rows,) if width is None else (rows, width)
            raise CacheCorruptionError(f"{path} holds {key!r} of shape {shape}, the manifest implies {want}; "
                                       "rebuild the cache")


def _load(path: Path) -> dict:
    """A safetensors file's tensors; a missing or unreadable file is a :class:`CacheCorruptionError`."""
    try:
        return load_file(str(path))
    except Exception as err:  # a missing file (OSError) or safetensors' own SafetensorError
        raise CacheCorruptionError(f"cannot read {path} ({type(err).__name__}: {err}); rebuild the cache") from None


def _as_index(rows, total: int):
    if isinstance(rows, slice):
        return rows
    index = torch.as_tensor(rows, dtype=torch.long)
    if index.numel() and (index.min() < -total or index.max() >= total):
        raise ValueError(f"rows must index [0, {total}), got values in [{int(index.min())}, {int(index.max())}]")
    return index
