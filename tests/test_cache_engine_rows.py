"""Cached rows are what the engine's drafter computes: members whose outputs depend on the other
tokens of a forward (dynamic int8 quantization) are cached one token per forward, like drafting."""

import pytest
import torch

from mdboost.cache import LogitCache
from mdboost.cache.build import build_cache, member_logits
from mdboost.cache.settings import RunOptions, StoreSettings
from mdboost.engine.kv import CachedLM
from mdboost.models.drafters import mixes_positions
from mdboost.models.pool import build_pool

RECORDS = [{"id": f"r{i}", "prompt": f"def h{i}(x):\n    y = x + {i}\n", "reference": "    return y * 2\n"}
           for i in range(2)]


@pytest.fixture(scope="module")
def pool():
    return build_pool("tiny", ["early_exit:2", "tuned:2", "int8"])


def _engine_rows(model, ids: torch.Tensor, start: int) -> torch.Tensor:  # [T] -> [T - start, V]
    """Logits the engine's drafter sees: prompt prefill, then one token per KV-cached forward."""
    lm = CachedLM(model, 1, ids.device)
    rows = [lm.forward(ids[None, :start], logits_to_keep=1)[0, -1]]
    for t in range(start, ids.numel() - 1):
        rows.append(lm.forward(ids[None, t:t + 1], logits_to_keep=1)[0, -1])
    return torch.stack(rows).float()


def test_only_dynamic_quantization_mixes_positions(pool):
    assert mixes_positions(pool["int8"].model)
    assert not any(mixes_positions(pool[m].model) for m in ("tiny", "early_exit:2", "tuned:2"))


def test_int8_whole_sequence_forward_is_not_what_the_engine_computes(pool):
    # the cause: one activation scale per forward; if this stopped holding the stepwise path
    # would be unnecessary (and this test says so)
    ids = torch.arange(3, 23) % 50
    model = pool["int8"].model
    whole = model(input_ids=ids[None], use_cache=False).logits[0, 4:-1].float()
    assert not torch.allclose(whole, _engine_rows(model, ids, 5), atol=1e-4)


def test_cached_rows_equal_the_engine_drafter_rows(pool, tmp_path):
    store, run = StoreSettings(k=8, keep_full=True), RunOptions(progress=False)
    folders = {m: build_cache(pool, RECORDS, tmp_path / m.replace(":", "_"), store, members=[m], run=run)
               for m in ("early_exit:2", "tuned:2", "int8")}
    for name, folder in folders.items():
        cache = LogitCache.open(folder)
        full = cache.full_logits(name).float()  # [R, V] (stored in fp16)
        seq = cache.row_sequence()
        for s in range(len(RECORDS)):
            ids, start = cache.sequence(s)
            engine = _engine_rows(pool[name].model, ids, start)
            cached = full[seq == s]
            assert cached.shape == engine.shape
            if name == "int8":  # exactly the stepwise rows (up to the fp16 storage)
                assert torch.equal(member_logits(pool[name].model, ids, start), engine)
                assert torch.equal(cached, engine.half().float())
            else:  # position-independent members: one whole-sequence forward, the same numbers
                torch.testing.assert_close(cached, engine, atol=2e-3, rtol=2e-3)
