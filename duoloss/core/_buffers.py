"""Large output buffers used again from one call to the next.

Why: a gradient as large as a transducer's joiner output (``N * T * (U + 1) * V``
floats, hundreds of MB) is a fresh ``mmap`` on every call with glibc's allocator,
and the kernel then pays a page fault and the kernel's zeroing of every 4 KiB page
as it first writes there.  Measured on the 2-core CI VM: writing a fresh 300 MB
array took 32 ms against 12 ms for the same array written a second time, in an
RNN-T step of about 55 ms.  (``MADV_HUGEPAGE`` did not help there: the zeroing
stays.)  torch's CUDA allocator caches blocks for the same reason.

How: `empty` hands out a view of a cached owner array (a 1-D ``uint8`` array that
owns its memory) when one is free and large enough.  An owner is free when nothing
but this module refers to it: every numpy view of it (and every torch tensor made
with ``torch.from_numpy`` of such a view, or anything else holding one) refers to
the owner itself, because numpy points a view's ``base`` at the array that owns the
memory.  So the owner's reference count says whether a result handed out earlier is
still alive.  A kernel writing into such a view must write every element it hands
out (tests poison a cached buffer with NaN to hold the kernels to that).

Policy: only requests of at least `MIN_BYTES` are cached; at most `MAX_BUFFERS`
owners are tracked; on a miss, the idle owners are dropped (their memory goes back
to the system) before a new one is allocated, so the memory held while idle is at
most the largest recent result.  `release` drops every idle owner now;
``DUOLOSS_BUFFER_CACHE=0`` in the environment turns the cache off (plain
``np.empty``).
"""
from __future__ import annotations

import os
import sys
import threading

import numpy as np

__all__ = ["MAX_BUFFERS", "MIN_BYTES", "empty", "enabled", "release"]

#: Smaller requests come from ``np.empty`` (glibc reuses small blocks itself).
MIN_BYTES = 32 << 20
#: Owners tracked at once (more results alive at a time: plain ``np.empty``).
MAX_BUFFERS = 4

_lock = threading.Lock()
_owners: list = []
_free_count = None  # the reference count of an owner nothing else holds


def enabled() -> bool:
    """Whether `empty` caches (``DUOLOSS_BUFFER_CACHE`` is not ``0``)."""
    return os.environ.get("DUOLOSS_BUFFER_CACHE", "1").strip() != "0"


def _refs(i: int) -> int:
    return sys.getrefcount(_owners[i])


def _offset(owner) -> int:
    return (-owner.ctypes.data) % 64


def _room(owner) -> int:
    return owner.nbytes - _offset(owner)


def _baseline() -> int:
    # measured, not assumed: what `_refs` reads for an owner only `_owners` holds
    # (CPython versions differ in the temporary references they count)
    global _free_count
    if _free_count is None:
        _owners.append(np.empty(1, np.uint8))
        try:
            _free_count = _refs(len(_owners) - 1)
        finally:
            _owners.pop()
    return _free_count


def empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array, like ``np.empty(shape, dtype)``, whose
    memory may have been written by an earlier result that is no longer alive."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < MIN_BYTES or not enabled():
        return np.empty(shape, dtype)
    with _lock:
        free = _baseline()
        owner = None
        for i in range(len(_owners)):
            if _refs(i) == free and _room(_owners[i]) >= nbytes:
                owner = _owners[i]
                break
        if owner is None:
            _drop_idle(free)
            if len(_owners) >= MAX_BUFFERS:
                return np.empty(shape, dtype)
            # 64 spare bytes: a view starting on a cache line (np.empty aligns to 16)
            owner = np.empty(nbytes + 64, np.uint8)
            _owners.append(owner)
        off = _offset(owner)
        view = owner[off:off + nbytes]
    return view.view(dtype).reshape(shape)


def _after_fork_in_child() -> None:
    # another thread may have held the lock at the fork: a fresh one, and no cache
    # (the child's copies of the parent's buffers stay valid for whoever holds them)
    global _lock, _owners
    _lock = threading.Lock()
    _owners = []


os.register_at_fork(after_in_child=_after_fork_in_child)


def release() -> int:
    """Drop every idle cached buffer now; returns the bytes released."""
    with _lock:
        if not _owners:
            return 0
        return _drop_idle(_baseline())


def _drop_idle(free: int) -> int:
    """Forget the owners nothing else refers to (under `_lock`); their bytes.  (Indices,
    not a loop over the owners: a loop variable would hold one more reference.)"""
    idle = [i for i in range(len(_owners)) if _refs(i) == free]
    freed = sum(_owners[i].nbytes for i in idle)
    for i in reversed(idle):
        del _owners[i]
    return freed
