"""Drafters llama.cpp runs, written from the target's GGUF (mdboost.models.gguf_drafters).

- on a small GGUF written here: the truncated file holds exactly the kept tensors, byte for
  byte, and the block count; the cache is keyed by the target's content; bad input is named;
- with llama-cpp-python and the default GGUF: the truncated file's distribution in llama.cpp is
  mdboost's ``early_exit:N`` up to llama.cpp's quantized arithmetic (its gap to ``early_exit:N``
  is the size of the full file's gap to the converted target, and far below its gap to
  ``early_exit:N+4``); a requantized file loads, and its tensors are of another type.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from mdboost.engine.llamacpp import LlamaCppModel, llama_cpp_available
from mdboost.models.gguf_drafters import gguf_drafter, parse_gguf_drafter, truncated_gguf


def _write_gguf(path, blocks=3, scale=1.0):
    """A llama-architecture GGUF of ``blocks`` blocks with small float32 tensors."""
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_block_count(blocks)
    writer.add_embedding_length(4)
    writer.add_string("general.name", "tiny")
    rng = np.random.default_rng(0)
    tensors = {"token_embd.weight": rng.standard_normal((8, 4), dtype=np.float32) * scale}
    for i in range(blocks):
        tensors[f"blk.{i}.attn_norm.weight"] = np.full(4, i + 1, dtype=np.float32)
        tensors[f"blk.{i}.ffn_up.weight"] = rng.standard_normal((6, 4), dtype=np.float32)
    tensors["output_norm.weight"] = np.ones(4, dtype=np.float32)
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, tensors


def test_a_truncated_gguf_keeps_the_first_blocks_byte_for_byte(tmp_path):
    source, tensors = _write_gguf(tmp_path / "t.gguf")
    out = truncated_gguf(source, 2, tmp_path / "out" / "exit2.gguf")
    reader = gguf.GGUFReader(str(out))
    assert reader.get_field("llama.block_count").contents() == 2
    assert reader.get_field("general.name").contents() == "tiny"
    assert reader.get_field("llama.embedding_length").contents() == 4
    want = [n for n in tensors if not n.startswith("blk.2.")]
    assert [t.name for t in reader.tensors] == want
    for t in reader.tensors:
        assert np.array_equal(np.asarray(t.data).reshape(tensors[t.name].shape), tensors[t.name]), t.name
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["exit2.gguf"]  # no temporary file left
    for bad in (0, 3, 2.0, True):
        with pytest.raises(ValueError, match=r"num_layers must be an int in \[1, 2\] .*got " + repr(bad)):
            truncated_gguf(source, bad, tmp_path / "bad.gguf")
    assert not (tmp_path / "bad.gguf").exists()


def test_gguf_drafters_are_made_once_and_keyed_by_the_target_s_content(tmp_path):
    source, _ = _write_gguf(tmp_path / "t.gguf")
    first = gguf_drafter(source, "early_exit:1", home=tmp_path / "home")
    stamp = first.stat().st_mtime_ns
    assert gguf_drafter(source, "early_exit:1", home=tmp_path / "home") == first
    assert first.stat().st_mtime_ns == stamp  # read back, not written again
    _write_gguf(source, scale=2.0)  # other bytes at the same path
    other = gguf_drafter(source, "early_exit:1", home=tmp_path / "home")
    assert other != first and other.parent != first.parent and first.exists()
    with pytest.raises(FileNotFoundError, match="target must be a GGUF file, got .*missing.gguf"):
        gguf_drafter(tmp_path / "missing.gguf", "early_exit:1", home=tmp_path / "home")


@pytest.mark.parametrize("spec", ["early_exit:x", "quant:Q9_Z", "int8", "ngram:3", 3])
def test_bad_gguf_drafter_specs_are_named(spec):
    with pytest.raises(ValueError, match=r"a GGUF drafter spec is early_exit:N or quant:<TYPE> .*got " + repr(spec)):
        parse_gguf_drafter(spec)


# --- with llama-cpp-python: the default GGUF ------------------------------------------------------

needs_llama = pytest.mark.skipif(not llama_cpp_available(),
                                 reason="llama-cpp-python is not installed (pip install 'mdboost[llamacpp]')")


@pytest.fixture(scope="module")
def default_gguf():
    from mdboost.models.convert import smollm2_gguf

    folder, name = smollm2_gguf()
    return folder / name


def _tv(a, b):  # [..., V] -> [...]
    return 0.5 * (a - b).abs().sum(-1)


@needs_llama
def test_a_truncated_gguf_in_llama_cpp_is_mdboost_s_early_exit(default_gguf, tmp_path):
    from mdboost.models.convert import ensure_smollm2
    from mdboost.models.drafters import early_exit_model
    from mdboost.models.loading import load_model

    loaded = load_model(str(ensure_smollm2()))
    target = loaded[0] if isinstance(loaded, tuple) else loaded
    full = LlamaCppModel(default_gguf, n_ctx=256, n_threads=1)
    ids = full.llama.tokenize(b'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n')
    x = torch.tensor([ids])

    def in_llama(model):  # [P, V]
        return torch.softmax(model.open(1, "cpu").forward(x, logits_to_keep=len(ids))[0].double(), -1)

    def in_torch(model):  # [P, V]
        with torch.no_grad():
            return torch.softmax(model(x).logits[0].double(), -1)

    yardstick = float(_tv(in_llama(full), in_torch(target)).mean())  # llama.cpp's arithmetic on the same weights
    n = 12
    exit_file = LlamaCppModel(gguf_drafter(default_gguf, f"early_exit:{n}", home=tmp_path), n_ctx=256, n_threads=1)
    got = in_llama(exit_file)
    same = float(_tv(got, in_torch(early_exit_model(target, n))).mean())
    deeper = float(_tv(got, in_torch(early_exit_model(target, n + 4))).mean())
    assert same <= 2 * yardstick, (same, yardstick)
    assert same < deeper / 4, (same, deeper)


@needs_llama
def test_a_requantized_gguf_loads_and_is_another_quantization(default_gguf, tmp_path):
    path = gguf_drafter(default_gguf, "quant:Q4_0", home=tmp_path)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    source = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(default_gguf)).tensors}
    assert types.keys() == source.keys()
    assert {types[k] for k, v in source.items() if v == "Q4_1"} == {"Q4_0"}
    model = LlamaCppModel(path, n_ctx=64, n_threads=1)
    out = model.open(1, "cpu").forward(torch.tensor([[1, 2, 3]]), logits_to_keep=1)
    assert out.shape == (1, 1, 49152) and torch.isfinite(out).all()
