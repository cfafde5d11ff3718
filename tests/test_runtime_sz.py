"""The session with the error-bounded ``sz`` codec: bounds held inside the hooks, exact masks, training still converges."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hpcdl.runtime import Policy, compressed

from runtime_models import ResidualCNN, TransformerBlock

SZ = {"id": "sz", "mode": "rel", "bound": 1e-2}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.one_thread


@pytest.mark.parametrize("config", [SZ, {"id": "sz", "mode": "abs", "bound": 1e-3}, {"id": "sz", "mode": "pw_rel", "bound": 1e-2}])
def test_every_decompressed_tensor_is_within_the_bound(config):
    torch.manual_seed(0)
    model = ResidualCNN()
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 5, (8,))
    with compressed(model, Policy.static(config), threshold=0, verify=True) as session:
        loss = F.cross_entropy(model(x), y)
    loss.backward()  # VerificationError if any decoded span broke the bound (check_bound, inside the unpack hook)
    assert session.stats.verified >= 8
    assert session.stats.row("conv1", "activation").packed < session.stats.row("conv1", "activation").original or \
        session.stats.row("stem.2", "activation").packed < session.stats.row("stem.2", "activation").original
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_bf16_autocast_with_sz_holds_the_bound():
    torch.manual_seed(0)
    model = TransformerBlock()
    tokens = torch.randint(0, 50, (4, 17))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with compressed(model, Policy.static(SZ), threshold=0, verify=True) as session:
            loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    assert session.stats.verified > 0 and session.stats.fallbacks == 0


def test_relu_maxpool_dropout_masks_are_exactly_those_of_uncompressed_training():
    model = nn.Sequential(nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.5))
    x = torch.randn(4, 8, 32, 32, requires_grad=True)

    def input_grad(policy):
        torch.manual_seed(3)
        x.grad = None
        if policy is None:
            model(x).sum().backward()
        else:
            with compressed(model, policy, threshold=0):
                out = model(x)
            out.sum().backward()
        return x.grad.clone()

    expected, got = input_grad(None), input_grad(Policy.static(SZ))
    assert torch.equal(expected != 0, got != 0)
    assert torch.allclose(expected, got, rtol=0.03)


def test_inf_and_nan_survive_so_a_grad_scaler_still_sees_them():
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Softplus())
    x = torch.randn(128, 64)
    x[0, :4] = torch.tensor([float("inf"), float("-inf"), float("nan"), 3e38])

    def grads(policy):
        model.zero_grad(set_to_none=True)
        with compressed(model, policy, threshold=0):
            out = model(x * 10)
        out.sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    expected, got = grads(None), grads(Policy.static(SZ))
    for e, g in zip(expected, got):
        assert torch.equal(torch.isfinite(e), torch.isfinite(g)) and torch.equal(torch.isnan(e), torch.isnan(g))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_grad_scaler_on_cuda_skips_overflowing_steps():
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**16)
    policy = Policy.static(SZ)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(512, 64, device="cuda") * 1e3  # fp16 activations overflow to Inf
    with torch.autocast("cuda", dtype=torch.float16):
        with compressed(model, policy, threshold=0, verify=True):
            loss = model(x).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    assert scaler.get_scale() < 2.0**16  # the step saw Inf/NaN gradients and was skipped
    assert all(torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))


def _blob_batch(generator, size=32):
    """1x12x12 images with one bright 3x3 blob; the label says whether it is in the left or the right half."""
    x = torch.randn(size, 1, 12, 12, generator=generator) * 0.8
    y = torch.randint(0, 2, (size,), generator=generator)
    rows = torch.randint(0, 10, (size,), generator=generator)
    cols = torch.randint(0, 4, (size,), generator=generator) + 6 * y
    for i in range(size):
        x[i, 0, rows[i] : rows[i] + 3, cols[i] : cols[i] + 3] += 1.0
    return x, y


def _train(policy, steps=250):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d((1, 2)), nn.Flatten(),
        nn.Linear(32, 2),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    losses, ratios = [], []
    for _ in range(steps):
        x, y = _blob_batch(generator)
        if policy is None:
            loss = F.cross_entropy(model(x), y)
        else:
            # The default threshold keeps the (32, 2) log-probabilities of the loss as they are: an error of
            # 1e-2 x their range (hundreds once the model is confident) would turn p = 1 into p = 0.05.
            with compressed(model, policy) as session:
                loss = F.cross_entropy(model(x), y)
            ratios.append(session.stats.ratio)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    x, y = _blob_batch(torch.Generator().manual_seed(99), size=256)
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    return sum(losses[-25:]) / 25, accuracy, ratios


@pytest.mark.slow
def test_a_few_hundred_steps_with_sz_converge_like_uncompressed_training():
    base_loss, base_accuracy, _ = _train(None)
    sz_loss, sz_accuracy, ratios = _train(Policy.static(SZ))
    assert base_accuracy > 0.9, "the task must be learnable for the comparison to mean anything"
    assert abs(sz_loss - base_loss) < 0.05 and sz_accuracy >= base_accuracy - 0.03
    assert min(ratios) > 2.0  # it really compressed
