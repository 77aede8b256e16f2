"""Two ``mdboost rank`` processes on one cache dir at once: both finish, the folders they share
are intact (every checksum and layout verified, no temporary file left) and both rankings read
the same acceptances."""

import os
import subprocess
import sys

import yaml

from mdboost.cache import LogitCache
from mdboost.ranking.report import read_csv
from pipelines.config import RankConfig
from pipelines.loader import load_yaml, to_dict


def test_two_concurrent_ranks_share_one_cache(tmp_path):
    data = to_dict(load_yaml("configs/tiny.yaml", RankConfig))
    data["pool"]["drafters"] = ["early_exit:2", "ngram:2"]
    data["data"]["limit"] = 2
    data["cache"].update(dir=str(tmp_path / "cache"), cost_repeats=1)
    data["tracking"]["enabled"] = False
    data["md"]["budgets"] = [0.0, 0.3]
    configs = []
    for name in ("a", "b"):
        data["output_dir"] = str(tmp_path / name)
        configs.append(tmp_path / f"{name}.yaml")
        configs[-1].write_text(yaml.safe_dump(data))
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-m", "mdboost.cli", "rank", "--config", str(c)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in configs]
    errors = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    cfg = load_yaml(configs[0], RankConfig)
    for temperature in cfg.md.sampling_temperatures:
        spec = cfg.cache_spec(temperature)
        for member in spec.names:
            folder = spec.member_dir(member)
            assert LogitCache.open(folder).members == [member]
            assert not [p.name for p in folder.iterdir() if ".tmp" in p.name]
    a, b = (read_csv(tmp_path / name / "ranking.csv") for name in ("a", "b"))
    key = ("drafter", "target", "temperature", "divergence", "max_divergence", "gamma")
    assert sorted((tuple(r[k] for k in key), r["sd_acceptance"], r["md_acceptance"], r["nll_drafter"]) for r in a) == \
        sorted((tuple(r[k] for k in key), r["sd_acceptance"], r["md_acceptance"], r["nll_drafter"]) for r in b)
