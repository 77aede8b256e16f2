"""What to run for a ranking's recommendation: mdboost's engine, Hugging Face ``generate``, vLLM,
SGLang, llama.cpp.

:func:`load_ranking` reads a ranking (an output folder of ``mdboost rank``, or its MLflow run);
:func:`export_plan` turns its recommendation into one JSON-able document:

- ``mdboost``: the :func:`mdboost.engine.generate` call;
- ``hf``: the ``target.generate(custom_generate=mdboost.hf.mentored_generate, ...)`` call and
  its keyword arguments;
- ``vllm``: the target and sampling parameters, the ``vllm serve`` line, and for a lossless
  (budget 0) pick whose drafter vLLM can run, its ``speculative_config`` (fields of vLLM
  0.34.0's ``SpeculativeConfig``, ``vllm/config/speculative.py``: ``method``, ``model``,
  ``num_speculative_tokens``, ``prompt_lookup_max``, ``prompt_lookup_min``,
  ``draft_sample_method``, ``rejection_sample_method``). The ranking drafts by sampling from
  the drafter, vLLM by default greedily (``draft_sample_method: "greedy"``, line 682): a draft
  model's pick is exported with ``"probabilistic"`` drafts and ``"standard"`` rejection, what was
  ranked. vLLM has no budgeted (divergence-bounded) verification: its
  ``rejection_sample_method`` (line 98) is ``"standard"`` or ``"block"`` (lossless),
  ``"fly"`` (lossy, gated by the target's entropy, with no divergence bound) or
  ``"synthetic"`` (fixed acceptance rates, for benchmarks). So a lossy (MD) pick has no
  ``speculative_config``: the document says so and names the nearest lossless option of the
  ranking instead (``docs/theory.md`` section 3: budget 0 is standard SD). vLLM 0.34.0 loads
  no GGUF file (see :func:`vllm_model`).
- ``sglang`` and ``llamacpp``: ``launch_server`` / ``llama-server`` arguments
  (:mod:`mdboost.serve_args`) for the pick's drafter and draft length, verified losslessly
  (SGLang's thresholds ``c = s = 1``), or a note saying why the engine cannot run that drafter.

:func:`render` prints the document as JSON or as the Python of one of the three calls.

The package: :mod:`.reading` reads a ranking back, :mod:`.snippets` writes the Python calls,
:mod:`.vllm` and :mod:`.servers` the engines' sections, :mod:`.plan` the document and its
rendering, :mod:`.drafters` the pick's drafter written as a checkpoint.
"""

from __future__ import annotations

from mdboost.export.drafters import (GGUF_OUTTYPES, VLLM_DRAFT_SAMPLING, drafter_engine_lines, render_written,
                                     write_pick_drafter)
from mdboost.export.plan import FORMATS, engine_recommendation, export_plan, render
from mdboost.export.reading import load_ranking
from mdboost.export.servers import llamacpp_command, llamacpp_snippet, server_sampling
from mdboost.export.snippets import (CUSTOM_GENERATE, MAX_NEW_TOKENS, PROMPT, hf_kwargs, hf_snippet, mdboost_snippet,
                                     rule_code)
from mdboost.export.vllm import (DRAFTINGS, SPECULATIVE_CONFIG_KEYS, VLLM_METHODS, batch_size_schedule, nearest_lossless,
                                 speculative_config, vllm_model, vllm_snippet, written_drafter_path)

__all__ = ["CUSTOM_GENERATE", "DRAFTINGS", "FORMATS", "GGUF_OUTTYPES", "MAX_NEW_TOKENS", "PROMPT", "SPECULATIVE_CONFIG_KEYS",
           "VLLM_DRAFT_SAMPLING", "VLLM_METHODS", "batch_size_schedule", "drafter_engine_lines", "engine_recommendation",
           "export_plan", "hf_kwargs", "hf_snippet", "llamacpp_command", "llamacpp_snippet", "load_ranking",
           "mdboost_snippet", "nearest_lossless", "render", "render_written", "rule_code", "server_sampling",
           "speculative_config", "vllm_model", "vllm_snippet", "write_pick_drafter", "written_drafter_path"]
