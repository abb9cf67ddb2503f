"""A Dask LocalCluster on loopback for the tests that need one, started and stopped by them."""

import contextlib
import time
import warnings

import pytest


@contextlib.contextmanager
def loopback_cluster(*, processes=True, protocol=None):
    """(cluster, client): 2 workers of 1 thread on 127.0.0.1, closed on exit; the test is
    skipped without `distributed`. protocol="tcp" makes workers in this process (processes=False)
    talk over a connection instead of inproc."""
    distributed = pytest.importorskip("distributed")
    extra = {} if protocol is None else {"protocol": protocol}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=processes,
                                           host="127.0.0.1", dashboard_address=None, **extra)
        client = distributed.Client(cluster)
    try:
        yield cluster, client
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                client.close()
            finally:
                cluster.close()


def wait_for_workers(client, n, timeout):
    """Wait until the scheduler has n running workers (not with client.wait_for_workers: see
    pygpfast.moe._dask.running_workers)."""
    from pygpfast.moe._dask import running_workers
    deadline = time.monotonic() + timeout
    while running_workers(client) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {n} running Dask workers after {timeout} s")
        time.sleep(0.1)
