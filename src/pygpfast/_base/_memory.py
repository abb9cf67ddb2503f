"""Memory checks: a request that cannot fit is refused before it allocates, with a MemoryError
that names the size needed, the memory available and what to do instead, rather than an
``std::bad_alloc`` from the core or the kernel's OOM killer part way through a fit.

The estimators count the large arrays their own algorithms hold at their peak (the N x N
matrices of a full GP, the M x M ones of an SVGP) and call :func:`check_fits` with that
count; :func:`explain_memory_error` adds the same context to a MemoryError that still comes
out of a step (the count is an estimate, and other processes take memory too).
"""

import contextlib
import os

import numpy as np

try:
    import resource
except ImportError:  # (Windows)
    resource = None

__all__ = ["available_bytes", "check_fits", "explain_memory_error", "format_bytes"]

_GIB = float(1 << 30)


def _meminfo_available():
    """MemAvailable of /proc/meminfo in bytes (Linux), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _physical_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _cgroup_headroom():
    """The memory limit of this process's cgroup (v2 memory.max, or v1 limit_in_bytes) less
    its usage, in bytes; None when there is no limit or it cannot be read (a container's limit
    is far below the host's MemAvailable, and crossing it gets the process killed)."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:  # (v1: no limit)
            return None
        return max(int(limit) - usage, 0)
    return None


def _address_space_headroom():
    """RLIMIT_AS (``ulimit -v``) less the process's virtual size, in bytes; None without a
    limit."""
    if resource is None or not hasattr(resource, "RLIMIT_AS"):
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
    return max(soft - size, 0)


def available_bytes():
    """The memory this process can still allocate, in bytes, or None when unknown.

    Linux: MemAvailable of /proc/meminfo, lowered to the headroom under a cgroup memory limit
    (containers) and under RLIMIT_AS (``ulimit -v``) when those are set. Elsewhere: the
    physical memory (os.sysconf), an upper bound.
    """
    system = _meminfo_available()
    if system is None:
        system = _physical_memory()
    limits = [b for b in (system, _cgroup_headroom(), _address_space_headroom()) if b is not None]
    return min(limits) if limits else None


def format_bytes(n):
    """n bytes in GiB (MiB below 1 GiB), 3 significant digits."""
    if n >= _GIB:
        return f"{n / _GIB:.3g} GiB"
    return f"{n / float(1 << 20):.3g} MiB"


def _largest(available, bytes_per_square):
    """The largest n whose n x n arrays (bytes_per_square n^2 bytes) fit in `available` bytes,
    0 when that is unknown."""
    return int(np.sqrt(available / bytes_per_square)) if available else 0


def check_fits(n, bytes_per_square, what, advice):
    """MemoryError unless bytes_per_square n^2 bytes fit in :func:`available_bytes` (no check
    when that is unknown). The message reads "{what} needs about X GiB of memory, and Y GiB is
    available: {advice(largest)}", with `largest` the n that would fit."""
    needed, available = bytes_per_square * float(n) * n, available_bytes()
    if available is not None and needed > available:
        raise MemoryError(f"{what} needs about {format_bytes(needed)} of memory, and "
                          f"{format_bytes(available)} is available: "
                          f"{advice(_largest(available, bytes_per_square))}")


@contextlib.contextmanager
def explain_memory_error(n, bytes_per_square, what, advice):
    """Re-raise a MemoryError of the block (the core's ``std::bad_alloc`` arrives as
    ``MemoryError('std::bad_alloc')``) with the size estimate and the advice of
    :func:`check_fits`."""
    try:
        yield
    except MemoryError as e:
        available = available_bytes()
        now = "" if available is None else f", {format_bytes(available)} is available now"
        raise MemoryError(f"{what} ran out of memory ({e}; it needs about "
                          f"{format_bytes(bytes_per_square * float(n) * n)}{now}): "
                          f"{advice(_largest(available, bytes_per_square))}") from e
