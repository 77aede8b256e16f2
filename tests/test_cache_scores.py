"""The work store (``mdboost.cache.scores``): content keys, one computation per key, damaged files made again."""

import pytest
import torch

import mdboost.cache.scores as scores
from mdboost.cache.scores import WorkStore, code_digest, work_key


def test_keys_change_with_every_part_and_with_the_code(monkeypatch):
    base = work_key("pair", folders=["a-1", "b-2"], settings="S(x=1)")
    assert base == work_key("pair", settings="S(x=1)", folders=["a-1", "b-2"])  # order of the parts is not content
    assert base.startswith("pair-")
    others = {work_key("frontier", folders=["a-1", "b-2"], settings="S(x=1)"),
              work_key("pair", folders=["a-1", "b-3"], settings="S(x=1)"),
              work_key("pair", folders=["a-1", "b-2"], settings="S(x=2)"),
              work_key("pair", folders=["a-1", "b-2"], settings="S(x=1)", step_law=True)}
    assert base not in others and len(others) == 4
    monkeypatch.setattr(scores, "code_digest", lambda: "other code")
    assert work_key("pair", folders=["a-1", "b-2"], settings="S(x=1)") != base


def test_code_digest_is_the_package_source():
    digest = code_digest()
    assert len(digest) == 64 and int(digest, 16) >= 0 and code_digest() == digest


def test_work_is_made_once_per_key_and_kept_atomically(tmp_path):
    store = WorkStore(tmp_path / "scores")
    calls = []

    def make():
        calls.append(1)
        return {"x": torch.arange(3.0)}

    first = store.get("pair-1", make)
    again = WorkStore(tmp_path / "scores").get("pair-1", make)  # another run: read back
    assert len(calls) == 1 and torch.equal(first["x"], again["x"])
    assert [p.name for p in (tmp_path / "scores").iterdir()] == ["pair-1.pt"]  # no temporary file left
    store.get("pair-2", make)
    assert len(calls) == 2


@pytest.mark.parametrize("damage", [b"", b"not a pickle", None], ids=["empty", "garbage", "truncated"])
def test_a_damaged_file_is_made_again_and_replaced(tmp_path, damage):
    store = WorkStore(tmp_path)
    store.get("k", lambda: torch.ones(1000))
    path = store.path("k")
    path.write_bytes(path.read_bytes()[:100] if damage is None else damage)
    assert torch.equal(store.get("k", lambda: torch.zeros(2)), torch.zeros(2))
    assert torch.equal(store.get("k", lambda: torch.ones(2)), torch.zeros(2))  # the replacement is kept


def test_a_failing_make_keeps_nothing(tmp_path):
    store = WorkStore(tmp_path / "scores")

    def fails():
        raise RuntimeError("no")

    with pytest.raises(RuntimeError, match="no"):
        store.get("k", fails)
    assert not (tmp_path / "scores").exists() or not any((tmp_path / "scores").iterdir())


def test_the_store_of_a_member_folder_is_its_cache_s(tmp_path):
    assert WorkStore.beside(tmp_path / "cache" / "tiny-0123").folder == tmp_path / "cache" / "scores"
