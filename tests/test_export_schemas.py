"""Every field and argument the ``vllm``, ``sglang`` and ``llamacpp`` exports emit exists, with a
valid value, in the engine's own definition: ``tests/data/engine_schemas.json``, read from the
released sources of vLLM 0.34.0, SGLang 0.5.23 and llama-cpp-python 0.3.36 (its vendored
llama.cpp) by ``bench/engine_schemas.py``."""

import ast
import json
from pathlib import Path

import pytest

from mdboost.export import export_plan
from mdboost.serve_args import llamacpp_args, sglang_args, vllm_serve_args

SCHEMAS = json.loads((Path(__file__).parent / "data" / "engine_schemas.json").read_text())
VLLM, SGLANG, LLAMACPP = SCHEMAS["vllm"], SCHEMAS["sglang"], SCHEMAS["llamacpp"]
TARGET, DRAFT = "org/target", "org/draft"  # hub names every engine but llama.cpp loads as they are
COLUMNS = ("rank", "drafter", "target", "temperature", "divergence", "max_divergence", "gamma", "predicted_speedup",
           "predicted_speedup_lo", "predicted_speedup_hi")
ROWS = [(1, "tuned:2", "kl", 0.1, 4, 1.6), (2, DRAFT, "none", 0.0, 3, 1.4), (3, "ngram:3", "none", 0.0, 5, 1.3)]
PICKS = {"lossless draft model": 2, "lossy": 1, "n-gram": 3}


def plan(rank, target=TARGET, top_k=None, top_p=None):
    rows = [dict(zip(COLUMNS, (r, d, target, 0.7, div, b, g, s, s - 0.1, s + 0.1))) for r, d, div, b, g, s in ROWS]
    row = rows[rank - 1]
    rec = {k: row[k] for k in ("drafter", "target", "temperature", "divergence", "max_divergence", "gamma",
                               "predicted_speedup", "predicted_speedup_lo", "predicted_speedup_hi")}
    rec["beats_plain_decoding"] = True
    return export_plan({"recommendation": rec, "sampling": {"top_k": top_k, "top_p": top_p}, "rows": rows,
                        "device": "cpu", "source": "made", "home": None})


def pairs(argv: list[str]) -> list[tuple[str, str]]:
    """``(flag, value)`` of a command line whose flags all take one value."""
    flags = [i for i, a in enumerate(argv) if a.startswith("--") or a in ("-m", "-md")]
    return [(argv[i], argv[i + 1]) for i in flags]


def test_the_versions_checked_are_recorded():
    assert (VLLM["version"], SGLANG["version"], LLAMACPP["version"]) == ("0.34.0", "0.5.23", "0.3.36")


def strings(node, key=None):
    """``(key, value)`` of every string in a JSON tree (``key``: the nearest dict key above it)."""
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in [(key, k), *strings(v, k)]]
    if isinstance(node, list):
        return [s for v in node for s in strings(v, key)]
    return [(key, node)] if isinstance(node, str) else []


@pytest.mark.parametrize("engine, root", [("vllm", "vllm/"), ("sglang", "sglang/"), ("llamacpp", "vendor/llama.cpp/")])
def test_the_schemas_name_files_inside_the_packages_only(engine, root):
    """Whether read from unpacked releases (``--from``) or downloaded into a temporary folder, the
    JSON is the same: it names each source by its path inside the package, never a folder."""
    found = strings(SCHEMAS[engine])
    files = [value for key, value in found if key == "file"]
    assert files and all(f.startswith(root) and ".." not in Path(f).parts for f in files)
    assert not [value for _, value in found if value.startswith("/")]


# --- vLLM -------------------------------------------------------------------------------------------

def check_speculative_config(config: dict) -> None:
    fields, literals = VLLM["speculative_config"]["fields"], VLLM["speculative_config"]["literals"]
    assert set(config) <= set(fields), set(config) - set(fields)
    assert config["method"] in literals["SpeculativeMethod"]["values"]
    assert config["rejection_sample_method"] in literals["RejectionSampleMethod"]["values"]
    if "draft_sample_method" in config:
        assert config["draft_sample_method"] in literals["DraftSampleMethod"]["values"]
    assert isinstance(config["num_speculative_tokens"], int) and config["num_speculative_tokens"] > 0  # Field(gt=0)
    if config["method"] == "ngram":  # Field(ge=1), and NgramSpeculatorConfig: min <= max
        assert 1 <= config["prompt_lookup_min"] <= config["prompt_lookup_max"]


def check_python(code: str) -> None:
    """The keywords of the snippet's ``LLM(...)`` (its own, or ``EngineArgs``' through ``**kwargs``)
    and ``SamplingParams(...)`` calls."""
    llm = set(VLLM["llm"]["params"]) | set(VLLM["engine_args"]["fields"])
    sampling = set(VLLM["sampling_params"]["fields"])
    calls = {n.func.id: n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert {"LLM", "SamplingParams"} <= set(calls)
    assert {k.arg for k in calls["LLM"].keywords} <= llm
    assert {k.arg for k in calls["SamplingParams"].keywords} <= sampling


def check_serve(argv: list[str], config: dict | None) -> None:
    assert argv[:2] == ["vllm", "serve"]
    given = dict(pairs(argv))
    assert set(given) <= set(VLLM["serve_flags"]["flags"]), set(given) - set(VLLM["serve_flags"]["flags"])
    assert given["--generation-config"] in VLLM["generation_config"]["values"]
    assert set(json.loads(given["--override-generation-config"])) <= set(VLLM["override_generation_config"]["values"])
    assert json.loads(given.get("--speculative-config", "null")) == config


@pytest.mark.parametrize("pick", PICKS)
def test_the_vllm_export_uses_vllm_s_own_fields_and_values(pick):
    vllm = plan(PICKS[pick], top_k=20, top_p=0.9)["vllm"]
    config = vllm["speculative_config"] or vllm["nearest_lossless"]["speculative_config"]
    check_speculative_config(config)
    check_python(vllm["python"])
    check_serve(vllm["serve"], config)


def test_a_lossless_draft_model_pick_runs_in_vllm_with_the_draft_sampling_it_was_ranked_with():
    """The ranking samples drafts from the drafter; vLLM's default draft_sample_method is 'greedy'
    (vllm/config/speculative.py), another acceptance: the export says 'probabilistic'."""
    config = plan(PICKS["lossless draft model"])["vllm"]["speculative_config"]
    default = VLLM["speculative_config"]["fields"]["draft_sample_method"]["default"]
    assert default == "greedy" and config["draft_sample_method"] == "probabilistic"
    assert config["rejection_sample_method"] == "standard" and config["model"] == DRAFT


# --- SGLang -----------------------------------------------------------------------------------------

def check_sglang(argv: list[str]) -> None:
    flags = SGLANG["launch_server"]["flags"]
    assert argv[:3] == ["python", "-m", SGLANG["launch_server"]["module"]]
    for flag, value in pairs(argv[3:]):
        entry = flags[flag]
        if entry["choices"] is not None:
            assert value in entry["choices"], (flag, value)
        if "int" in entry["type"]:
            int(value)
        elif "float" in entry["type"]:
            float(value)
        if flag == "--speculative-algorithm":
            assert value in SGLANG["speculative_algorithms"]["values"]
        if flag == "--preferred-sampling-params":
            params = json.loads(value)
            assert set(params) <= set(SGLANG["sampling_params"]["fields"])
            assert params["top_k"] == -1 or params["top_k"] >= 1  # SamplingParams.verify: -1 (all) or >= 1


@pytest.mark.parametrize("pick", PICKS)
def test_the_sglang_export_uses_sglang_s_own_flags_and_values(pick):
    sglang = plan(PICKS[pick])["sglang"]
    check_sglang(sglang["args"])
    drafted = "--speculative-algorithm" in sglang["args"]
    assert drafted == (PICKS[pick] == 2)  # a draft model runs as STANDALONE; tuned and n-gram drafters cannot
    if not drafted:
        assert any("SGLang cannot run the drafter" in note for note in sglang["notes"])


@pytest.mark.parametrize("accept, single", [(1.0, 1.0), (0.6, 0.9)])
def test_sglang_args_thresholds_and_chain(accept, single):
    argv = sglang_args(TARGET, draft_model=DRAFT, num_draft_tokens=4, accept=accept, single=single, temperature=0.7,
                       top_k=50, top_p=0.95)
    check_sglang(argv)
    given = dict(pairs(argv[3:]))
    assert float(given["--speculative-accept-threshold-acc"]) == accept
    assert float(given["--speculative-accept-threshold-single"]) == single
    # one chain of gamma drafts: SGLang resets num_draft_tokens to num_steps + 1 when topk == 1
    assert (given["--speculative-eagle-topk"], given["--speculative-num-steps"],
            given["--speculative-num-draft-tokens"]) == ("1", "4", "5")


# --- llama.cpp --------------------------------------------------------------------------------------

def check_llamacpp(argv: list[str]) -> None:
    options = LLAMACPP["llama_server"]["options"]
    assert argv[0] == "llama-server"
    for flag, value in pairs(argv):
        entry = options[flag]
        assert entry["server"] and not entry["removed"], (flag, entry)
        if flag == "--spec-type":
            assert value in LLAMACPP["spec_types"]["values"]
        elif flag not in ("-m", "--spec-draft-model"):
            float(value)


@pytest.mark.parametrize("pick", PICKS)
def test_the_llamacpp_export_uses_llama_server_s_own_options(pick):
    llamacpp = plan(PICKS[pick], target="/m/target.gguf")["llamacpp"]
    check_llamacpp(llamacpp["args"])


def test_llamacpp_args_draft_model_and_ngram():
    draft = llamacpp_args("t.gguf", draft_model="d.gguf", draft_max=4, draft_p_min=0.5, temperature=0.7, top_k=40)
    ngram = llamacpp_args("t.gguf", ngram=3, draft_max=6, temperature=0.0)
    for argv in (draft, ngram, llamacpp_args("t.gguf")):
        check_llamacpp(argv)
    assert dict(pairs(draft))["--spec-type"] == "draft-simple" and dict(pairs(ngram))["--spec-type"] == "ngram-simple"
    # the flags the field remembers (--draft-max, --draft-min) were removed from llama.cpp: never emitted
    assert LLAMACPP["llama_server"]["options"]["--draft-max"]["removed"]
    assert not {"--draft-max", "--draft-min", "--draft"} & set(draft + ngram)


def test_a_target_llama_cpp_cannot_load_is_said_plainly():
    llamacpp = plan(PICKS["lossless draft model"])["llamacpp"]
    assert llamacpp["args"] is None and "llama.cpp loads nothing else" in llamacpp["shell"]


# --- bad input ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, message", [
    (lambda: sglang_args("t", draft_model="d", num_draft_tokens=0), "num_draft_tokens must be a positive integer"),
    (lambda: sglang_args("t", draft_model="d", num_draft_tokens=4, accept=1.5), r"accept must be in \(0, 1\]"),
    (lambda: sglang_args("t", single=0), r"single must be in \(0, 1\]"),
    (lambda: sglang_args("t", temperature=-1), "temperature must be a number >= 0, got -1"),
    (lambda: llamacpp_args("t", draft_model="d", ngram=3, draft_max=4), "give draft_model or ngram, not both"),
    (lambda: llamacpp_args("t", draft_model="d", draft_max=4, draft_min=5), r"draft_min must be an integer in \[0"),
    (lambda: llamacpp_args("t", ngram=3, draft_max=4, draft_p_min=1.0), r"draft_p_min must be a number in \[0, 1\), got 1.0"),
    (lambda: llamacpp_args("t", top_p=0), r"top_p must be in \(0, 1\] or None, got 0"),
])
def test_bad_values_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_vllm_serve_args_without_speculation():
    argv = vllm_serve_args(TARGET, {"temperature": 0.0, "top_k": 5})
    check_serve(argv, None)
