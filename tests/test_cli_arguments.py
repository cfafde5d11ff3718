"""Arguments several commands share are refused the same clear way (a usage error, exit status 2), before
anything runs."""

from __future__ import annotations

import pytest

from hpcdl import memory
from hpcdl.cli import main

THREADED_COMMANDS = [
    ["bench", "codecs"],
    ["bench", "gradients"],
    ["bench", "memory", "--model", "hep-cnn"],
    ["batch-size", "--model", "hep-cnn", "--budget", "1GiB"],
    ["study", "run", "--models", "hep-cnn", "--out", "unused"],
]


@pytest.mark.parametrize("command", THREADED_COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("threads", ["0", "-3", "two"])
def test_every_threads_option_takes_a_whole_number_of_at_least_one(command, threads, capsys):
    with pytest.raises(SystemExit) as stopped:
        main([*command, "--threads", threads])
    assert stopped.value.code == 2
    assert f"argument --threads: a whole number of threads >= 1, got '{threads}'" in capsys.readouterr().err


@pytest.mark.parametrize("threads", [0, -3, 1.5, True])
def test_a_measuring_process_refuses_a_thread_count_below_one_before_it_starts(threads):
    with pytest.raises(ValueError, match="whole number of torch threads >= 1"):
        memory.MeasuringProcess(threads)
