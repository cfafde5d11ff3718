"""The model zoo: registry contract, output shapes, trainability, checkpoint blocks, published sizes."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import hpcdl.models as models
from hpcdl.models.hep import ParticleTransformer

AGREED_NAMES = {
    "deeplabv3p-climate", "hep-cnn", "particle-transformer", "alexnet", "vgg16-bn", "resnet18", "resnet50",
    "resnet18-cifar", "resnet50-cifar", "vit", "gpt",
}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.one_thread


def expected_output_shape(family, scale, batch):
    shape = family.input_shape(scale)
    if family.task == "segmentation":
        return (batch, family.num_classes, *shape[-2:])
    if family.task == "language":
        return (batch, shape[0], family.num_classes)
    return (batch, family.num_classes)


def test_registry_lists_the_agreed_models_with_consistent_families():
    assert set(models.names()) == AGREED_NAMES
    for name in models.names():
        family = models.family(name)
        assert family.name == name
        assert family.task in ("segmentation", "classification", "language")
        assert family.scales[0] == "tiny" and family.scales[-1] == "full"
        assert family.input_dtype == (torch.int64 if family.task == "language" else torch.float32)
    assert models.family("deeplabv3p-climate").default_dataset == "climate-sample"
    assert models.family("hep-cnn").default_dataset == "hep-sample"
    assert models.family("deeplabv3p-climate").input_shape("full") == (16, 768, 1152)
    assert models.family("deeplabv3p-climate").num_classes == 3


def test_unknown_names_scales_and_arguments_say_what_is_valid():
    with pytest.raises(ValueError, match="unknown model 'resnet19'.*resnet18"):
        models.get("resnet19")
    with pytest.raises(ValueError, match="no scale 'huge'.*tiny, small, full"):
        models.get("resnet18", scale="huge")
    with pytest.raises(ValueError, match="no scale 'huge'"):
        models.family("gpt").input_shape("huge")
    with pytest.raises(TypeError, match="does not take colour.*in_channels"):
        models.get("deeplabv3p-climate", "tiny", colour=3)
    with pytest.raises(ValueError, match="positive int"):
        models.family("vit").example_batch("tiny", 0)


@pytest.mark.parametrize("name", sorted(AGREED_NAMES))
def test_smallest_scale_has_the_right_output_shape_and_learns(name):
    family = models.family(name)
    scale = family.scales[0]
    torch.manual_seed(0)
    model = models.get(name, scale)
    x, y = family.example_batch(scale, 2, torch.Generator().manual_seed(1))
    assert x.shape == (2, *family.input_shape(scale)) and x.dtype == family.input_dtype
    assert y.dtype == torch.int64
    output = model(x)
    assert output.shape == expected_output_shape(family, scale, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        loss = family.loss(model(x), y)
        assert torch.isfinite(loss)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    final = family.loss(model(x), y).item()
    assert final < 0.97 * losses[0], f"{name}: loss went {losses} -> {final}"


def test_in_channels_override_builds_a_climate_model_for_other_data():
    model = models.get("deeplabv3p-climate", "tiny", in_channels=4)
    assert model(torch.randn(1, 4, 32, 48)).shape == (1, 3, 32, 48)


def test_example_batch_is_reproducible_and_in_range():
    family = models.family("deeplabv3p-climate")
    a = family.example_batch("tiny", 3, torch.Generator().manual_seed(5))
    b = family.example_batch("tiny", 3, torch.Generator().manual_seed(5))
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert a[1].shape == (3, *family.input_shape("tiny")[-2:]) and 0 <= a[1].min() and a[1].max() < 3
    tokens, targets = models.family("gpt").example_batch("tiny", 2, torch.Generator().manual_seed(0))
    assert torch.equal(tokens[:, 1:], targets[:, :-1]), "language targets are the inputs shifted by one"


FULL_PARAMETERS = {  # the published / torchvision counts
    "alexnet": 61_100_840,
    "vgg16-bn": 138_365_992,
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "resnet18-cifar": 11_173_962,
    "vit": 86_567_656,
    "gpt": 124_439_808,
}


@pytest.mark.parametrize("name", sorted(AGREED_NAMES))
def test_full_scale_builds_and_runs_on_the_meta_device(name):
    family = models.family(name)
    with torch.device("meta"):
        model = models.get(name, "full")
        x, _ = family.example_batch("full", 1)
        output = model(x.to("meta"))
    assert output.shape == expected_output_shape(family, "full", 1)
    if name in FULL_PARAMETERS:
        assert sum(p.numel() for p in model.parameters()) == FULL_PARAMETERS[name]


def test_full_deeplab_is_deepcam_sized():
    with torch.device("meta"):
        model = models.get("deeplabv3p-climate", "full")
        output = model(torch.empty(2, 16, 768, 1152))
    assert output.shape == (2, 3, 768, 1152)
    backbone = model.backbone
    assert [len(stage) for stage in (backbone.layer1, backbone.layer2, backbone.layer3, backbone.layer4)] == [3, 4, 6, 3]
    assert backbone.layer4[-1].conv2.dilation == (2, 2), "output stride 16: the last stage is atrous"


def _alive_when(model: nn.Module, producer: nn.Module, later: nn.Module) -> bool:
    """Whether ``producer``'s input is still referenced (outside autograd: no_grad) when ``later`` starts
    (necessarily so if ``producer`` has not run yet)."""
    seen, alive = [], []
    producer.register_forward_pre_hook(lambda module, args: seen.append(weakref.ref(args[0])))
    later.register_forward_pre_hook(lambda module, args: alive.append(not seen or seen[-1]() is not None))
    with torch.no_grad():
        model(torch.randn(2, *models.family("deeplabv3p-climate").input_shape("tiny")))
    return alive[0]


def test_deeplab_drops_its_widest_tensors_once_consumed():
    """Under a compressing session autograd's copy of a saved tensor is packed, so a Python reference to the
    original (a skip connection in a local, a Sequential's argument) is what keeps it in memory: the
    stage-1 features at full width must be gone once reduced, and the decoder's concatenation once its
    first convolution ran (measured at DeepCAM's full input: the forward was the step's peak at batch 4)."""
    model = models.get("deeplabv3p-climate", "tiny")
    assert not _alive_when(model, model.decoder.reduce[0], model.backbone.layer3[0])
    model = models.get("deeplabv3p-climate", "tiny")
    assert not _alive_when(model, model.decoder.fuse[0][0], model.decoder.fuse[0][1])


@pytest.mark.parametrize("name", ["deeplabv3p-climate", "particle-transformer", "gpt", "resnet18-cifar"])
def test_checkpointing_each_block_gives_the_same_gradients(name):
    family = models.family(name)
    torch.manual_seed(0)
    model = models.get(name, "tiny").eval()  # eval: BatchNorm must not update twice under recomputation
    blocks = family.blocks(model)
    owned = {id(m) for m in model.modules()}
    assert blocks and all(id(b) in owned for b in blocks)
    parameters = [{id(p) for p in b.parameters()} for b in blocks]
    assert sum(map(len, parameters)) == len(set().union(*parameters)), "blocks overlap"
    calls = []
    hooks = [b.register_forward_hook(lambda m, i, o, k=k: calls.append(k)) for k, b in enumerate(blocks)]
    x, y = family.example_batch("tiny", 2, torch.Generator().manual_seed(0))
    family.loss(model(x), y).backward()
    for hook in hooks:
        hook.remove()
    assert calls == list(range(len(blocks))), "each block runs once, in order"
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for block in blocks:
        forward = block.forward
        block.forward = lambda *args, _f=forward, **kw: checkpoint(_f, *args, use_reentrant=False, **kw)
    family.loss(model(x), y).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, reference[n], msg=f"{name}: gradient of {n} changed under checkpointing")


def test_blocks_rejects_a_model_of_another_kind():
    with pytest.raises(TypeError, match="describes ResNet"):
        models.family("resnet18").blocks(nn.Linear(2, 2))


def test_particle_transformer_ignores_padding_and_particle_order():
    torch.manual_seed(0)
    model = models.get("particle-transformer", "tiny").eval()
    particles = torch.randn(3, 10, 5)
    padded = torch.cat([particles, torch.zeros(3, 7, 5)], dim=1)
    shuffled = particles[:, torch.randperm(10)]
    with torch.no_grad():
        reference = model(particles)
        torch.testing.assert_close(model(padded), reference)
        torch.testing.assert_close(model(shuffled), reference)
        empty = model(torch.zeros(2, 5, 5))
    assert torch.isfinite(empty).all(), "a jet without particles still gives finite logits"
    mask = ParticleTransformer.particle_mask(padded)
    assert mask[:, :10].all() and not mask[:, 10:].any()
    with pytest.raises(ValueError, match="particles, features"):
        model(torch.randn(2, 5))


def test_gpt_is_causal_and_checks_its_context():
    torch.manual_seed(0)
    model = models.get("gpt", "tiny").eval()
    tokens = torch.randint(100, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 100
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[:, :8], model(changed)[:, :8])
    with pytest.raises(ValueError, match="exceeds the model's context of 32"):
        model(torch.randint(100, (1, 33)))


def test_bad_architecture_arguments_are_explained():
    with pytest.raises(ValueError, match="output_stride 4 is not reachable"):
        models.get("deeplabv3p-climate", "tiny", output_stride=4)
    with pytest.raises(ValueError, match="not divisible by 3 heads"):
        models.get("vit", "tiny", heads=3)
    with pytest.raises(ValueError, match="too small for 3 pooling stages"):
        models.get("hep-cnn", "tiny", image_size=4)
    with pytest.raises(ValueError, match="built for 32x32"):
        models.get("vit", "tiny")(torch.randn(1, 3, 64, 64))


@pytest.mark.parametrize(
    ("model", "dataset", "features", "shape_name"),
    [
        ("deeplabv3p-climate", "climate-sample", None, "CLIMATE_SAMPLE_SHAPE"),
        ("hep-cnn", "hep-sample", "images", "JET_IMAGE_SAMPLE_SHAPE"),
        ("particle-transformer", "hep-sample", "constituents", "JET_CONSTITUENTS_SAMPLE_SHAPE"),
    ],
)
def test_catalog_sample_shapes_match_the_committed_samples(model, dataset, features, shape_name):
    """The catalog states the samples' shapes instead of importing hpcdl.data (models sit beside data)."""
    from hpcdl.data import load_dataset
    from hpcdl.models import catalog

    kwargs = {} if features is None else {"features": features}
    info = load_dataset(dataset, **kwargs).info
    stated = getattr(catalog, shape_name)
    assert tuple(int(n) for n in info["input_shape"]) == stated
    assert models.family(model).default_dataset == dataset
    assert models.family(model).input_shape("tiny") == stated


def test_old_names_of_the_model_registry_still_work():
    """``ModelSpec`` and ``spec(name)`` are the old names of ``ModelFamily`` and ``family(name)`` (one release)."""
    from hpcdl.models import registry

    assert models.ModelSpec is models.ModelFamily is registry.ModelSpec
    assert models.spec("hep-cnn") is models.family("hep-cnn") and isinstance(models.spec("vit"), models.ModelFamily)
    with pytest.raises(models.ModelError, match="unknown model 'nope'"):
        models.spec("nope")
