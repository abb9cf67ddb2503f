"""IS-MOE on a Dask cluster (``dask.distributed``, an optional dependency: ``pip install
pygpfast[distributed]``). The training data go to the workers once (``scatter``, to every
worker); each batch of importance samples is one task (:func:`._engine.fit_chunk`) that draws
its samples' partitions from their own seeds (seed, j), so a batch gives the same result on any
worker, or again after a lost worker's tasks are rescheduled. Only the weights and what the
predictions need come back.
"""

import dataclasses

import numpy as np

from . import _engine


def _import_distributed():
    try:
        import distributed
    except ImportError as exc:
        raise ImportError(
            "backend='dask' (or a client) needs dask.distributed, which is not installed; "
            "install it with `pip install pygpfast[distributed]` (or `pip install "
            "'dask[distributed]'`), or use backend='threads'") from exc
    return distributed


def resolve_client(client, backend):
    """The Dask client to use, or None for threads in this process: `client` when given, the
    current client (``distributed.get_client``) for backend='dask'."""
    if backend == "threads":
        if client is not None:
            raise ValueError("client is given but backend='threads'; pass backend=None or "
                             "'dask' to use the client")
        return None
    if client is not None:
        return client
    if backend == "dask":
        distributed = _import_distributed()
        try:
            return distributed.get_client()
        except ValueError as exc:
            raise ValueError(
                "backend='dask' found no Dask client; start one (distributed.Client(...)) or "
                "pass client=") from exc
    return None


def _log_weight(result):
    return result["log_weight"]


def _aligned(a):
    """`a`, or an aligned C-contiguous copy of it. An array unpickled from a Dask message can
    start at any byte of the message's buffer, and the compiled core reads only aligned arrays
    (a misaligned load is undefined behaviour; UBSan found the kernel codes misaligned on a
    worker)."""
    return np.require(a, requirements="CA")


def _fit_chunk(X, Xs, y, cfg, samples):
    """:func:`._engine.fit_chunk` on a worker, on aligned arrays."""
    cfg = dataclasses.replace(cfg, codes=_aligned(cfg.codes), params0=_aligned(cfg.params0),
                              lower=_aligned(cfg.lower), upper=_aligned(cfg.upper))
    return _engine.fit_chunk(_aligned(X), _aligned(Xs), _aligned(y), cfg, samples)


def _received(state):
    """A chunk's state as it came back, its arrays aligned."""
    return {k: _aligned(v) if isinstance(v, np.ndarray) else v for k, v in state.items()}


def run_chunks(client, X, Xs, y, cfg, chunks, needed=None):
    """Yield ``(log weights [S], state)`` for each chunk (a list of S sample indices), in the
    order of `chunks`, computed on the client's workers: the log weights come back first, and
    the state (:func:`._engine.fit_chunk`'s dict) only of the samples where ``needed(log
    weights)`` is true (all when `needed` is None), selected on the worker."""
    # (hash=False: keys of their own; content-hashed keys are shared with an earlier fit on the
    # same arrays, whose release at its end could race with this fit's use)
    X_f, Xs_f, y_f = client.scatter([X, Xs, y], broadcast=True, hash=False)
    futures = [client.submit(_fit_chunk, X_f, Xs_f, y_f, cfg, chunk, pure=False, retries=3)
               for chunk in chunks]
    try:
        for future in futures:
            log_weight = client.submit(_log_weight, future, pure=False, retries=3).result()
            if needed is None:
                yield log_weight, _received(future.result())
                continue
            keep = needed(log_weight)
            yield log_weight, _received(client.submit(_engine.select_samples, future, keep,
                                                      pure=False, retries=3).result())
    finally:
        for future in futures:
            future.cancel()
        for f in (X_f, Xs_f, y_f):
            f.release()
