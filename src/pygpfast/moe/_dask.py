"""IS-MOE on a Dask cluster (``dask.distributed``, an optional dependency: ``pip install
pygpfast[distributed]``). The training data go to the workers once (``scatter``, to every
worker); each batch of importance samples is one task (:func:`._engine.fit_chunk`) that draws
its samples' partitions from their own seeds (seed, j), so a batch gives the same result on any
worker, or again after a lost worker's tasks are rescheduled. Only the weights and what the
predictions need come back.

Faults: a worker lost mid-fit costs only time (Dask runs its tasks again elsewhere, with the
same result). A fault that loses the fit's work (the client closed or cut off from the
scheduler, every worker holding the training data lost, workers dying on the same task again
and again) ends the fit with a RuntimeError that says so (:func:`cluster_failure`).
"""

import asyncio
import concurrent.futures

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


def cluster_failure(exc, client, who):
    """The RuntimeError that replaces `exc`, raised by Dask during `who`'s fit (the
    estimator's name), when it means the cluster lost the fit's work; None for an error of
    the fit itself (a task's ValueError or LinAlgError), which passes unchanged."""
    distributed = _import_distributed()
    if client.status != "running":
        what = "the Dask client was closed, or lost its connection to the scheduler"
    elif isinstance(exc, concurrent.futures.CancelledError):
        what = ("the Dask scheduler cancelled the fit's tasks: the client lost its connection "
                "to it, or every worker that held the training data died")
    elif isinstance(exc, distributed.KilledWorker):
        what = "Dask workers died, again and again, while they ran one batch of samples"
    elif isinstance(exc, (OSError, TimeoutError, asyncio.TimeoutError)):  # (CommClosedError too)
        what = "the connection to the Dask cluster failed"
    else:
        return None
    return RuntimeError(
        f"{who}.fit stopped: {what} ({type(exc).__name__}: {exc}). The estimator is left "
        "unfitted; fit again once the cluster is reachable, or with backend='threads'.")


def run_chunks(client, X, Xs, y, cfg, chunks, *, who, needed=None):
    """Yield ``(log weights [S], state)`` for each chunk (a list of S sample indices), in the
    order of `chunks`, computed on the client's workers: the log weights come back first, and
    the state (:func:`._engine.fit_chunk`'s dict) only of the samples where ``needed(log
    weights)`` is true (all when `needed` is None), selected on the worker. A fault of the
    cluster becomes :func:`cluster_failure`'s RuntimeError, naming `who`."""
    futures, scattered = [], []
    try:
        # (hash=False: keys of their own; content-hashed keys are shared with an earlier fit on
        # the same arrays, whose release at its end could race with this fit's use)
        scattered = X_f, Xs_f, y_f = client.scatter([X, Xs, y], broadcast=True, hash=False)
        futures = [client.submit(_engine.fit_chunk, X_f, Xs_f, y_f, cfg, chunk, pure=False,
                                 retries=3) for chunk in chunks]
        for future in futures:
            log_weight = client.submit(_log_weight, future, pure=False, retries=3).result()
            if needed is None:
                yield log_weight, future.result()
                continue
            keep = needed(log_weight)
            yield log_weight, client.submit(_engine.select_samples, future, keep, pure=False,
                                            retries=3).result()
    except Exception as exc:
        failure = cluster_failure(exc, client, who)
        if failure is None:
            raise
        raise failure from exc
    finally:
        if client.status == "running":  # (a closed client has dropped its futures already)
            for future in futures:
                future.cancel()
            for f in scattered:
                f.release()
