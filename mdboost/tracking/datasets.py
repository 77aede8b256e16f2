"""The prompts a run used, as an MLflow dataset input (``mlflow.log_input``).

A ranking reads the records of its cache split, a validation the held-out records it generated
on (``mdboost.data``: the split is a salted hash of the record id, so the two never overlap).
:func:`records_dataset` turns such records into an MLflow ``PandasDataset`` (columns ``id``,
``prompt``, ``reference``) whose digest is the start of :func:`mdboost.data.dataset_fingerprint`
-- the SHA-256 over ids, prompts and references that the cache manifest records as
``dataset_fingerprint`` -- so the UI's dataset chip names the same content the cache was built
on. :func:`log_records` logs it on the active run with the split, the context and the full
fingerprint as input tags. MLflow stores the schema and the row count, not the texts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from mdboost.data import TextSource, dataset_fingerprint, humaneval_path

DIGEST_CHARS = 32
"""Hex characters of the fingerprint kept as MLflow's digest (its store holds at most 36)."""
FINGERPRINT_TAG, SPLIT_TAG = "mdboost.dataset_fingerprint", "mdboost.split"


def source_name(text: TextSource) -> str:
    """A dataset's display name stem: ``humaneval``, a local file's name without its
    extensions, or the hub name.

    >>> source_name(TextSource())
    'humaneval'
    >>> source_name(TextSource(source="org/data.v2"))  # no such file: a hub name
    'org/data.v2'
    """
    if text.source == "humaneval":
        return "humaneval"
    path = Path(text.source).expanduser()
    return path.name.split(".")[0] if path.is_file() else text.source


def _source(text: TextSource):
    """MLflow's source of the records: the local file (HumanEval's bundled one), else the hub dataset."""
    # deferred: mlflow: seconds to import; the library runs without a tracking server
    from mlflow.data.dataset_source_registry import get_registered_sources
    from mlflow.data.huggingface_dataset_source import HuggingFaceDatasetSource

    path = humaneval_path() if text.source == "humaneval" else Path(text.source).expanduser()
    if not path.exists():
        return HuggingFaceDatasetSource(path=text.source, split="train")
    # MLflow registers its local-file source once per scheme ("" and "file"): take the first
    # instead of letting its resolver warn that the URI matches both
    local = next(s for s in get_registered_sources() if s._get_source_type() == "local")
    return local(path.resolve().as_uri())


def records_dataset(records: Sequence[dict], text: TextSource, split: str):
    """An MLflow ``PandasDataset`` of ``records`` (``id``, ``prompt``, ``reference``).

    Parameters
    ----------
    records : sequence of dict
        ``{"id", "prompt", "reference", ...}`` records (:func:`mdboost.data.load_texts`), in
        the order the run used them.
    text : TextSource
        Where they were read from (the dataset's source and name).
    split : str
        The split they belong to (``cache``, ``heldout`` or ``all``), part of the name.

    Returns
    -------
    mlflow.data.pandas_dataset.PandasDataset
        Named ``<source>:<split>``, digest: the first :data:`DIGEST_CHARS` hex characters of
        :func:`mdboost.data.dataset_fingerprint`.
    """
    import mlflow.data  # deferred: mlflow and pandas: seconds to import; the library runs without a tracking server
    import pandas as pd

    if not records:
        raise ValueError("records must hold at least one record, got none")
    if not isinstance(split, str) or not split:
        raise ValueError(f"split must be a non-empty string, got {split!r}")
    frame = pd.DataFrame({key: [str(r[key]) for r in records] for key in ("id", "prompt", "reference")})
    return mlflow.data.from_pandas(frame, source=_source(text), name=f"{source_name(text)}:{split}",
                                   digest=dataset_fingerprint(list(records))[:DIGEST_CHARS])


def log_records(records: Sequence[dict], text: TextSource, split: str, context: str):
    """Log ``records`` as a dataset input of the active MLflow run; returns the dataset.

    Input tags: ``mlflow.data.context`` = ``context`` (e.g. ``ranking``, ``validation``),
    :data:`SPLIT_TAG` = ``split`` and :data:`FINGERPRINT_TAG` = the full SHA-256 fingerprint.
    """
    import mlflow  # deferred: mlflow: seconds to import; the library runs without a tracking server

    dataset = records_dataset(records, text, split)
    mlflow.log_input(dataset, context=context,
                     tags={SPLIT_TAG: split, FINGERPRINT_TAG: dataset_fingerprint(list(records))})
    return dataset
