"""The servers' command lines: SGLang's ``launch_server`` and ``llama-server`` arguments of a
pick (:mod:`mdboost.serve_args`), and a lossy pick in mdboost's loop on llama.cpp (:func:`llamacpp_snippet`)."""

from __future__ import annotations

import math
import shlex

from mdboost.export.snippets import MAX_NEW_TOKENS, PROMPT, _budget_args, _rule_import, _settings_args
from mdboost.export.vllm import _written_note, vllm_model, written_drafter_path
from mdboost.models.gguf_drafters import llamacpp_model
from mdboost.models.specs import parse_drafter
from mdboost.ranking.report import ALONE, row_draft_p_min
from mdboost.serve_args import llamacpp_args, sglang_args


_CANNOT = {"early_exit": "an early exit of the target (its first layers) built by mdboost: write it out with --write-drafter",
           "tuned": "an early exit with a tuned-lens translator built by mdboost",
           "int8": "a dynamically int8-quantized CPU copy built by mdboost"}


def server_sampling(rec: dict, sampling: dict) -> dict:
    """The ranked sampling of a point as the servers' keywords (:mod:`mdboost.serve_args`):
    its temperature and the ranking's ``top_k`` / ``top_p``."""
    return dict(temperature=float(rec["temperature"]), top_k=sampling.get("top_k"), top_p=sampling.get("top_p"))


def _engine_section(args: list[str] | None, notes: list[str]) -> dict:
    """A command-line section: its argv (None: nothing to serve), notes and shell text."""
    shell = [f"# {note}" for note in notes] + ([] if args is None else [shlex.join(args)])
    return {"args": args, "notes": notes, "shell": "\n".join(shell)}


def _lossless_note(rec: dict, engine: str, rule: str, greedy: bool = True) -> list[str]:
    """What the engine's lossless rule is; ``greedy``: it drafts the argmax where the rendered
    point's rule sampled the drafts (a point ranked on greedy drafts, or an n-gram draft, is one
    deterministic token in both)."""
    notes = [f"{engine} {rule}: lossless, but its acceptance (q(x) of the drafter's argmax) is not the ranked "
             f"one (drafts sampled from the drafter), so the predicted speedup does not carry over" if greedy else
             f"{engine} {rule}: lossless, a one-hot draft accepted with probability q(x), as ranked"]
    if float(rec["max_divergence"]) > 0:
        notes.append(f"the pick's mentored-decoding budget ({rec['divergence']} <= {float(rec['max_divergence']):g}) "
                     f"is not rendered: this is the lossless point of its drafter and gamma")
    return notes


def _sglang(rec: dict, sampling: dict, home: str | None) -> dict:
    """The ``sglang`` section: the pick's drafter as SGLang's STANDALONE draft model, ``c = s = 1``."""
    model, note = vllm_model(rec["target"], home)  # SGLang loads what vLLM loads, and GGUF files
    if rec["target"].endswith(".gguf"):
        model, note = rec["target"], ""
    notes = [note.replace("vLLM", "SGLang")] if note else []
    if model is None:
        return _engine_section(None, notes)
    settings = server_sampling(rec, sampling)
    if not rec["beats_plain_decoding"]:
        return _engine_section(sglang_args(model, **settings), notes + ["no drafter is reliably faster here: serve the target alone"])
    kind, _ = parse_drafter(rec["drafter"])
    draft, draft_note = vllm_model(rec["drafter"], home) if kind == "hf" else (None, "")
    if kind == "hf" and rec["drafter"].endswith(".gguf"):
        draft, draft_note = rec["drafter"], ""
    if kind == "early_exit":
        draft = written_drafter_path(rec["target"], rec["drafter"], home)
        notes.append(_written_note(rec["target"], rec["drafter"], home))
    if draft is None:
        why = {"ngram": "mdboost's prompt lookup; SGLang's NGRAM drafts a tree from a corpus of the last 18 tokens "
                        "of every request (srt/speculative/ngram_worker.py:396-420), another drafter",
               "hf": draft_note.replace("vLLM", "SGLang")}.get(kind) or _CANNOT[kind]
        return _engine_section(sglang_args(model, **settings),
                               notes + [f"SGLang cannot run the drafter {rec['drafter']!r} ({why}): serving "
                                        f"the target without speculative decoding"])
    accept, single = (_threshold_of(rec, key) for key in ("threshold_acc", "threshold_single"))
    if rec.get("rule") == "threshold" and accept < 1:
        notes.append(f"SGLang's thresholds as ranked (mdboost.md.rules.Threshold, greedy drafts): a draft x is "
                     f"accepted with probability min(1, q(x) / {accept:.6g}), always when q(x) >= {single:.6g}, "
                     f"so every position keeps {rec['divergence']} <= {float(rec['max_divergence']):g} "
                     f"(docs/theory.md, section 11); SGLang applies them at temperature > 0 on CUDA")
    else:
        notes += _lossless_note(rec, "SGLang STANDALONE drafts greedily and, with --speculative-accept-threshold-acc 1 "
                                     "and -single 1,", "accepts x with probability q(x)",
                                greedy=rec.get("drafting") != "greedy")
    return _engine_section(sglang_args(model, draft_model=draft, num_draft_tokens=int(rec["gamma"]), accept=accept,
                                       single=single, **settings), notes)


def _threshold_of(rec: dict, key: str) -> float:
    """SGLang's threshold of a recommended row (1 where the row has none: a lossless rule)."""
    value = rec.get(key)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 1.0
    return value if math.isfinite(value) else 1.0


def _llamacpp(rec: dict, sampling: dict, home: str | None = None) -> dict:
    """The ``llamacpp`` section: ``llama-server`` with the pick's drafter, when llama.cpp can run it."""
    model, note = llamacpp_model(rec["target"])
    notes = [note] if note else []
    if model is None:
        return _engine_section(None, notes)
    settings = server_sampling(rec, sampling)
    if not rec["beats_plain_decoding"]:
        return _engine_section(llamacpp_args(model, **settings), notes + ["no drafter is reliably faster here: serve the target alone"])
    kind, n = parse_drafter(rec["drafter"])
    gamma = int(rec["gamma"])
    if kind == "ngram":
        notes += _lossless_note(rec, "llama.cpp's ngram-simple", "drafts one deterministic token sequence, "
                                "accepted while the target's sample equals it", greedy=False)
        notes.append(f"ngram-simple looks up exactly the last {n} tokens (common/ngram-map.cpp:49-100); mdboost's "
                     f"{rec['drafter']} falls back to shorter suffixes and runs on into its own copy: drafts differ")
        return _engine_section(llamacpp_args(model, ngram=n, draft_max=gamma, **settings), notes)
    draft, draft_note = llamacpp_model(rec["drafter"]) if kind == "hf" else (None, _CANNOT[kind])
    if kind == "early_exit":
        written = written_drafter_path(rec["target"], rec["drafter"], home)
        draft = f"{written}.gguf"
        notes.append(_written_note(rec["target"], rec["drafter"], home) + f"; then `python convert_hf_to_gguf.py "
                     f"{written} --outfile {draft}` (llama.cpp's converter)")
    if draft is None:
        return _engine_section(llamacpp_args(model, **settings),
                               notes + [f"llama.cpp cannot run the drafter {rec['drafter']!r} ({draft_note}): "
                                        f"serving the target without speculative decoding"])
    floor = row_draft_p_min(rec)
    drafts = (f"--spec-draft-p-min {floor:g}: a step stops before a draft whose top-10 probability is below it, as "
              f"ranked" if floor else "--spec-draft-p-min 0: always gamma tokens")
    notes += _lossless_note(rec, f"llama.cpp drafts greedily ({drafts}) and",
                            "accepts while the target's own sample equals the draft",
                            greedy=rec.get("drafting") != "greedy")
    return _engine_section(llamacpp_args(model, draft_model=draft, draft_max=gamma, draft_p_min=floor, **settings),
                           notes)


def llamacpp_command(rec: dict, sampling: dict, home: str | None = None) -> str:
    """The ``llama-server`` command (with its notes as comments) of a point: the target alone
    where no drafter beats plain decoding, else the point's lossless drafting as llama.cpp runs it
    (``mdboost export --format llamacpp`` of a lossless pick).

    >>> rec = {"beats_plain_decoding": False, "target": "/m/t.gguf", "drafter": "ngram:3", "temperature": 0.7}
    >>> print(llamacpp_command(rec, {}).splitlines()[-1])
    llama-server -m /m/t.gguf --temp 0.7 --top-k 0 --top-p 1 --min-p 0
    """
    return _llamacpp(rec, sampling, home)["shell"]


def llamacpp_snippet(rec: dict, sampling: dict, speed_engine: str = "mdboost") -> str | None:
    """Python running a lossy pick ``rec`` in mdboost's loop with llama.cpp doing the forward
    passes (:class:`mdboost.engine.llamacpp.LlamaCppModel`; ``docs/engine.md``), or None where
    that does not apply: a lossless pick (``llama-server`` runs it) of a ranking priced with
    mdboost's engine, none beating plain decoding, a target that is no GGUF file, or a drafter
    llama.cpp cannot run (``tuned:N``, ``int8``). A ranking priced with llama.cpp's costs
    (``speed_engine="llamacpp"``) priced exactly this loop: every pick of it gets the snippet.

    Its drafter: prompt lookup, an early exit written as a truncated GGUF
    (:func:`mdboost.models.gguf_drafters.gguf_drafter`), or a GGUF model.

    >>> rec = {"beats_plain_decoding": True, "rule": "mentored", "drafting": "sampled", "max_divergence": 0.2,
    ...        "divergence": "kl", "target": "/m/t.gguf", "drafter": "early_exit:12", "temperature": 0.7, "gamma": 4}
    >>> print(next(line for line in llamacpp_snippet(rec, {}).splitlines() if line.startswith("drafter")))
    drafter = ModelDrafter(LlamaCppModel(gguf_drafter(TARGET, 'early_exit:12'), n_threads=1))
    """
    lossy = float(rec["max_divergence"]) > 0 or (rec.get("rule") == "threshold" and _threshold_of(rec, "threshold_acc") < 1)
    if not (rec["beats_plain_decoding"] and (lossy or speed_engine == "llamacpp")) or rec.get("rule") == ALONE:
        return None
    model, _ = llamacpp_model(rec["target"])
    kind, n = parse_drafter(rec["drafter"])
    draft = llamacpp_model(rec["drafter"])[0] if kind == "hf" else None
    if model is None or kind in ("tuned", "int8") or (kind == "hf" and draft is None):
        return None
    drafter = {"ngram": f"NgramAdapter(NgramDrafter({n}))",
               "early_exit": f"ModelDrafter(LlamaCppModel(gguf_drafter(TARGET, {rec['drafter']!r}), n_threads=1))",
               "hf": f"ModelDrafter(LlamaCppModel({draft!r}, n_threads=1))"}[kind]
    args = [f"max_new_tokens={MAX_NEW_TOKENS}", *_settings_args(rec, sampling), f"gamma={int(rec['gamma'])}", *_budget_args(rec)]
    return "\n".join([
        f"# the {'lossy ' if lossy else ''}pick in mdboost's loop, llama.cpp doing the forward passes "
        "(pip install 'mdboost[llamacpp]');",
        ("# the ranking priced this loop with llama.cpp's costs (speed.engine: llamacpp)" if speed_engine == "llamacpp"
         else "# llama-server runs only lossless drafting; the ranking priced this point with mdboost's engine costs"),
        "import torch",
        "from mdboost.engine import GenerationSettings, ModelDrafter, NgramAdapter, generate",
        "from mdboost.engine.llamacpp import LlamaCppModel",
        "from mdboost.models.gguf_drafters import gguf_drafter",
        "from mdboost.models.ngram import NgramDrafter",
        *_rule_import(rec), "",
        f"TARGET = {model!r}",
        "target = LlamaCppModel(TARGET, n_threads=1)",
        f"drafter = {drafter}",
        f"input_ids = target.llama.tokenize({PROMPT.encode()!r})",
        f"settings = GenerationSettings({', '.join(args)}, eos_token_id=target.llama.token_eos())",
        "out = generate(target, torch.tensor([input_ids]), settings, drafter=drafter)",
        "print(target.llama.detokenize(out.sequences[0].tolist()).decode(errors='replace'))"])
