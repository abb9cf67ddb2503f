"""A Dask LocalCluster on loopback for the tests that need one, started and stopped by them."""

import contextlib
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
            client.close()
            cluster.close()
