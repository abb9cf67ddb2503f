"""Rows of large arrays with bounded memory: validation, blocks and shuffled minibatches.

A numeric 2-D numpy array (``np.memmap`` included, of any numeric dtype and memory order) is
never copied whole: it is read in blocks of contiguous rows that are converted to float64
C-contiguous arrays one at a time. Other inputs (lists, data frames, object arrays) go through
scikit-learn's ``check_array`` as usual, which converts them once.

Minibatches (:func:`minibatches`): each pass over the data visits the rows in a random order
that is built from chunks of ``CHUNK_ROWS`` contiguous rows. The chunks are put in a random
order and read in groups that fill a buffer of about ``BUFFER_BYTES``; the rows of a buffer are
shuffled and cut into minibatches, and the rows left over at the end of a buffer start the next
one. For data that fits in one buffer (100 000 rows of 4 features do) this is a uniformly
random permutation of all rows per pass; for larger data it is a permutation of chunks followed
by a permutation within each buffer, which mixes rows from dozens to thousands of places in
the file into every buffer, so that data sorted by label or time still gives representative
minibatches. Memory: one buffer (its float64 rows and targets), whatever the data size.
"""

import numpy as np
from sklearn.utils import check_array

from .._validation import core_array, naming_conversion_errors

__all__ = ["BUFFER_BYTES", "CHUNK_ROWS", "check_rows", "iter_blocks", "minibatches"]

#: Rows per contiguous chunk read from the data.
CHUNK_ROWS = 1024
#: Approximate size of one shuffling buffer (float64 rows plus targets).
BUFFER_BYTES = 1 << 25


def _is_numeric_matrix(X):
    return isinstance(X, np.ndarray) and X.ndim == 2 and X.dtype.kind in "biuf"


def block_rows(n_features):
    """Rows per block so that a float64 block stays within ``BUFFER_BYTES``."""
    return max(1, BUFFER_BYTES // (8 * (int(n_features) + 1)))


def iter_blocks(X, rows=None):
    """Yield ``(start, block)`` with ``block`` = rows ``start:start + len(block)`` of X as a
    float64 C-contiguous array; ``rows`` per block (default :func:`block_rows`)."""
    n = X.shape[0]
    rows = block_rows(X.shape[1]) if rows is None else rows
    for start in range(0, n, rows):
        yield start, core_array(X[start : start + rows])


def check_rows(X, name="X", estimator=None):
    """Validate a data matrix [N, D] without copying it whole when it is a numpy array.

    A numeric 2-D ``np.ndarray`` (or ``np.memmap``) is returned as it is, after a scan in
    blocks for NaN and infinity; anything else is converted by scikit-learn's ``check_array``
    (float64, C order). Raises ValueError for empty, non-finite or non-2-D input and for
    non-numeric data (TypeError for sparse matrices and objects that are not numbers); the
    messages name `estimator` (an estimator or None) as scikit-learn's do.
    """
    if not _is_numeric_matrix(X):
        with naming_conversion_errors(name):
            return check_array(X, dtype=np.float64, order="C", input_name=name, estimator=estimator)
    n, d = X.shape
    by = "" if estimator is None else f" by {type(estimator).__name__}"
    if n < 1:
        raise ValueError(f"Found array with 0 sample(s) (shape={X.shape}) while a minimum of 1 is "
                         f"required{by}.")
    if d < 1:
        raise ValueError(f"Found array with 0 feature(s) (shape={X.shape}) while a minimum of 1 is "
                         f"required{by}.")
    if X.dtype.kind == "f":
        for start, block in iter_blocks(X):
            if not np.isfinite(block.sum()) and not np.isfinite(block).all():
                row = start + int(np.flatnonzero(~np.isfinite(block).all(axis=1))[0])
                raise ValueError(f"Input {name} contains NaN or infinity (first in row {row}).")
    return X


def minibatches(X, t, batch_size, rng):
    """Endless minibatches ``(X_batch [B, D], t_batch [B])`` (float64, C-contiguous).

    Parameters
    ----------
    X : ndarray [N, D]
        Numeric array or ``np.memmap`` (any numeric dtype and order), read a buffer at a time.
    t : ndarray [N]
        Targets, float64 (held in memory; N floats).
    batch_size : int
        B; at most N.
    rng : numpy.random.RandomState
        Source of the orders (the same seed gives the same minibatches for an array and a
        memmap of the same data).
    """
    n, d = X.shape
    B = min(int(batch_size), n)
    n_chunks = -(-n // CHUNK_ROWS)
    chunks_per_buffer = max(1, block_rows(d) // CHUNK_ROWS, -(-B // CHUNK_ROWS))
    carry_X, carry_t = np.empty((0, d)), np.empty(0)
    while True:
        order = rng.permutation(n_chunks)
        for g in range(0, n_chunks, chunks_per_buffer):
            starts = np.sort(order[g : g + chunks_per_buffer]) * CHUNK_ROWS
            sizes = np.minimum(starts + CHUNK_ROWS, n) - starts
            X_buf = np.empty((len(carry_t) + sizes.sum(), d))
            t_buf = np.empty(X_buf.shape[0])
            X_buf[: len(carry_t)], t_buf[: len(carry_t)] = carry_X, carry_t
            pos = len(carry_t)
            for s, size in zip(starts, sizes):
                X_buf[pos : pos + size] = X[s : s + size]  # converted to float64 on the way
                t_buf[pos : pos + size] = t[s : s + size]
                pos += size
            perm = rng.permutation(X_buf.shape[0])
            n_full = X_buf.shape[0] // B
            for i in range(n_full):
                idx = perm[i * B : (i + 1) * B]
                yield X_buf[idx], t_buf[idx]
            rest = perm[n_full * B :]
            carry_X, carry_t = X_buf[rest], t_buf[rest]
            del X_buf, t_buf  # one buffer alive at a time
