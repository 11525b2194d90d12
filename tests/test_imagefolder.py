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


def test_a_directory_mixing_tar_and_lz4_shards(sample_tree, tmp_path, mount):
    from benchlib import sample
    from shardfs.formats.lz4shard import Lz4ShardWriter

    out = tmp_path / "mixed"
    files = sample.files_under(str(sample_tree))
    sample.pack_tar_round_robin(str(sample_tree), str(out), shards=2)
    for tar in sorted(out.glob("*.tar"))[1:]:
        tar.unlink()  # keep one tar shard, put the rest into lz4 shards
    kept = set(f for i, f in enumerate(files) if i % 2 == 0)
    with Lz4ShardWriter(str(out / "train-000001.lz4shard"), block_size=64 * 1024) as w:
        for rel in files:
            if rel not in kept:
                w.add_file(rel, (sample_tree / rel).read_bytes(), mode=0o644, mtime=1.7e9)
    m = mount(out)
    ours = datasets.ImageFolder(os.path.join(m.path, "train"))
    theirs = datasets.ImageFolder(str(sample_tree / "train"))
    assert [os.path.relpath(p, ours.root) for p, _ in ours.samples] == \
        [os.path.relpath(p, theirs.root) for p, _ in theirs.samples]
    for (ours_path, _), (their_path, _) in zip(ours.samples, theirs.samples):
        assert _digest(ours_path) == _digest(their_path)
    formats = {os.getxattr(p, "user.shardfs.format") for p, _ in ours.samples}
    assert formats == {b"tar", b"lz4"}
