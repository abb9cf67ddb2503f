"""Thread control."""

import os
import subprocess
import sys

import numpy as np
import pytest

import pygpfast


def test_set_and_get(restore_threads):
    pygpfast.set_num_threads(1)
    assert pygpfast.get_num_threads() == 1
    pygpfast.set_num_threads(3)
    assert pygpfast.get_num_threads() == 3
    pygpfast.set_num_threads(np.int64(2))  # (numpy integers were refused)
    assert pygpfast.get_num_threads() == 2
    pygpfast.set_num_threads(None)
    assert pygpfast.get_num_threads() >= 1


def test_set_num_threads_limits_blas(restore_threads):
    from threadpoolctl import threadpool_info

    pygpfast.set_num_threads(1)
    blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
    assert blas and all(p["num_threads"] == 1 for p in blas)


@pytest.mark.parametrize("bad", [1.5, "2", True, np.True_])
def test_bad_thread_count(bad):
    with pytest.raises(ValueError):
        pygpfast.set_num_threads(bad)


def test_default_honours_omp_num_threads(tmp_path):
    if not pygpfast._core.openmp_enabled():
        pytest.skip("core built without OpenMP")
    # Import the same pygpfast as this test session (installed or built in place).
    package_root = os.path.dirname(os.path.dirname(pygpfast.__file__))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=package_root)
    out = subprocess.run(
        [sys.executable, "-c", "import pygpfast; print(pygpfast.get_num_threads())"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "1"
