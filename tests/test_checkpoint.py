"""Checkpoint files: atomic, pruned to the last K, and loud about corruption and foreign runs."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from hpcdl.train.checkpoint import (
    CheckpointError,
    check_compatible,
    checksum_path,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def test_round_trip_and_keep_last_k(tmp_path):
    for step in (5, 10, 15):
        save_checkpoint(tmp_path, step, {"model": {"w": torch.full((3,), float(step))}}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-00000010.pt", "ckpt-00000015.pt"]
    assert sorted(p.name for p in tmp_path.glob("*.sha256")) == ["ckpt-00000010.pt.sha256", "ckpt-00000015.pt.sha256"]
    state = load_checkpoint(latest_checkpoint(tmp_path))
    assert state["step"] == 15 and torch.equal(state["model"]["w"], torch.full((3,), 15.0))
    assert not list(tmp_path.glob("*.tmp"))


def test_corrupted_and_truncated_files_are_clear_errors(tmp_path):
    path = save_checkpoint(tmp_path, 1, {"model": {"w": torch.zeros(100)}}, keep=2)
    blob = bytearray(path.read_bytes())
    blob[-50] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        load_checkpoint(path)
    path.write_bytes(bytes(blob[:40]))
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        load_checkpoint(path)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        load_checkpoint(path)
    checksum_path(path).write_text("not a checksum\n")
    with pytest.raises(CheckpointError, match="is not a sha256 line"):
        load_checkpoint(path)
    checksum_path(path).unlink()
    with pytest.raises(CheckpointError, match="has no checksum file ckpt-00000001.pt.sha256"):
        load_checkpoint(path)


def test_a_checkpoint_is_a_plain_torch_file_with_a_sha256sum_sidecar(tmp_path):
    import hashlib
    import shutil
    import subprocess

    path = save_checkpoint(tmp_path, 7, {"model": {"w": torch.arange(4.0)}}, keep=1)
    state = torch.load(path, weights_only=True)  # what any PyTorch user does
    assert state["step"] == 7 and torch.equal(state["model"]["w"], torch.arange(4.0))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert checksum_path(path).read_text() == f"{digest}  ckpt-00000007.pt\n"
    if shutil.which("sha256sum"):
        check = subprocess.run(["sha256sum", "-c", checksum_path(path).name], cwd=tmp_path, capture_output=True)
        assert check.returncode == 0, check.stdout


def test_checkpoints_of_the_one_file_format_still_load(tmp_path):
    import hashlib
    import io

    from hpcdl.train.checkpoint import LEGACY_MAGIC

    buffer = io.BytesIO()
    torch.save({"step": 3, "model": {"w": torch.ones(2)}}, buffer)
    payload = buffer.getvalue()
    path = tmp_path / "ckpt-00000003.pt"
    path.write_bytes(LEGACY_MAGIC + hashlib.sha256(payload).digest() + payload)
    assert load_checkpoint(path)["step"] == 3
    path.write_bytes(LEGACY_MAGIC + hashlib.sha256(payload).digest() + payload[:-5])
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        load_checkpoint(path)


def test_incompatible_run_is_refused(tmp_path):
    state = {"identity": {"model": "hep-cnn", "global_batch": 64}}
    check_compatible(state, {"model": "hep-cnn", "global_batch": 64}, "x")
    with pytest.raises(CheckpointError, match="global_batch: checkpoint has 64, this run has 128"):
        check_compatible(state, {"model": "hep-cnn", "global_batch": 128}, "x")


def test_rng_states_survive_a_checkpoint(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    path = save_checkpoint(tmp_path, 1, {"rng": rng_state()}, keep=1)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(load_checkpoint(path)["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1]) and random.random() == expected[2]


def test_a_bad_latest_checkpoint_falls_back_to_the_previous_good_one(tmp_path):
    from hpcdl.train.checkpoint import CheckpointWarning, load_latest_good

    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, {"model": {"w": torch.full((50,), float(step))}}, keep=3)
    newest = list_checkpoints(tmp_path)[-1]
    newest.write_bytes(newest.read_bytes()[:-20])  # truncated
    middle = list_checkpoints(tmp_path)[1]
    blob = bytearray(middle.read_bytes())
    blob[-30] ^= 0x01  # one flipped bit
    middle.write_bytes(bytes(blob))
    with pytest.warns(CheckpointWarning) as caught:
        path, state = load_latest_good(tmp_path)
    assert path.name == "ckpt-00000001.pt" and state["step"] == 1
    assert [str(w.message).count(name) for w, name in zip(caught, ("ckpt-00000003", "ckpt-00000002"))] == [1, 1]
    assert newest.exists() and middle.exists()  # left for inspection; the next saves replace them
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match="no checkpoint in .* loads"):
        load_latest_good(tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        load_latest_good(tmp_path / "empty")


def test_leftover_temporary_files_of_a_killed_write_are_removed(tmp_path):
    from hpcdl.train.checkpoint import remove_stale_temporaries

    (tmp_path / ".ckpt-00000004.pt.4242.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / ".ckpt-00000004.pt.sha256.4242.tmp").write_bytes(b"half a checksum")
    (tmp_path / "notes.tmp").write_text("not ours")
    save_checkpoint(tmp_path, 5, {"model": {}}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000005.pt", "ckpt-00000005.pt.sha256", "notes.tmp"]
    (tmp_path / ".ckpt-00000006.pt.77.tmp").write_bytes(b"")
    assert [p.name for p in remove_stale_temporaries(tmp_path)] == [".ckpt-00000006.pt.77.tmp"]
    assert remove_stale_temporaries(tmp_path / "missing") == []
