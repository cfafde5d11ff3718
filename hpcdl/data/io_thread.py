"""The one owner of every HDF5/netCDF library call in a process: a single I/O thread.

NOTE [ HDF5 I/O owner ]
The HDF5 library under h5py and netCDF4 is not built thread-safe, and netCDF-C keeps global state
with no lock at all. A lock around reads is not enough: a ``netCDF4.Dataset`` sits in a reference
cycle with its own Variables and Dimensions, so only the garbage collector frees one, in whichever
thread it happens to run, and an open Dataset's ``__dealloc__`` calls ``nc_close`` right there —
outside any lock, while a prefetch thread reads another file (issue 9: the demo's second training
failed with "NetCDF: HDF error", SIGSEGV or SIGABRT). So one thread owns the library:

- Every library call — open, metadata checks, reads, close — runs in the owner thread. Callers
  submit a function with :func:`call` and wait for its result; its exception (the data errors
  that name the file) is raised in the caller.
- Open handles live in the owner's table; readers hold integer keys. The owner closes a handle
  before it drops it, so when the garbage collector later frees the Python object, in any thread,
  no library call happens: netCDF4's ``Dataset.__dealloc__`` calls ``nc_close`` only while the
  file is open, and h5py's ``File.close`` invalidates every object id of the file. A handle whose
  close fails stays referenced in ``_NEVER_FREED`` instead of being left for the collector.
- A reader's finalizer only *posts* a close (:func:`release`); it never calls the library.
- After ``fork`` (DataLoader workers, MPI launchers) the child moves the inherited handles to
  ``_NEVER_FREED`` — they belong to the parent's library state and are never touched or freed —
  and starts its own owner on first use. A fork waits for a running job, so the child's copy of
  the library is never taken mid-call.
- At interpreter exit the owner closes every handle still open, before modules are torn down.

One thread costs no parallelism: HDF5 serialises its calls anyway. A call's hand-over costs a few
tens of microseconds (docs/data.md has the measured read times).
"""

from __future__ import annotations

import atexit
import gc
import itertools
import os
import queue
import threading
import weakref
from typing import Any

#: Handles that must never be closed or freed by this process: inherited through fork, or whose
#: close failed (freeing those would make the collector call the library in some other thread).
_NEVER_FREED: list = []
_KEYS = itertools.count(1)  # continues across fork, so a child's keys never equal an inherited one
_STOP = object()


class _Job:
    """One function for the owner to run; ``done`` is released when it has (if someone waits)."""

    __slots__ = ("fn", "args", "result", "error", "done")

    def __init__(self, fn, args: tuple, wait: bool) -> None:
        self.fn, self.args = fn, args
        self.result = self.error = None
        self.done: threading.Lock | None = threading.Lock() if wait else None
        if self.done is not None:
            self.done.acquire()

    def wait(self, timeout: float = -1) -> bool:
        """Block until the owner has run this job (made with ``wait=True``), at most ``timeout`` seconds."""
        assert self.done is not None, "a job made with wait=False cannot be waited for"
        return self.done.acquire(timeout=timeout)


class _Owner:
    """The owner thread of this process, its job queue and its table of open handles."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.handles: dict[int, Any] = {}
        self.busy = threading.Lock()  # held while a job runs; fork takes it to wait for a quiet library
        self.stopped = False
        self.thread = threading.Thread(target=self._serve, name="hpcdl-hdf5-io", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            job = self.jobs.get()
            if job is _STOP:
                return
            with self.busy:
                try:
                    job.result = job.fn(*job.args)
                except BaseException as err:  # handed to the caller, who raises it
                    job.error = err
            if job.done is not None:
                job.done.release()
            del job  # the job's arguments and result must not outlive it here


_owner: _Owner | None = None
_owner_lock = threading.Lock()


def _current() -> _Owner:
    """This process's owner, started on first use."""
    global _owner
    with _owner_lock:
        if _owner is None:
            _owner = _Owner()
        if _owner.stopped:
            raise RuntimeError("the HDF5/netCDF I/O thread has stopped: the interpreter is exiting")
        return _owner


def in_owner() -> bool:
    """Whether the calling thread is this process's owner thread."""
    owner = _owner
    return owner is not None and owner.pid == os.getpid() and threading.current_thread() is owner.thread


def call(fn, *args):
    """Run ``fn(*args)`` in the owner thread and return its result, or raise its exception here."""
    if in_owner():
        return fn(*args)
    owner = _current()
    job = _Job(fn, args, wait=True)
    owner.jobs.put(job)
    job.wait()
    if job.error is not None:
        error, job.error = job.error, None
        raise error
    return job.result


def _require_owner() -> _Owner:
    if not in_owner():
        raise RuntimeError("HDF5/netCDF handles may be used only in the I/O owner thread; submit the work with "
                           "hpcdl.data.io_thread.call")
    assert _owner is not None  # in_owner() found it
    return _owner


def open_handle(opener, path):
    """(Owner thread only.) ``opener(path)`` into the table; returns its key.

    If the opener fails, a half-built handle (netCDF4 sets a Dataset open before it has read the
    metadata) is collected here, in the owner, before the error travels on.
    """
    owner = _require_owner()
    failed = False
    try:
        handle = opener(path)
    except BaseException:
        failed = True
        raise
    finally:
        if failed:
            gc.collect()
    key = next(_KEYS)
    owner.handles[key] = handle
    return key


def get_handle(key: int | None):
    """(Owner thread only.) The open handle of ``key``, or None: never opened here, or closed."""
    handles = _require_owner().handles
    return None if key is None else handles.get(key)


def close_handles(keys) -> None:
    """(Owner thread only.) Close and drop the handles of ``keys`` that are open in this process."""
    owner = _require_owner()
    for key in list(keys):
        handle = owner.handles.pop(key, None)
        if handle is None:
            continue
        try:
            handle.close()
        except Exception:  # still open: the collector must never free it (it would close it elsewhere)
            _NEVER_FREED.append(handle)


def close_keys(keys: dict) -> None:
    """(Owner thread only.) Close the handles of a reader's ``{file index: key}`` dict and empty it."""
    close_handles(list(keys.values()))
    keys.clear()


def release(keys: dict) -> None:
    """Post :func:`close_keys` of ``keys`` to the owner and return at once: safe in a finalizer, any thread.

    Nothing is posted where this process never started an owner (nothing can be open here).
    """
    owner = _owner
    if owner is None or owner.pid != os.getpid() or owner.stopped:
        return
    owner.jobs.put(_Job(close_keys, (keys,), wait=False))


def finalizer(obj, keys: dict) -> weakref.finalize:
    """Release ``keys`` (the handle keys that ``obj`` owns) when ``obj`` is garbage-collected."""
    return weakref.finalize(obj, release, keys)


def open_count() -> int:
    """Number of handles open in this process's table (for tests and diagnostics)."""
    owner = _owner
    if owner is None or owner.pid != os.getpid():
        return 0
    return call(lambda: len(owner.handles))


def _before_fork() -> None:
    owner = _owner
    if owner is not None and owner.pid == os.getpid() and not in_owner():
        owner.busy.acquire()


def _after_fork_in_parent() -> None:
    owner = _owner
    if owner is not None and owner.pid == os.getpid() and not in_owner():
        owner.busy.release()


def _after_fork_in_child() -> None:
    global _owner, _owner_lock
    _owner_lock = threading.Lock()
    if _owner is not None:
        _NEVER_FREED.append(_owner.handles)  # the parent's: never touched or freed here
        _owner = None  # the thread did not survive the fork; a fresh owner starts on first use


def _close_all_at_exit() -> None:
    """Close every open handle in the owner and stop it, before module teardown frees anything."""
    owner = _owner
    if owner is None or owner.pid != os.getpid() or owner.stopped:
        return
    job = _Job(lambda: close_handles(list(owner.handles)), (), wait=True)
    owner.jobs.put(job)
    if job.wait(timeout=30):
        owner.stopped = True
        owner.jobs.put(_STOP)
    else:  # a read still hangs in the library: keep every handle alive rather than free it under it
        _NEVER_FREED.append(owner.handles)


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
atexit.register(_close_all_at_exit)
