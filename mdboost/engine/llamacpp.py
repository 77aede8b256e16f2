"""llama.cpp as the engine's forward passes: a GGUF model behind :class:`~mdboost.engine.kv.CachedLM`'s interface.

mdboost's loop (:func:`mdboost.engine.generate`: drafting, one verification forward, the
rules of :mod:`mdboost.md.rules`, the rollback) needs three things of a model: evaluate a
chunk of tokens after the ones it holds, return the logits of the chunk's last positions, and
forget the entries past a position. llama-cpp-python (0.3.36) exposes all three on a
``llama_cpp.Llama``; :class:`LlamaCppLM` does them the way its own ``Llama.eval`` does
(``llama_cpp/llama.py``, lines 666-702 in 0.3.36):

- the KV entries at and past the row's length are removed first
  (``LlamaContext.kv_cache_seq_rm(-1, n_past, -1)``), so a rollback is only a smaller length;
- the chunk is decoded in batches of ``n_batch`` tokens (``LlamaBatch.set_batch``,
  ``LlamaContext.decode``), with positions ``n_past, n_past + 1, ...``;
- the logits are read from ``llama_get_logits`` after the decode. Unlike ``Llama.eval`` (which
  asks for every position's logits or none, by the constructor's ``logits_all``), only the
  positions the loop reads are flagged (``llama_batch.logits``): a prefill pays for one row of
  the output head, as in ``Llama.generate``, and a verification chunk for its ``K + 1``.

:class:`LlamaCppPool` is a ranked pool as llama.cpp runs it (the target's GGUF, each early exit
as a truncated GGUF, prompt lookup as ever): what the ranking's costs are measured on with
``speed.engine: llamacpp`` and what ``mdboost validate`` runs for such a ranking.

Sampling and verification stay in mdboost (torch, on the CPU): llama.cpp computes logits
only. The backend runs one sequence (llama-cpp-python's ``Llama`` holds one): batch size 1.

:class:`LlamaCppModel` is the GGUF model (a target, or a drafter through
:class:`~mdboost.engine.drafting.ModelDrafter`); its :meth:`LlamaCppModel.open` makes the
per-generation :class:`LlamaCppLM`. ``llama_cpp`` is optional (``pip install mdboost[llamacpp]``,
built from its sdist): importing this module does not need it, opening a model does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mdboost.models.gguf_drafters import gguf_drafter, import_llama_cpp, llama_cpp_available, llamacpp_cannot, llamacpp_model
from mdboost.models.ngram import NgramDrafter
from mdboost.models.specs import parse_drafter

__all__ = ["LlamaCppLM", "LlamaCppMember", "LlamaCppModel", "LlamaCppPool", "llama_cpp_available"]


class LlamaCppModel:
    """A GGUF model run by llama.cpp, for :func:`mdboost.engine.generate` (target or drafter).

    Parameters
    ----------
    model_path : str or path-like
        A GGUF file.
    n_ctx : int, default=2048
        Context length (prompt and generated tokens, drafts included).
    n_threads : int or None, default=None
        CPU threads of a decode (llama.cpp's default: the machine's cores). Timings in mdboost
        use 1.
    n_batch : int, default=512
        Tokens per decode call.
    n_gpu_layers : int, default=0
        Layers offloaded to a GPU build of llama.cpp (0: CPU only).
    llama : llama_cpp.Llama, optional
        An opened model to use instead of opening ``model_path`` (its ``n_ctx`` and threads apply).

    Notes
    -----
    Use it as ``generate(LlamaCppModel("model.gguf", n_threads=1), input_ids, settings)`` (run in
    ``tests/test_llamacpp_backend.py`` on the default GGUF when llama-cpp-python is installed).
    """

    def __init__(self, model_path=None, *, n_ctx: int = 2048, n_threads: int | None = None, n_batch: int = 512,
                 n_gpu_layers: int = 0, llama=None):
        for name, value, low in (("n_ctx", n_ctx, 8), ("n_batch", n_batch, 1), ("n_gpu_layers", n_gpu_layers, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1):
            raise ValueError(f"n_threads must be an int >= 1 or None, got {n_threads!r}")
        if llama is None:
            if model_path is None:
                raise ValueError("model_path must name a GGUF file (or pass llama=), got None")
            path = Path(os.fspath(model_path))
            if not path.is_file():
                raise FileNotFoundError(f"model_path {str(path)!r} is not a file (a GGUF model)")
            llama_cpp = import_llama_cpp("the llama.cpp backend")
            llama = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                                    n_threads_batch=n_threads, n_gpu_layers=n_gpu_layers, logits_all=False,
                                    verbose=False)
        elif not (hasattr(llama, "_ctx") and hasattr(llama, "_batch") and callable(getattr(llama, "n_vocab", None))):
            raise TypeError(f"llama must be a llama_cpp.Llama, got {type(llama).__name__}")
        self.llama = llama
        self.model_path = None if model_path is None else str(model_path)
        self._current = None  # the LlamaCppLM whose cache llama.cpp holds (the last one opened)

    @property
    def vocab_size(self) -> int:
        """Width of the model's logits."""
        return int(self.llama.n_vocab())

    @property
    def n_ctx(self) -> int:
        return int(self.llama.n_ctx())

    def open(self, batch_size: int, device) -> LlamaCppLM:
        """The per-generation state (an empty KV cache) of ``batch_size`` rows: 1 here."""
        if batch_size != 1:
            raise ValueError(f"the llama.cpp backend runs one sequence at a time (batch size 1), got {batch_size} "
                             f"prompts: generate them one by one")
        if torch.device(device).type != "cpu":
            raise ValueError(f"the llama.cpp backend returns its logits on the CPU: input_ids must be on the CPU, "
                             f"got device {str(device)!r}")
        self._current = LlamaCppLM(self)
        return self._current

    def __repr__(self) -> str:
        return f"LlamaCppModel({self.model_path!r})"


class LlamaCppLM:
    """One row's KV cache in llama.cpp, with :class:`~mdboost.engine.kv.CachedLM`'s ``forward`` / ``keep``.

    Made by :meth:`LlamaCppModel.open` (it clears the model's cache: one generation at a time
    per model; an older one refuses to run on, with the reason). ``forward`` appends tokens after the kept ones; ``keep(n)`` keeps the first
    ``n`` of the columns fed since the last keep (module docstring).
    """

    def __init__(self, model: LlamaCppModel):
        self.model = model
        llama = model.llama
        self._ctx, self._batch, self._n_batch = llama._ctx, llama._batch, int(llama.n_batch)
        self._vocab = model.vocab_size
        self._n_ctx = model.n_ctx
        self._kept = 0  # tokens in the cache that a keep confirmed
        self.last_fed = 0  # columns appended since the last keep
        self._ctx.kv_cache_seq_rm(-1, 0, -1)  # a fresh generation: nothing cached
        llama.n_tokens = 0  # the Llama's own view (its generate would otherwise reuse a prefix)

    @property
    def batch_size(self) -> int:
        return 1

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def num_slots(self) -> int:
        """Tokens in the cache (kept and fed since)."""
        return self._kept + self.last_fed

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None,
                logits_to_keep: int = 0) -> torch.Tensor:  # [1, L] -> [1, L or logits_to_keep, V]
        """Append ``tokens`` to the cache and return the logits of the last ``logits_to_keep``
        (0: all) positions, float32 on the CPU."""
        if tokens.dim() != 2 or tokens.shape[0] != 1:
            raise ValueError(f"tokens must have shape (1, L) (batch size 1), got {tuple(tokens.shape)}")
        ids = tokens[0] if valid is None else tokens[0][valid[0].bool()]
        ids = [int(t) for t in ids.tolist()]
        if not ids:
            raise ValueError("tokens must hold at least one valid token")
        self._check_current()
        n_past = self.num_slots
        if n_past + len(ids) > self._n_ctx:
            raise ValueError(f"the context would hold {n_past + len(ids)} tokens, more than n_ctx={self._n_ctx}: "
                             f"open the LlamaCppModel with a larger n_ctx")
        want = len(ids) if logits_to_keep <= 0 else min(int(logits_to_keep), len(ids))
        first = len(ids) - want  # the first position whose logits are returned
        self._ctx.kv_cache_seq_rm(-1, n_past, -1)  # as Llama.eval: entries past the row's length go
        rows = []
        for start in range(0, len(ids), self._n_batch):
            chunk = ids[start:start + self._n_batch]
            self._batch.set_batch(batch=chunk, n_past=n_past + start, logits_all=False)  # flags the last only
            flagged = range(max(first - start, 0), len(chunk))
            for i in flagged:
                self._batch.batch.logits[i] = True
            self._ctx.decode(self._batch)
            if flagged:  # this chunk holds returned positions (else only its last row, unused)
                out = np.ctypeslib.as_array(self._ctx.get_logits(), shape=(len(flagged) * self._vocab,))
                rows.append(out.reshape(len(flagged), self._vocab).copy())
        self.last_fed += len(ids)
        return torch.from_numpy(np.concatenate(rows)[-want:])[None]

    def _check_current(self) -> None:
        if self.model._current is not self:
            raise RuntimeError(f"{self.model!r} opened another generation since this one: llama.cpp holds one "
                               f"cache per model, so a LlamaCppModel runs one generation at a time (open a second "
                               f"LlamaCppModel of the file for a second one)")

    def keep(self, num_columns: list[int]) -> None:
        """Roll back: keep the first ``num_columns[0]`` columns fed since the last keep."""
        self._check_current()
        fed = self.last_fed
        if len(num_columns) != 1 or not 0 <= num_columns[0] <= fed:
            raise ValueError(f"num_columns must be 1 int in [0, {fed}], got {num_columns!r}")
        self._kept += int(num_columns[0])
        self.last_fed = 0
        self._ctx.kv_cache_seq_rm(-1, self._kept, -1)


@dataclass
class LlamaCppMember:
    """One member of a :class:`LlamaCppPool`: its spec ``name``, ``kind`` (``"target"`` or
    :func:`mdboost.models.specs.parse_drafter`'s), and ``model`` (a :class:`LlamaCppModel`) or
    ``ngram`` (prompt lookup), as a :class:`~mdboost.models.pool.PoolMember` holds them."""

    name: str
    kind: str
    model: LlamaCppModel | None
    ngram: NgramDrafter | None = None


class LlamaCppPool:
    """A pool's target and drafters as llama.cpp runs them, by the pool's specs: ``pool[name]`` is
    a :class:`LlamaCppMember`, ``pool.target`` the target's.

    Parameters
    ----------
    target : str
        The pool's target: a ``.gguf`` file or ``smollm2-135m`` (the bundled GGUF it converts;
        :func:`mdboost.models.gguf_drafters.llamacpp_model`).
    drafters : sequence of str
        Pool drafter specs llama.cpp can run (:func:`mdboost.models.gguf_drafters.llamacpp_cannot`):
        ``early_exit:N`` (a truncated GGUF of the target, made once under ``home``), ``ngram:N``,
        a ``.gguf`` file. Another spec is a ValueError with the reason.
    home : str or path-like, optional
        Where truncated GGUFs are kept (default: :func:`mdboost.models.home.mdboost_home`).
    n_threads : int, default=1
        Threads of every model's decodes (the engine's cost measurements run one).
    n_ctx : int, default=2048
        Context length of every model.
    """

    def __init__(self, target: str, drafters=(), *, home=None, n_threads: int = 1, n_ctx: int = 2048):
        path, note = llamacpp_model(target)
        if path is None:
            raise ValueError(f"target {target!r} cannot run in llama.cpp: {note}")
        for spec in drafters:
            why = llamacpp_cannot(spec)
            if why is not None:
                raise ValueError(f"drafter {spec!r} cannot run in llama.cpp: {why}")
        self.target_path = path
        self._open = dict(n_threads=n_threads, n_ctx=n_ctx)
        self.target = LlamaCppMember(target, "target", LlamaCppModel(path, **self._open))
        self._members = {target: self.target}
        for spec in drafters:
            self._members.setdefault(spec, self._member(spec, home))

    def _member(self, spec: str, home) -> LlamaCppMember:
        kind, n = parse_drafter(spec)
        if kind == "ngram":
            return LlamaCppMember(spec, kind, None, NgramDrafter(n))
        path = gguf_drafter(self.target_path, spec, home) if kind == "early_exit" else spec
        return LlamaCppMember(spec, kind, LlamaCppModel(path, **self._open))

    @property
    def names(self) -> list[str]:
        """The target's spec, then the drafters'."""
        return list(self._members)

    def __getitem__(self, name: str) -> LlamaCppMember:
        if name not in self._members:
            raise KeyError(f"{name!r} is not in this llama.cpp pool (members: {self.names})")
        return self._members[name]

    def __repr__(self) -> str:
        return f"LlamaCppPool({self.names})"
