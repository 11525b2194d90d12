"""The point of shardfs: unmodified torchvision ImageFolder code on a mount of tar shards."""

import hashlib
import os

import pytest

from conftest import needs_fuse

torch = pytest.importorskip("torch")
datasets = pytest.importorskip("torchvision.datasets")
transforms = pytest.importorskip("torchvision.transforms")

pytestmark = needs_fuse


def _digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_imagefolder_on_mount_equals_imagefolder_on_source(sample_tree, tar_shards, mount):
    m = mount(tar_shards)
    ours = datasets.ImageFolder(os.path.join(m.path, "train"))
    theirs = datasets.ImageFolder(str(sample_tree / "train"))

    assert ours.classes == theirs.classes
    assert ours.class_to_idx == theirs.class_to_idx
    rel = lambda samples, root: [(os.path.relpath(p, root), t) for p, t in samples]  # noqa: E731
    assert rel(ours.samples, ours.root) == rel(theirs.samples, theirs.root)
    assert len(ours) == 72
    for (ours_path, _), (their_path, _) in zip(ours.samples, theirs.samples):
        assert _digest(ours_path) == _digest(their_path)
    image, label = ours[5]
    assert image.size == (64, 64) and label == theirs[5][1]


def test_dataloader_with_workers_runs_a_full_epoch(tar_shards, mount):
    m = mount(tar_shards)
    ds = datasets.ImageFolder(os.path.join(m.path, "train"), transform=transforms.ToTensor())
    loader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2)
    seen, labels = 0, set()
    for images, targets in loader:
        assert images.shape[1:] == (3, 64, 64)
        assert images.dtype == torch.float32
        seen += len(targets)
        labels.update(targets.tolist())
    assert seen == len(ds) == 72
    assert labels == set(range(6))
    stats = m.stats()
    assert stats["read_errors"] == 0
    assert stats["bytes_served"] >= sum(os.path.getsize(p) for p, _ in ds.samples)
