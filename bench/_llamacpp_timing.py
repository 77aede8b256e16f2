"""The GGUF target with every forward timed, shared by the llama.cpp diagnosis benches
(``bench/llamacpp_drift.py``, ``bench/llamacpp_step_parts.py``)."""

from __future__ import annotations

import os
import platform
import time

import torch

from mdboost.cache.profile import hardware_fingerprint, hardware_label
from mdboost.data import TextSource
from mdboost.engine.drafting import NgramAdapter
from mdboost.engine.llamacpp import LlamaCppModel
from mdboost.md.rules import Rejection
from mdboost.models import load_model
from mdboost.models.gguf_drafters import llamacpp_model
from mdboost.models.ngram import NgramDrafter
from mdboost.validation.points import heldout_prompts

TEMPERATURE, NEW_TOKENS = 0.7, 64  # the llama.cpp validation's recommendation cell and generation length


def machine() -> str:
    """The sections' machine line: the CPU and llama.cpp as the speed files name them, cores, Python."""
    return (f"Machine: {hardware_label(hardware_fingerprint(torch.device('cpu'), 'llamacpp'))}, {os.cpu_count()} "
            f"cores, Python {platform.python_version()}.")


class TimedTarget(LlamaCppModel):
    """The default pool's target GGUF, one thread, whose every forward is appended to ``log`` as
    ``(phase, width, seconds)`` (``phase``: set by the bench between its parts)."""

    def __init__(self, log: list):
        path, note = llamacpp_model("smollm2-135m")
        if path is None:
            raise SystemExit(f"no GGUF target: {note}")
        super().__init__(path, n_threads=1)
        self.log, self.phase = log, "none"

    def open(self, batch_size, device):
        lm = super().open(batch_size, device)
        forward = lm.forward

        def timed(tokens, valid=None, logits_to_keep=0):
            start = time.perf_counter()
            out = forward(tokens, valid, logits_to_keep)
            self.log.append((self.phase, int(tokens.shape[1]), time.perf_counter() - start))
            return out

        lm.forward = timed
        return lm


def held_out_setup(n_prompts: int):
    """One torch thread; ``(log, target, tokenizer, prompts, modes)``: the forward log, the
    :class:`TimedTarget`, the target's tokenizer, the validation's first ``n_prompts`` held-out
    HumanEval prompts (the default config's data), and the two modes compared: plain decoding and
    the llama.cpp ranking's recommendation, ``ngram:3`` SD at gamma 1 on greedy drafts."""
    torch.set_num_threads(1)
    log: list = []
    target = TimedTarget(log)
    tokenizer = load_model("smollm2-135m")[1]
    _, prompts = heldout_prompts(TextSource(limit=16), tokenizer, n_prompts)
    modes = {"plain decoding": dict(mode="ar"),
             "ngram:3 SD, gamma 1": dict(mode="sd", drafter=NgramAdapter(NgramDrafter(3)), gamma=1,
                                         rule=Rejection(drafting="greedy"))}
    return log, target, tokenizer, prompts, modes
