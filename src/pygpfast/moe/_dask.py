"""IS-MOE on a Dask cluster (``dask.distributed``, an optional dependency: ``pip install
pygpfast[distributed]``). The training data go to the workers once (``scatter``, to every
worker); each batch of importance samples is one task (:func:`._engine.fit_chunk`) that draws
its samples' partitions from their own seeds (seed, j), so a batch gives the same result on any
worker, or again after a lost worker's tasks are rescheduled. Only the weights and what the
predictions need come back.

Faults: a worker lost mid-fit costs only time. Dask runs its tasks again elsewhere, with the
same result; when the data went with it (Dask's active memory manager keeps one copy of
broadcast data once the tasks that need it have started, and every worker may be lost), the
fit scatters them again and submits the batches still to come, up to ``_RESUBMITS`` times,
after waiting up to ``_WORKER_WAIT`` seconds for a worker. A fault that loses the fit's work
for good (the client closed or cut off from the scheduler, no worker left, workers dying on the
same task again and again) ends the fit with a RuntimeError that says so
(:func:`cluster_failure`).
"""

import asyncio
import concurrent.futures
import dataclasses
import time

import numpy as np

from .._validation import aligned
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


#: Times a fit scatters its data again and resubmits its batches after Dask cancelled them.
_RESUBMITS = 3
#: Seconds a fit waits for a worker to (re)join before it scatters its data again.
_WORKER_WAIT = 30.0


def _log_weight(result):
    return result["log_weight"]


def _fit_chunk(X, Xs, y, cfg, samples):
    """:func:`._engine.fit_chunk` on a worker, on aligned arrays (an array unpickled from a
    Dask message can start at any byte of the message's buffer, and the compiled core reads
    only aligned arrays: UBSan found the kernel codes misaligned on a worker)."""
    cfg = dataclasses.replace(cfg, codes=aligned(cfg.codes), params0=aligned(cfg.params0),
                              lower=aligned(cfg.lower), upper=aligned(cfg.upper))
    return _engine.fit_chunk(aligned(X), aligned(Xs), aligned(y), cfg, samples)


def _received(state):
    """A chunk's state as it came back, its arrays aligned."""
    return {k: aligned(v) if isinstance(v, np.ndarray) else v for k, v in state.items()}


def cluster_failure(exc, client, who):
    """The RuntimeError that replaces `exc`, raised by Dask during `who`'s fit (the
    estimator's name), when it means the cluster lost the fit's work; None for an error of
    the fit itself (a task's ValueError or LinAlgError), which passes unchanged."""
    distributed = _import_distributed()
    if client.status != "running":
        what = "the Dask client was closed, or lost its connection to the scheduler"
    elif isinstance(exc, concurrent.futures.CancelledError):
        what = (f"the Dask scheduler cancelled the fit's tasks again after {_RESUBMITS} "
                "resubmissions (the workers that held its data were lost, or the client's "
                "connection to the scheduler dropped)")
    elif isinstance(exc, distributed.KilledWorker):
        what = "Dask workers died, again and again, while they ran one batch of samples"
    elif isinstance(exc, (OSError, TimeoutError, asyncio.TimeoutError)):  # (CommClosedError too)
        what = "the connection to the Dask cluster failed"
    else:
        return None
    return RuntimeError(
        f"{who}.fit stopped: {what} ({type(exc).__name__}: {exc}). The estimator is left "
        "unfitted; fit again once the cluster is reachable, or with backend='threads'.")


class _Submitted:
    """A fit's data scattered to the workers and its batches (``futures``: chunk index ->
    future of :func:`._engine.fit_chunk`) submitted."""

    def __init__(self, client, X, Xs, y, cfg, chunks):
        self.client, self.arrays, self.cfg, self.chunks = client, [X, Xs, y], cfg, chunks
        self.data, self.futures = [], {}

    def submit(self, first):
        """Scatter the data (again) and submit the chunks from `first` on."""
        self.release()
        # (hash=False: keys of their own; content-hashed keys are shared with an earlier fit
        # on the same arrays, whose release at its end could race with this fit's use)
        self.data = self.client.scatter(self.arrays, broadcast=True, hash=False)
        self.futures = {i: self.client.submit(_fit_chunk, *self.data, self.cfg,
                                              self.chunks[i], pure=False, retries=3)
                        for i in range(first, len(self.chunks))}

    def release(self):
        if self.client.status == "running":  # (a closed client has dropped its futures)
            for future in self.futures.values():
                future.cancel()
            for f in self.data:
                f.release()
        self.data, self.futures = [], {}


def _chunk_result(client, future, needed):
    """(log weights, state) of one chunk's future (see :func:`run_chunks`)."""
    log_weight = client.submit(_log_weight, future, pure=False, retries=3).result()
    if needed is None:
        return log_weight, _received(future.result())
    keep = needed(log_weight)
    return log_weight, _received(client.submit(_engine.select_samples, future, keep, pure=False,
                                               retries=3).result())


def run_chunks(client, X, Xs, y, cfg, chunks, *, who, needed=None):
    """Yield ``(log weights [S], state)`` for each chunk (a list of S sample indices), in the
    order of `chunks`, computed on the client's workers: the log weights come back first, and
    the state (:func:`._engine.fit_chunk`'s dict) only of the samples where ``needed(log
    weights)`` is true (all when `needed` is None), selected on the worker. When Dask cancels
    the fit's tasks and the client is still connected (the data were lost with a worker),
    the data are scattered again and the chunks still to come resubmitted; a fault of the
    cluster becomes :func:`cluster_failure`'s RuntimeError, naming `who`."""
    run = _Submitted(client, X, Xs, y, cfg, chunks)
    resubmits = 0
    try:
        run.submit(0)
        for i in range(len(chunks)):
            while True:
                try:
                    result = _chunk_result(client, run.futures[i], needed)
                    break
                except concurrent.futures.CancelledError:
                    if resubmits == _RESUBMITS or client.status != "running":
                        raise
                resubmits += 1
                _resubmit(run, i, who)
            yield result
    except Exception as exc:
        failure = cluster_failure(exc, client, who)
        if failure is None:
            raise
        raise failure from exc
    finally:
        run.release()


def running_workers(client):
    """How many workers the scheduler has running. (Not ``client.wait_for_workers``: for a
    client made from a cluster object it refreshes the cluster's copy of the scheduler's state,
    and a worker removal still in flight then breaks the cluster's watcher, whose KeyError
    comes back from the user's ``cluster.close()``.)"""
    workers = client.scheduler_info()["workers"].values()
    return sum(w.get("status", "running") == "running" for w in workers)


def _resubmit(run, first, who):
    """Scatter the data again and submit the chunks from `first` on, once a worker has joined,
    within ``_WORKER_WAIT`` seconds. A worker counted as running may be leaving (its retirement
    not yet seen): the scatter then finds no worker and times out, and the wait goes on until
    the deadline."""
    deadline = time.monotonic() + _WORKER_WAIT
    last = None
    while time.monotonic() < deadline:
        if running_workers(run.client):
            try:
                run.submit(first)
                return
            except (TimeoutError, asyncio.TimeoutError) as exc:  # (no valid worker found)
                if run.client.status != "running":
                    raise
                last = exc
        time.sleep(0.1)
    why = "" if last is None else f" ({type(last).__name__}: {last})"
    raise RuntimeError(
        f"{who}.fit stopped: the Dask cluster lost the fit's data with its workers, and no "
        f"worker joined it within {_WORKER_WAIT:g} s{why}. The estimator is left unfitted; fit "
        "again once the cluster has workers, or with backend='threads'.")
