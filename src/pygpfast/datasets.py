"""Small real data sets shipped with pygpfast (see pygpfast/data/README.md for sources)."""

import gzip
from importlib import resources

import numpy as np

__all__ = ["load_ionosphere"]


def load_ionosphere():
    """The UCI Ionosphere radar data (CC BY 4.0).

    Returns
    -------
    X : ndarray [351, 34], float64
    y : ndarray [351] of str, 'g' (good) or 'b' (bad)
    """
    with resources.files("pygpfast").joinpath("data/ionosphere.csv.gz").open("rb") as raw:
        with gzip.open(raw, "rt") as f:
            rows = [line.strip().split(",") for line in f if line.strip()]
    X = np.array([[float(v) for v in r[:-1]] for r in rows])
    y = np.array([r[-1] for r in rows])
    return X, y
