"""Validation cells on a Dask cluster: one task per cell, each interleaved with its own AR run.

:func:`mdboost.validation.points.realize_cells` runs on one machine: the cells of one target
and temperature share one AR run, interleaved per prompt, so every speedup divides by an AR
reference made under the same load. Spread over workers, that sharing breaks: a cell on
another device or machine needs an AR reference made *there*. :func:`realize_cells_on`
therefore runs each cell as its own task, ``realize_cells([row], ...)`` on the worker (AR,
then the cell, prompt by prompt), with the pool rebuilt once per worker from
``pool.recipe``.

What changes, and what does not:

- every figure that is not a timing is the same as :func:`~mdboost.validation.points.realize_cells`'
  (acceptance, accepted length, divergence, NLL, the speed model at realized acceptance):
  prompt ``i`` is generated with seed ``seed + i`` in every mode, whichever process runs it;
- ``tokens_per_second``, ``ar_tokens_per_second`` and ``realized_speedup`` are measured on
  the worker that ran the cell, against its own AR. They mean what the ranking predicts only
  when a worker has its device to itself: one GPU per worker (``docs/scale_out.md``), or CPU
  workers on separate machines. Workers sharing CPU cores (a ``local`` cluster of CPU
  workers) slow each other down unevenly, and their speedups are distorted; their AR runs are
  also repeated once per cell instead of once per group.
"""

from __future__ import annotations

from mdboost.engine.costs import torch_threads
from mdboost.models.pool import build_pool
from mdboost.validation.points import realize_cells

_WORKER_POOLS: dict = {}


def _worker_pool(recipe: dict, names: tuple[str, ...]):
    """The pool of ``names`` rebuilt from ``recipe``, once per worker process."""
    key = (repr(sorted(recipe.items())), names)
    if key not in _WORKER_POOLS:
        _WORKER_POOLS.clear()  # one pool per worker: the models of another validation go first
        drafters = [n for n in names if n != recipe["target"]]
        _WORKER_POOLS[key] = build_pool(recipe["target"], drafters, recipe["device"], recipe["home"],
                                        dtype=recipe["dtype"], fit_source=recipe["fit_source"],
                                        fit_positions=recipe["fit_positions"])
    return _WORKER_POOLS[key]


def _realize_one(recipe: dict, names: tuple[str, ...], row: dict, prompts, threads: int | None, kwargs: dict) -> dict:
    pool = _worker_pool(recipe, names)
    with torch_threads(threads):
        return realize_cells([row], pool, prompts, **kwargs)[0]


def realize_cells_on(client, rows: list[dict], recipe: dict, prompts, *, threads: int | None = 1,
                     max_new_tokens: int = 64, seed: int = 0, top_k: int | None = None,
                     top_p: float | None = None, passes: int = 1) -> list[dict]:
    """:func:`~mdboost.validation.points.realize_cells` of ``rows`` on ``client``'s workers, one task per cell.

    Parameters
    ----------
    client : distributed.Client
        The cluster (:func:`mdboost.cluster.dask_client`).
    rows : list of dict
        Ranking cells, as for :func:`~mdboost.validation.points.realize_cells`.
    recipe : dict
        The pool's ``build_pool`` arguments (``pool.recipe`` of :func:`mdboost.models.pool.build_pool`);
        every worker rebuilds the pool of the cells' members from it, once. Its ``device`` is the
        device name each worker loads on: ``"cuda"`` (or ``"cuda:0"``) is every GPU worker's own
        GPU when each sees one (``CUDA_VISIBLE_DEVICES``).
    prompts : list of Tensor
        Prompt ids (``[T]`` each), sent to every task.
    threads : int or None, default=1
        torch threads in each task (``None``: the worker's as is); 1 is the thread count the
        ranking's costs are measured at (:data:`mdboost.engine.costs.ENGINE_THREADS`).
    max_new_tokens, seed, top_k, top_p, passes
        As for :func:`~mdboost.validation.points.realize_cells`.

    Returns
    -------
    list of dict
        One dict per row (same order), with the keys of
        :func:`~mdboost.validation.points.realize_cells`; the timings are the worker's, against
        its own AR run (module docstring).
    """
    if recipe is None:
        raise ValueError("recipe must be a pool's build_pool arguments (pool.recipe), got None")
    if not rows:
        return []
    names = tuple(sorted({n for r in rows for n in (r["drafter"], r["target"])} | {recipe["target"]}))
    kwargs = dict(max_new_tokens=max_new_tokens, seed=seed, top_k=top_k, top_p=top_p, passes=passes)
    futures = [client.submit(_realize_one, recipe, names, row, prompts, threads, kwargs, pure=False) for row in rows]
    return client.gather(futures)
