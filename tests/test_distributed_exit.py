"""TorchBackend.shutdown waits for gloo's worker threads to stop before the interpreter may finalize.

A gloo worker drops its last reference to a finished collective just after the caller saw it complete; if that
drop needs the GIL while the interpreter is finalizing, the process aborts (SIGABRT; it failed CI once, and
2 of 30 runs of tests/distributed_worker.py under mpirun before the wait). ``wait_until_threads_parked``
is what shutdown uses; here it waits for a named thread that is still running.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
import time

import pytest

from hpcdl.train.distributed import wait_until_threads_parked

NAME = "hpcdl_test_busy"


def name_this_thread(name: str) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    PR_SET_NAME = 15
    libc.prctl(PR_SET_NAME, name.encode(), 0, 0, 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names and states come from Linux /proc")
def test_the_wait_returns_only_after_the_named_thread_stopped_running():
    finished_at = []
    named = threading.Event()
    release = threading.Event()

    def busy_then_asleep():
        name_this_thread(NAME)
        named.set()
        end = time.monotonic() + 0.3
        while time.monotonic() < end:  # running, as a gloo worker finishing a collective is
            pass
        finished_at.append(time.monotonic())
        release.wait()  # parked, as an idle gloo worker is

    thread = threading.Thread(target=busy_then_asleep)
    thread.start()
    named.wait()
    try:
        assert wait_until_threads_parked(NAME, timeout=10.0)
        assert finished_at and time.monotonic() >= finished_at[0]
    finally:
        release.set()
        thread.join()


def test_no_such_threads_means_no_wait():
    assert wait_until_threads_parked("no_thread_has_this_name", timeout=1.0)
