"""Shared pieces of the seed 000 experiment scripts (svgp_table1/figure1/figure2/usps.py).

Data from ``../shared/data`` (the Rätsch sets and USPS), hold-out scores through the public
estimator API, fits that record their warnings, and the run context (machine, versions, load).
"""

import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.model_selection import StratifiedKFold

import common

import pygpfast

FIGURES = Path(__file__).resolve().parents[1] / "figures"


def load_ratsch(name, n_folds=10, seed=0, published=True):
    """A Rätsch benchmark set and its train/test splits.

    Returns
    -------
    X : ndarray [N, D]
    y : ndarray [N], labels in {-1, +1}
    splits : list of (train_idx, test_idx)
        The published realisations where the file has them and ``published`` is true;
        otherwise a stratified ``n_folds``-fold split of all the rows, shuffled with ``seed``.
    how : str
        Which of the two, for the record.
    """
    d = np.load(common.data_dir() / f"ratsch_{name}.npz")
    X, y = np.asarray(d["X"], dtype=np.float64), np.asarray(d["y"])
    if name == "twonorm":
        # The file holds the raw DELVE values; Rätsch's sets are z-scored per feature (ddof=1).
        X = (X - X.mean(axis=0)) / X.std(axis=0, ddof=1)
    if published and "train_idx" in d.files:
        splits = list(zip(d["train_idx"], d["test_idx"]))
        how = f"published realisations {d['split_ids'].min()}-{d['split_ids'].max()}"
    else:
        folds = StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=seed)
        splits = list(folds.split(X, y))
        how = f"stratified {n_folds}-fold of all rows, shuffled with seed {seed}"
    return X, y, splits, how


def holdout(clf, X, y):
    """Mean hold-out negative log predictive probability (log space) and accuracy."""
    log_p = clf.predict_log_proba(X)
    col = np.searchsorted(clf.classes_, y)
    point = -log_p[np.arange(len(y)), col]
    return {"nlp": float(point.mean()), "nlp_max_point": float(point.max()),
            "acc": float(np.mean(clf.classes_[np.argmax(log_p, axis=1)] == y))}


def fit(clf, X, y):
    """Fit, timing it and catching every warning; returns (seconds, ["Category: message", ...])."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        clf.fit(X, y)
        seconds = time.perf_counter() - t0
    return seconds, [f"{w.category.__name__}: {w.message}" for w in caught]


def start(threads):
    """Set pygpfast's thread count; the context to store with the results."""
    pygpfast.set_num_threads(threads)
    return common.context(threads)


def finish(variant, ctx, payload):
    """Write ``bench/results/<script>[-<variant>].json`` (``common.write_json``)."""
    path = common.write_json({"context": ctx, **payload}, variant)
    print(f"wrote {path}")
    return path


def save_figure(fig, name, quick=False):
    """``bench/figures/<name>.png``; a --quick run's goes to ``bench/results/`` (not committed)."""
    folder = common.RESULTS if quick else FIGURES
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"wrote {path}")
    return path
