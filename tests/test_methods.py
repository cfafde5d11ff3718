"""Activation methods as objects (hpcdl.runtime.methods) and the one train_step the trainer and hpcdl.memory share."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from hpcdl import memory
from hpcdl.runtime import methods
from hpcdl.runtime.methods import Checkpoint, Codec, Offload, Plain, Recompute, compose, train_step
from hpcdl.train import load_config, run_training
from hpcdl.train.activation import activation_method, method_name
from hpcdl.train.config import ConfigError, canonical_method
from hpcdl.train.optim import LAMB, optimizer_factory

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.one_thread


class Blocks(nn.Module):
    """Three MLP blocks; ``checkpoint_blocks`` names them, as the zoo models do."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()) for _ in range(3))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def checkpoint_blocks(self):
        return list(self.blocks)


def blocks_model() -> nn.Module:
    return Blocks()


def blocks_batch(batch_size: int, generator: torch.Generator):
    return torch.randn(batch_size, 32, generator=generator), torch.randint(0, 4, (batch_size,), generator=generator)


def _gradients(method) -> dict[str, torch.Tensor]:
    """Gradients of one train_step of a fixed model and batch under ``method`` (lr 0: the weights stay)."""
    torch.manual_seed(0)
    model = Blocks()
    x, y = blocks_batch(8, torch.Generator().manual_seed(1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    method.prepare(model)
    train_step(model, method, x, y, nn.functional.cross_entropy, optimizer)
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def _plain_pytorch_gradients() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = Blocks()
    x, y = blocks_batch(8, torch.Generator().manual_seed(1))
    nn.functional.cross_entropy(model(x), y).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("method", [
    Plain(),
    Codec("raw", threshold=0),
    Recompute(),
    Recompute(lambda model: model.checkpoint_blocks()[:2]),
    Recompute() + Codec("raw", threshold=0),
    compose(Codec({"id": "raw"}, threshold=0), Recompute()),
], ids=["none", "codec-raw", "recompute", "recompute-two-blocks", "recompute+codec-raw", "compose-codec-first"])
def test_lossless_methods_give_bit_identical_gradients(method):
    expected = _plain_pytorch_gradients()
    got = _gradients(method)
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_recompute_wraps_blocks_only_inside_its_context():
    model = Blocks()
    with Recompute().context(model):
        assert all("forward" in vars(block) for block in model.blocks)
    assert not any("forward" in vars(block) for block in model.blocks)  # the model is left as it was
    with pytest.raises(ValueError, match="no checkpoint_blocks"):
        Recompute().prepare(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no blocks"):
        Recompute([]).prepare(model)


def test_recompute_plus_codec_compresses_what_the_recomputing_model_still_saves():
    model = Blocks()
    x, y = blocks_batch(64, torch.Generator().manual_seed(1))

    def saved(method):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        return train_step(model, method, x, y, nn.functional.cross_entropy, optimizer).stats

    everything = saved(Codec("sz:rel=1e-2", threshold=0))
    recomputed = saved(Recompute() + Codec("sz:rel=1e-2", threshold=0))
    assert 0 < recomputed.original_bytes < everything.original_bytes  # only block inputs and the head remain
    assert recomputed.ratio > 1  # and those are compressed
    assert saved(Recompute()) is None and saved(Plain()) is None


def test_combinations_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match="only the innermost hooks"):
        Codec("raw") + Offload()
    with pytest.raises(ValueError, match="recompute is given twice"):
        Recompute() + Recompute()
    with pytest.raises(TypeError, match="combine with other activation methods"):
        Recompute() + "codec"
    with pytest.raises(ValueError, match="use Plain"):
        Codec("none")
    assert compose(Plain(), Plain()) == Plain() and (Plain() + Recompute()).name == "recompute"
    assert (Recompute() + Codec("sz:rel=1e-2")).describe() == "recompute+codec:sz:rel=0.01"


def test_offload_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine can offload")
    with pytest.raises(ValueError, match="offload .* needs CUDA"):
        Offload().prepare(Blocks())


def test_config_names_every_method_and_refuses_others():
    base = ["model.name=hep-cnn"]
    for value, name in [("none", "none"), ("recompute", "recompute"), ("offload", "offload"),
                        ("recompute+codec", "recompute+codec:sz:rel=0.01"), ("recompute+offload", "recompute+offload")]:
        config = load_config({"model": {"name": "hep-cnn"}},
                             [*base, f"compression.method={value}", "compression.codec={id: sz, mode: rel, bound: 1.0e-2}"])
        assert method_name(config["compression"]) == name
        assert activation_method(config["compression"]).name == value
    with pytest.raises(ConfigError, match=r"compression.method.*recompute\+codec"):
        load_config({"model": {"name": "hep-cnn"}}, [*base, "compression.method=codec+recompute"])


def test_checkpoint_is_the_old_name_of_recompute_and_means_the_same_method(tmp_path):
    """``checkpoint`` (the method's name before ``recompute``) is read as ``recompute`` wherever a method is named:
    the class alias and a config value (in a file or --set, alone or combined)."""
    assert Checkpoint is Recompute and Checkpoint().name == "recompute"
    base = ["model.name=hep-cnn", "compression.codec={id: raw}"]
    for old, new in [("checkpoint", "recompute"), ("checkpoint+codec", "recompute+codec"),
                     ("checkpoint+offload", "recompute+offload")]:
        read = load_config({"model": {"name": "hep-cnn"}, "compression": {"method": old}}, base)
        assert read == load_config({"model": {"name": "hep-cnn"}}, [*base, f"compression.method={new}"])
        assert read["compression"]["method"] == canonical_method(old) == new
        assert activation_method(read["compression"]).name == new
    assert canonical_method("codec") == "codec" and canonical_method("checkpoints") == "checkpoints"
    path = tmp_path / "old.yaml"
    path.write_text("model: {name: hep-cnn}\ncompression: {method: checkpoint+codec, codec: {id: raw}}\n")
    assert method_name(load_config(path)["compression"]) == "recompute+codec:raw"


def test_the_trainer_and_the_measured_step_run_the_same_train_step(tmp_path, monkeypatch):
    calls = []
    real = methods.train_step

    def spy(model, method, x, y, loss_fn, optimizer, **kw):
        calls.append((method, optimizer))
        return real(model, method, x, y, loss_fn, optimizer, **kw)

    monkeypatch.setattr(methods, "train_step", spy)
    overrides = ["data.dataset=synthetic", "data.synthetic_samples=32", "model.scale=tiny", "train.batch=8",
                 "train.steps_per_epoch=2", "train.epochs=1", "logging.progress=false", "optimizer.name=lamb",
                 "compression.method=recompute+codec", "compression.codec={id: raw}"]
    result = run_training(load_config("hep-particles", overrides=overrides), run_dir=tmp_path / "run")
    assert result.steps == 2 and len(calls) == 2 and result.method == "recompute+codec:raw"
    assert calls[0][0].name == "recompute+codec" and isinstance(calls[0][1], LAMB)

    # The measured step (as the batch search builds it) in this process: the same function, the run's optimizer.
    config = result.config
    step = memory.TrainStep(memory.Workload("particle-transformer", "tiny"), 4,
                            method=activation_method(config["compression"]),
                            optimizer=optimizer_factory(config["optimizer"], 8))
    info = step()()
    assert len(calls) == 3 and isinstance(calls[2][1], LAMB) and calls[2][0].name == "recompute+codec"
    assert info["method"] == "recompute+codec:raw" and info["activation_original_bytes"] > 0


def test_the_measuring_process_runs_train_step_with_the_given_method_and_optimizer():
    config = load_config("hep-particles", ["optimizer.name=lamb", "compression.method=recompute+codec"])
    step = memory.TrainStep(memory.Workload(blocks_model, batch=blocks_batch), 16,
                            method=Recompute() + Codec("sz:rel=1e-2", threshold=0),
                            optimizer=optimizer_factory(config["optimizer"], 16))
    report = memory.peak(step)  # a fresh process: everything above was pickled and rebuilt there
    assert report.info["step_function"] == "hpcdl.runtime.methods.train_step"
    assert report.info["method"] == "recompute+codec:sz:rel=0.01" and report.activation_ratio > 1
    with pytest.raises(ValueError, match="either method= .* or policy="):
        memory.TrainStep(memory.Workload(blocks_model, batch=blocks_batch), 1, "raw", method=Recompute())


def test_the_batch_search_takes_any_method():
    work = memory.Workload(blocks_model, batch=blocks_batch)
    found = memory.search_batch(work, None, "64MiB", method=Recompute() + Codec("raw", threshold=0), limit=4,
                                optimizer=functools.partial(torch.optim.Adam, lr=1e-3))
    assert found.batch_size == 4 and found.hit_limit and found.policy == "recompute+codec:raw"
    assert all(report.info["step_function"] == "hpcdl.runtime.methods.train_step" for _, report in found.probes)
