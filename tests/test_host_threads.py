"""The host kernels run on as many OpenMP threads as torch's intra-op pool, from whichever thread calls them.

OpenMP's thread count is per calling thread: ``torch.set_num_threads`` sets it for the thread that calls it,
and a fresh thread starts from OMP_NUM_THREADS or every core. hpcdl.compress.blocks.host sets the calling
thread's count to ``torch.get_num_threads()`` before each kernel call; these checks read the count the
kernel call left in force (what its parallel loops used). The ``hpcdl`` command also makes idle OpenMP
threads sleep rather than spin (OMP_WAIT_POLICY), unless the user chose.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

from hpcdl.compress import get_codec
from hpcdl.compress.blocks import host

from conftest import require

SZ = {"id": "sz", "mode": "rel", "bound": 1e-2}


def openmp_threads_after(call) -> tuple[int, int]:
    """In a fresh thread: (OpenMP's thread count before ``call()``, and after it)."""
    get_threads, _ = host._OPENMP
    seen = {}

    def run():
        seen["before"] = get_threads()
        call()
        seen["after"] = get_threads()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return seen["before"], seen["after"]


@pytest.fixture
def torch_threads():
    """Restore torch's thread count after the test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_fresh_thread_encodes_and_decodes_on_torchs_thread_count(torch_threads):
    require(host.AVAILABLE and host._OPENMP is not None, "the host kernel library is not built with OpenMP")
    require((os.cpu_count() or 1) > 1 and os.environ.get("OMP_NUM_THREADS", "2") != "1",
            "OpenMP's default is one thread here, so a fresh thread's count cannot differ from torch's")
    codec = get_codec(SZ)
    x = torch.randn(1 << 20)
    torch.set_num_threads(1)
    before, after = openmp_threads_after(lambda: codec.encode(x))
    assert before > 1, "the check is void: a fresh thread already ran on one thread"
    assert after == 1
    packed = codec.encode(x)
    assert openmp_threads_after(lambda: codec.decode(packed))[1] == 1


def test_a_later_set_num_threads_applies_to_the_next_call(torch_threads):
    require(host.AVAILABLE and host._OPENMP is not None, "the host kernel library is not built with OpenMP")
    codec = get_codec(SZ)
    x = torch.randn(1 << 16)
    torch.set_num_threads(1)
    codec.encode(x)
    torch.set_num_threads(2)
    codec.encode(x)
    assert host._OPENMP[0]() == 2


def environment_seen_by(program: str, **settings: str | None) -> str:
    """What ``program`` prints, run in a fresh Python with each of ``settings`` set (None: unset)."""
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key not in settings}
    env.update({key: value for key, value in settings.items() if value is not None})
    return subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


CLI_START = ("import os\nfrom hpcdl.cli import set_process_defaults\nset_process_defaults()\n"
             "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('THP_MEM_ALLOC_ENABLE'))")


def test_the_command_makes_idle_openmp_threads_sleep_and_uses_huge_pages_unless_the_user_chose():
    unset = {"OMP_WAIT_POLICY": None, "THP_MEM_ALLOC_ENABLE": None}
    assert environment_seen_by(CLI_START, **unset) == "PASSIVE 1"
    assert environment_seen_by(CLI_START, OMP_WAIT_POLICY="active", THP_MEM_ALLOC_ENABLE="0") == "active 0"
    # once torch is loaded its runtime has read the variables: setting them then would only mislead
    assert environment_seen_by("import torch\n" + CLI_START, **unset) == "None None"
