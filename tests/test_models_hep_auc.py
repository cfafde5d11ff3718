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


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def scores_and_labels(model, dataset, batch_size=256):
    from hpcdl.data import ShardedLoader

    loader = ShardedLoader(dataset, batch_size, shuffle=False, drop_last=False, prefetch=0)
    scores, labels = [], []
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            scores.append(model(x).softmax(dim=1)[:, 1])
            labels.append(y)
    model.train()
    return torch.cat(scores), torch.cat(labels)


def test_jet_image_cnn_reaches_auc_above_0_8(one_thread):
    from hpcdl.data import ShardedLoader

    train, val = load_hep_images("train"), load_hep_images("val")
    spec = models.spec("hep-cnn")
    assert tuple(train.info["input_shape"]) == spec.input_shape("tiny"), "the tiny scale is sized after the sample"
    torch.manual_seed(0)
    model = models.get("hep-cnn", "tiny")
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    loader = ShardedLoader(train, batch_size=64, seed=0, shuffle=True, drop_last=True, prefetch=0)
    for epoch in range(3):
        loader.set_epoch(epoch)
        for x, y in loader:
            loss = spec.loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    scores, labels = scores_and_labels(model, val)
    assert len(labels) == len(val) and set(labels.tolist()) == {0, 1}
    auc = roc_auc(scores, labels)
    assert auc > 0.8, f"validation AUC {auc:.3f} on {len(val)} jets"
