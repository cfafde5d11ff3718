"""The jet-image CNN separates W jets from QCD jets on the committed Pythia sample (validation AUC > 0.8)."""

from __future__ import annotations

import pytest
import torch

import hpcdl.models as models
from hpcdl.metrics import roc_auc


def load_hep_images(split):
    try:
        from hpcdl.data import load_dataset
    except ImportError as err:
        pytest.skip(f"hpcdl.data.load_dataset is not available yet ({err})")
    try:
        return load_dataset("hep-sample", split=split, features="images")
    except FileNotFoundError as err:
        pytest.skip(f"the committed HEP sample is not there yet (datasets/samples/hep, made with Pythia 8): {err}")


def read_all(dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (x, y) of ``dataset`` through the project's loader, once: the sample is a few MB."""
    from hpcdl.data import ShardedLoader

    batches = list(ShardedLoader(dataset, 512, shuffle=False, drop_last=False, prefetch=2))
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])




def test_jet_image_cnn_reaches_auc_above_0_8(one_thread):
    train, val = load_hep_images("train"), load_hep_images("val")
    spec = models.family("hep-cnn")
    assert tuple(train.info["input_shape"]) == spec.input_shape("tiny"), "the tiny scale is sized after the sample"
    x_train, y_train = read_all(train)
    x_val, y_val = read_all(val)
    assert len(y_val) == len(val) and set(y_val.tolist()) == {0, 1}

    torch.manual_seed(0)
    model = models.get("hep-cnn", "tiny")
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(3):
        for batch in torch.randperm(len(y_train)).split(64):
            loss = spec.loss(model(x_train[batch]), y_train[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        scores = model(x_val).softmax(dim=1)[:, 1]
    auc = roc_auc(scores, y_val)
    assert auc > 0.8, f"validation AUC {auc:.3f} on {len(y_val)} jets"
