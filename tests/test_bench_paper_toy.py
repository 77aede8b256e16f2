"""bench/paper_toy.py: its claim checks on the toy pair, and the real-pair path on a tiny cache."""

import math

import pytest
import torch

from bench import paper_toy
from mdboost.cache import StoreSettings, build_cache
from mdboost.models.pool import build_pool

RECORDS = [{"id": f"r{i}", "prompt": f"def f{i}(x):\n    y = x + {i}\n", "reference": f"    return y * {i} + y\n"}
           for i in range(3)]


def test_toy_claims_hold():
    p, q = paper_toy.toy_pair()
    c = paper_toy.claims(p, q)
    for name in paper_toy.SMOOTH:  # right-derivative 0 at P_acc(SD)
        slopes = c["slopes"][name]
        assert slopes[-1] < 1e-3 and slopes[-1] < slopes[0], (name, slopes)
        assert 0 <= c["d_plus10"][name] < 0.05
    assert c["slopes"]["tv"][-1] == pytest.approx(1.0, rel=1e-6)  # the TV oracle: D = P - P_SD
    assert c["slopes"]["tv2"][-1] >= 1.0 - 1e-6
    k = math.sqrt((1 + c["a_plus10"]) / (1 - c["b_plus10"]))
    assert c["k_plus10"] == pytest.approx(k, rel=1e-12) and c["k_plus10"] > 1.0
    assert c["r2"] > 0.99  # k is near-linear in a


def test_tv2_is_a_convex_generator_steeper_than_tv():
    z = torch.linspace(0, 4, 401, dtype=torch.float64)
    f = paper_toy.TV2.f(z)
    assert float(paper_toy.TV2.f(torch.tensor(1.0))) == 0.0
    assert bool((f[2:] - 2 * f[1:-1] + f[:-2] >= -1e-12).all())  # convex
    assert bool((f >= (z - 1).abs() / 2 - 1e-15).all())


def test_real_pair_from_a_tiny_cache_and_figures(tmp_path):
    pool = build_pool("tiny", ["early_exit:2"])
    out = tmp_path / "cache"
    build_cache(pool, RECORDS, out, StoreSettings(k=6, dtype="float32", temperatures=(1.0,)))
    p, q, names, row = paper_toy.real_pair(str(out), str(out), drafter="early_exit:2", target="tiny")
    assert names == ("early_exit:2", "tiny") and row >= 0
    assert float(p.sum()) == pytest.approx(1.0) and float(q.sum()) == pytest.approx(1.0)
    c = paper_toy.claims(p, q)
    assert math.isfinite(c["r2"]) and c["sd"] < c["max"]
    img = tmp_path / "img"
    rc = paper_toy.main(["--drafter-cache", str(out), "--target-cache", str(out), "--drafter", "early_exit:2",
                         "--target", "tiny", "--out", str(img), "--no-results"])
    assert rc == 0
    assert {x.name for x in img.iterdir()} >= {"curve.png", "curve_real.png", "beta.png", "k_real.png"}
