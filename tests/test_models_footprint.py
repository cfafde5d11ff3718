"""Activation bytes measured from autograd's saved tensors, and the ``hpcdl models`` command."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from hpcdl.cli import main
from hpcdl.models import names
from hpcdl.models.footprint import measure, saved_bytes

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.one_thread


def test_saved_bytes_counts_activations_not_parameters_and_shared_storage_once():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    counted = saved_bytes(model, torch.randn(5, 8), None, lambda out, _: out.sum())
    # Linear 1 saves its input (5x8); ReLU saves its output (5x16), which Linear 2 saves again.
    assert counted.unique == 5 * (8 + 16) * 4
    assert counted.total == 5 * (8 + 16 + 16) * 4
    assert model[0].weight.grad is not None, "the backward pass ran"


def test_views_of_parameters_are_not_counted():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return x @ self.weight.t()  # saves x and a view of the parameter

    counted = saved_bytes(Scaled(), torch.randn(3, 4), None, lambda out, _: out.sum())
    assert counted.unique == 3 * 4 * 4


@pytest.mark.parametrize("name", ["particle-transformer", "gpt", "resnet18-cifar"])
def test_fake_tensor_steps_measure_the_same_bytes_as_real_cpu_steps(name):
    fake, real = measure(name, "tiny", "fake"), measure(name, "tiny", "cpu")
    assert fake.activation_bytes_per_sample == real.activation_bytes_per_sample > 0
    assert fake.saved_bytes_per_sample == real.saved_bytes_per_sample >= real.activation_bytes_per_sample
    assert fake.parameters == real.parameters


def test_per_sample_bytes_scale_with_the_input():
    tiny = measure("deeplabv3p-climate", "tiny")
    full = measure("deeplabv3p-climate", "full")
    assert full.input_shape == (16, 768, 1152)
    # DeepCAM-sized samples hold gigabytes of activations: the reason to compress them.
    assert full.activation_bytes_per_sample > 1 << 30 > tiny.activation_bytes_per_sample


def test_measure_rejects_unusable_devices():
    with pytest.raises(ValueError, match="use 'fake'"):
        measure("hep-cnn", "tiny", "meta")
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        measure("hep-cnn", "tiny", "gpu0")


def test_cli_lists_every_model_at_the_smallest_scale(capsys):
    # Real CPU steps here: the fake-tensor default is compared against them above.
    assert main(["models", "--scale", "tiny", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for name in names():
        assert f"\n{name} " in out
    assert "activations" in out


def test_cli_json_rows_are_the_measurements(capsys):
    assert main(["models", "--scale", "tiny", "--model", "hep-cnn", "--json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = measure("hep-cnn", "tiny")
    assert row["parameters"] == expected.parameters
    assert row["activation_bytes_per_sample"] == expected.activation_bytes_per_sample
    assert tuple(row["input_shape"]) == expected.input_shape


def test_cli_errors_name_the_valid_choices(capsys):
    assert main(["models", "--model", "resnet19"]) == 2
    assert "known models: deeplabv3p-climate" in capsys.readouterr().err
    assert main(["models", "--scale", "medium"]) == 2
    assert "have scales full, small, tiny" in capsys.readouterr().err
