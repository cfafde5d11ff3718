"""A codec added as one module plus an entry point: found by the registry, used by `hpcdl train`, the batch search
and a training job submitted with `hpcdl slurm submit`.

The codec (``negate``, tests/plugins/hpcdl_testcodec) is registered by nothing but the ``hpcdl.codecs``
entry point of its distribution's metadata; nothing in hpcdl or these tests imports it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from codec_plugin import install_testcodec

from hpcdl.compress import CodecError, UnknownCodecError, get_codec, registry
from hpcdl.train import load_config
from hpcdl.train.method_spec import parse_method

from conftest import require
from slurm_helpers import slurm_cluster_up, submit_cli_and_wait

ROOT = Path(__file__).resolve().parents[1]
TINY = ["data.dataset=synthetic", "data.synthetic_samples=32", "model.scale=tiny", "train.batch=8",
        "train.steps_per_epoch=2", "train.epochs=1", "train.val_steps=1", "logging.progress=false",
        "compression.method=codec", "compression.codec={id: negate}"]


def _forget_plugin() -> None:
    registry._entry_points.cache_clear()
    registry._REGISTRY.pop("negate", None)
    sys.modules.pop("hpcdl_testcodec", None)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The test codec's distribution on sys.path (and the entries for a child's PYTHONPATH)."""
    entries = install_testcodec(tmp_path / "site")
    _forget_plugin()
    for entry in reversed(entries):
        monkeypatch.syspath_prepend(entry)
    yield entries
    _forget_plugin()


def test_an_unknown_id_names_itself_and_the_known_ids():
    _forget_plugin()
    with pytest.raises(UnknownCodecError, match=r"unknown codec id 'negate'; known ids: .*\bsz\b") as caught:
        get_codec({"id": "negate"})
    assert caught.value.codec_id == "negate" and "raw" in caught.value.known_ids and "negate" not in caught.value.known_ids


def test_a_codec_installed_only_by_its_entry_point_is_found_and_round_trips(plugin):
    assert "hpcdl_testcodec" not in sys.modules
    assert "negate" in registry.known_codec_ids()
    assert "hpcdl_testcodec" not in sys.modules  # listed from the metadata, imported only when used
    codec = get_codec({"id": "negate"})
    assert type(codec).__module__ == "hpcdl_testcodec" and codec.get_config() == {"id": "negate"}
    x = torch.tensor([1.5, -0.0, float("inf"), float("nan"), -3.25])
    packed = codec.encode(x)
    assert torch.equal(packed.data.view(torch.float32)[:2], torch.tensor([-1.5, 0.0]))  # stored negated
    assert torch.equal(codec.decode(packed).view(torch.int32), x.view(torch.int32))  # every bit back
    packed.data[0] ^= 1
    with pytest.raises(CodecError, match="checksum"):
        codec.decode(packed)


def test_the_config_checks_the_plugin_codec_and_names_the_key(plugin):
    config = load_config("hep-particles", TINY)
    assert config["compression"]["codec"] == {"id": "negate"}
    method = parse_method("negate")  # the study's method spec of a third-party codec
    assert load_config("hep-particles", method.overrides())["compression"]["codec"] == {"id": "negate"}
    with pytest.raises(ValueError, match=r"config key 'compression.codec' = \{'id': 'negate', 'bound': 0.1\}"):
        load_config("hep-particles", [*TINY, "compression.codec.bound=0.1"])


def test_hpcdl_train_uses_a_codec_known_only_by_its_entry_point(plugin, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *plugin]), "OMP_NUM_THREADS": "1"}
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "hpcdl", "train", "hep-particles", "--run-dir", str(run_dir)]
    for override in TINY:
        args += ["--set", override]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["method"] == "codec:negate" and summary["steps"] == 2
    assert summary["config"]["compression"]["codec"] == {"id": "negate"}
    # negate is lossless and keeps every byte: what it packed is what autograd saved (plus headers).
    assert summary["activation_packed_bytes"] >= summary["activation_original_bytes"] > 0


def test_the_batch_search_measures_the_plugin_codec_in_a_fresh_process(plugin):
    from hpcdl import memory
    from hpcdl.train.activation import activation_method

    config = load_config("hep-particles", TINY)
    # Each probe runs in a measuring subprocess, which knows the codec only through the entry point.
    search = memory.search_batch(("particle-transformer", "tiny", {}), None, 1 << 40, limit=2,
                                 method=activation_method(config["compression"]))
    assert search.policy == "codec:negate" and search.batch_size == 2 and search.hit_limit
    assert all(report.peak_bytes > 0 for _, report in search.probes)


@pytest.mark.slurm
@pytest.mark.mpi
def test_a_slurm_job_trains_with_a_codec_known_only_by_its_entry_point(plugin, tmp_path, monkeypatch):
    """The plugin is on the submitting environment's path, as an installed distribution would be: `hpcdl slurm
    submit` checks the config (and its codec) before sbatch, and the job, which inherits that environment
    (sbatch --export=ALL, the default), finds the codec through the entry point alone."""
    require(slurm_cluster_up(), "a running Slurm cluster (bash tools/slurm_cluster.sh start)")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), *plugin]))
    run_dir = tmp_path / "run"
    args = [item for override in TINY for item in ("--set", override)]
    job = submit_cli_and_wait(["--tasks-per-node", "1", *args, "hep-particles", "--", "--run-dir", str(run_dir)],
                              workdir=tmp_path, timeout=300)
    assert job.succeeded, job.log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["method"] == "codec:negate" and summary["steps"] == 2 and summary["world_size"] == 1
    assert summary["activation_packed_bytes"] >= summary["activation_original_bytes"] > 0
