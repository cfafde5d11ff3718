"""The built-in models and their scales.

``tiny`` is for tests and CPU studies (seconds per step), ``small`` for quick CPU
training runs, ``full`` the published configuration (a GPU-node workload). The climate
and HEP models' CPU scales take the shape of the committed data samples, so that
``get(name, scale)`` trains on ``hpcdl.data.load_dataset(family(name).default_dataset)``
without arguments; their ``full`` scales take the published input shapes.
"""

from __future__ import annotations

import torch

from hpcdl.models.climate import DeepLabV3Plus
from hpcdl.models.hep import JetImageCNN, ParticleTransformer
from hpcdl.models.registry import ModelFamily, Scale, register
from hpcdl.models.text import GPT
from hpcdl.models.vision import VGG16BN, AlexNet, ResNet, VisionTransformer

# Per-sample input shapes of the committed data samples (hpcdl_datasets/samples), as hpcdl.data.load_dataset
# gives them, so that the CPU scales train on those samples without arguments. Stated here rather than read
# from the samples: models sit beside data in the layers and do not import it; tests/test_models.py checks
# these against the committed samples.
CLIMATE_SAMPLE_SHAPE = (6, 96, 144)  # climate-sample: channels, height, width
JET_IMAGE_SAMPLE_SHAPE = (1, 32, 32)  # hep-sample, features="images"
JET_CONSTITUENTS_SAMPLE_SHAPE = (64, 5)  # hep-sample, features="constituents": delta_eta, delta_phi, log pT, log E, mask
DEEPCAM_INPUT = (16, 768, 1152)


def _climate_scales() -> dict[str, Scale]:
    channels, height, width = CLIMATE_SAMPLE_SHAPE
    return {
        "tiny": Scale(
            dict(in_channels=channels, block="basic", layers=(1, 1, 1, 1), width=8, output_stride=8,
                 aspp_channels=16, aspp_rates=(2, 4, 6), low_level_channels=8, decoder_channels=16),
            (channels, height, width),
        ),
        "small": Scale(
            dict(in_channels=channels, block="basic", layers=(2, 2, 2, 2), width=32, output_stride=8,
                 aspp_channels=64, aspp_rates=(2, 4, 6), low_level_channels=24, decoder_channels=64),
            (channels, height, width),
        ),
        # DeepCAM: ResNet-50 backbone at output stride 16, ASPP rates 6/12/18, 16 x 768 x 1152 input.
        "full": Scale(dict(in_channels=DEEPCAM_INPUT[0]), DEEPCAM_INPUT),
    }


def _jet_image_scales() -> dict[str, Scale]:
    channels, height, width = JET_IMAGE_SAMPLE_SHAPE
    sample = dict(in_channels=channels, image_size=(height, width))
    return {
        "tiny": Scale(dict(sample, channels=(8, 16, 32), hidden=32), (channels, height, width)),
        "small": Scale(dict(sample, channels=(32, 64, 128), hidden=128), (channels, height, width)),
        # HEP-CNN benchmark: 3-channel 224 x 224 calorimeter images, five 128-filter convolution stages.
        "full": Scale(dict(in_channels=3, image_size=224, channels=(128,) * 5, hidden=1024), (3, 224, 224)),
    }


def _particle_scales() -> dict[str, Scale]:
    particles, features = JET_CONSTITUENTS_SAMPLE_SHAPE
    return {
        "tiny": Scale(dict(num_features=features, dim=32, heads=4, depth=2, class_depth=1), (particles, features)),
        "small": Scale(dict(num_features=features, dim=64, heads=8, depth=4, class_depth=2), (particles, features)),
        # ParT: 128 particles, width 128, 8 heads, 8 particle blocks + 2 class-attention blocks.
        "full": Scale(dict(num_features=features, dim=128, heads=8, depth=8, class_depth=2), (128, features)),
    }


def particle_sets(shape: tuple[int, ...], batch_size: int, generator: torch.Generator | None) -> torch.Tensor:
    """Random particle sets: each jet has 1..particles standard-normal rows, the rest zero padding."""
    particles, features = shape
    x = torch.randn((batch_size, particles, features), generator=generator)
    counts = torch.randint(1, particles + 1, (batch_size, 1), generator=generator)
    return x * (torch.arange(particles) < counts).unsqueeze(-1)


def _fixed(table: dict[str, Scale]):
    return lambda: table


register(ModelFamily(
    name="deeplabv3p-climate", task="segmentation", num_classes=3, scales=("tiny", "small", "full"),
    model_class=DeepLabV3Plus, scale_table=_climate_scales, default_dataset="climate-sample",
    description="DeepCAM-style DeepLabv3+ (atrous ResNet, ASPP, decoder): background / cyclone / atmospheric river",
))
register(ModelFamily(
    name="hep-cnn", task="classification", num_classes=2, scales=("tiny", "small", "full"),
    model_class=JetImageCNN, scale_table=_jet_image_scales, default_dataset="hep-sample",
    description="jet-image CNN in the HEP-CNN benchmark style: W jets vs QCD",
))
register(ModelFamily(
    name="particle-transformer", task="classification", num_classes=2, scales=("tiny", "small", "full"),
    model_class=ParticleTransformer, scale_table=_particle_scales, default_dataset="hep-sample",
    description="ParT-style transformer on zero-padded jet constituents: W jets vs QCD",
    make_input=particle_sets,
))
register(ModelFamily(
    name="alexnet", task="classification", num_classes=1000, scales=("tiny", "small", "full"),
    model_class=AlexNet, description="AlexNet (torchvision layout)",
    scale_table=_fixed({
        "tiny": Scale(dict(width=16, hidden=256, pool_size=1), (3, 64, 64)),
        "small": Scale(dict(width=32, hidden=1024, pool_size=3), (3, 128, 128)),
        "full": Scale({}, (3, 224, 224)),
    }),
))
register(ModelFamily(
    name="vgg16-bn", task="classification", num_classes=1000, scales=("tiny", "small", "full"),
    model_class=VGG16BN, description="VGG-16 with BatchNorm",
    scale_table=_fixed({
        "tiny": Scale(dict(width=8, hidden=128, pool_size=1), (3, 32, 32)),
        "small": Scale(dict(width=32, hidden=1024, pool_size=2), (3, 64, 64)),
        "full": Scale({}, (3, 224, 224)),
    }),
))
for _depth, _block, _layers in ((18, "basic", (2, 2, 2, 2)), (50, "bottleneck", (3, 4, 6, 3))):
    register(ModelFamily(
        name=f"resnet{_depth}", task="classification", num_classes=1000, scales=("tiny", "small", "full"),
        model_class=ResNet, description=f"ResNet-{_depth}, ImageNet stem",
        scale_table=_fixed({
            "tiny": Scale(dict(block=_block, layers=_layers, width=8), (3, 64, 64)),
            "small": Scale(dict(block=_block, layers=_layers, width=32), (3, 128, 128)),
            "full": Scale(dict(block=_block, layers=_layers), (3, 224, 224)),
        }),
    ))
    register(ModelFamily(
        name=f"resnet{_depth}-cifar", task="classification", num_classes=10, scales=("tiny", "small", "full"),
        model_class=ResNet, description=f"ResNet-{_depth}, CIFAR stem (3x3, no pooling), 32x32 inputs",
        scale_table=_fixed({
            "tiny": Scale(dict(block=_block, layers=_layers, width=8, num_classes=10, stem="cifar"), (3, 32, 32)),
            "small": Scale(dict(block=_block, layers=_layers, width=32, num_classes=10, stem="cifar"), (3, 32, 32)),
            "full": Scale(dict(block=_block, layers=_layers, num_classes=10, stem="cifar"), (3, 32, 32)),
        }),
    ))
register(ModelFamily(
    name="vit", task="classification", num_classes=1000, scales=("tiny", "small", "full"),
    model_class=VisionTransformer, description="Vision Transformer; full = ViT-B/16",
    scale_table=_fixed({
        "tiny": Scale(dict(image_size=32, patch_size=4, dim=64, depth=2, heads=4), (3, 32, 32)),
        "small": Scale(dict(image_size=64, patch_size=8, dim=192, depth=6, heads=3), (3, 64, 64)),
        "full": Scale({}, (3, 224, 224)),
    }),
))
register(ModelFamily(
    name="gpt", task="language", num_classes=50257, scales=("tiny", "small", "full"),
    model_class=GPT, input_dtype=torch.int64, description="GPT-style decoder; full = GPT-2 small",
    scale_table=_fixed({
        "tiny": Scale(dict(context=32, dim=32, depth=2, heads=4), (32,)),
        "small": Scale(dict(context=256, dim=256, depth=4, heads=4), (256,)),
        "full": Scale({}, (1024,)),
    }),
))
