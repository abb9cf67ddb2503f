"""Binary data with a share of flipped labels, for the label-noise tests of every family."""

import numpy as np


def flipped_data(n=300, flip=0.1, seed=0):
    """X [n, 2] uniform on [-3, 3]^2, y [n] in {0, 1} from sin(x_1) + x_2 / 2 > 0, with each
    label flipped with probability `flip`."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, (n, 2))
    y = (np.sin(X[:, 0]) + 0.5 * X[:, 1] > 0).astype(int)
    flips = rng.random(n) < flip
    y[flips] = 1 - y[flips]
    return X, y
