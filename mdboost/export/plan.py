"""The export document of a ranking (:func:`export_plan`) and its rendering (:func:`render`)."""

from __future__ import annotations

import json
import os

from mdboost._io import json_ready
from mdboost.export.reading import _checked
from mdboost.export.servers import _engine_section, _llamacpp, _sglang, llamacpp_snippet
from mdboost.export.snippets import CUSTOM_GENERATE, hf_kwargs, hf_snippet, mdboost_snippet
from mdboost.export.vllm import _vllm, vllm_snippet
from mdboost.models.home import mdboost_home

FORMATS = ("json", "mdboost", "hf", "vllm", "sglang", "llamacpp")


_RANKING_KEYS = ("recommendation", "sampling", "rows", "device", "source")  # what load_ranking returns


def engine_recommendation(ranking: dict, engine: str) -> tuple[dict, list[str]]:
    """The point to render for ``engine``: the ranking's best row that engine runs
    (``summary.json``'s ``recommendations``, ``docs/ranking.md`` "Rules and engines"), and notes.

    A ranking without per-engine recommendations (from before rules were ranked) gives the overall
    pick. An engine that runs none of the ranked rows gives the overall pick marked as not beating
    plain decoding (so the engine serves the target alone), with the ranking's reason.
    """
    recs = ranking.get("recommendations")
    if not recs or engine not in recs:
        return ranking["recommendation"], []
    entry = recs[engine] or {}
    if entry.get("recommendation"):
        return entry["recommendation"], []
    reason = entry.get("reason") or f"the ranking has no point {engine} can run"
    return dict(ranking["recommendation"], beats_plain_decoding=False), [reason]


def export_plan(ranking: dict) -> dict:
    """The JSON document for a :func:`load_ranking` result (see the module docstring).

    Parameters
    ----------
    ranking : dict
        What :func:`load_ranking` returns (a folder or run id is a TypeError: load it first,
        ``export_plan(load_ranking(source))``).

    Returns
    -------
    dict
        ``source``, ``recommendation``, ``lossless``, ``mdboost``, ``hf``, ``vllm``, ``sglang``
        and ``llamacpp``.
    """
    if isinstance(ranking, (str, os.PathLike)):
        raise TypeError(f"ranking must be the dict returned by load_ranking, got {type(ranking).__name__} "
                        f"{os.fspath(ranking)!r}: call export_plan(load_ranking({os.fspath(ranking)!r}))")
    if not isinstance(ranking, dict):
        raise TypeError(f"ranking must be the dict returned by load_ranking, got {type(ranking).__name__}")
    missing = [k for k in _RANKING_KEYS if k not in ranking]
    if missing:
        raise ValueError(f"ranking lacks {', '.join(missing)}: pass the dict returned by load_ranking")
    _checked(ranking["recommendation"], ranking["rows"], ranking["source"])
    rec, sampling, device = ranking["recommendation"], ranking["sampling"], ranking["device"]
    home = ranking.get("home")  # optional: a dict made before load_ranking returned it
    if home is not None:  # a str, absolute (a hand-made dict may hold a relative path or a Path)
        home = str(mdboost_home(home))
    per_engine = {engine: engine_recommendation(ranking, engine) for engine in ("mdboost", "hf", "vllm", "sglang",
                                                                                "llamacpp")}
    vllm_rec, vllm_notes = per_engine["vllm"]
    vllm = _vllm(vllm_rec, ranking["rows"], sampling, home, ranking.get("batch_rows"))
    vllm["notes"][:0] = vllm_notes
    mdboost_rec, hf_rec = per_engine["mdboost"][0], per_engine["hf"][0]
    sections = {}
    for engine, render_section in (("sglang", lambda r: _sglang(r, sampling, home)),
                                   ("llamacpp", lambda r: _llamacpp(r, sampling, home))):
        point, notes = per_engine[engine]
        section = render_section(point)
        sections[engine] = _engine_section(section["args"], notes + section["notes"]) | {"point": point}
    # a lossy pick (any pick of a ranking priced in llama.cpp) runs on llama.cpp in mdboost's loop
    lossy = llamacpp_snippet(mdboost_rec, sampling, ranking.get("speed_engine", "mdboost"))
    if lossy is not None:
        sections["llamacpp"] |= {"python": lossy, "python_point": mdboost_rec}
    return {"source": ranking["source"], "recommendation": rec, "lossless": float(rec["max_divergence"]) == 0,
            "mdboost": {"python": mdboost_snippet(mdboost_rec, sampling, device, home), "point": mdboost_rec},
            "hf": {"custom_generate": CUSTOM_GENERATE if hf_rec["beats_plain_decoding"] else None,
                   "generate_kwargs": hf_kwargs(hf_rec, sampling, home),
                   "python": hf_snippet(hf_rec, sampling, device, home), "point": hf_rec},
            "vllm": {**vllm, "python": vllm_snippet(vllm), "point": vllm_rec}, **sections}


def render(plan: dict, fmt: str = "json") -> str:
    """``plan`` as JSON (standard JSON: a missing figure, such as an interval bound of a ranking
    without a bootstrap, is ``null``), the Python of its ``mdboost``, ``hf`` or ``vllm`` section,
    or the command line of its ``sglang`` or ``llamacpp`` section (for a lossy pick, the
    ``llamacpp`` section's Python: :func:`llamacpp_snippet`; its lossless command stays in the JSON)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if fmt == "json":
        return json.dumps(json_ready(plan), indent=2, default=str, allow_nan=False)
    return plan[fmt]["python"] if "python" in plan[fmt] else plan[fmt]["shell"]
