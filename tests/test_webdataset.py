"""Shards written by WebDataset's own ShardWriter mount as they are (plain layout)."""

import os

import pytest

from conftest import needs_fuse

wds = pytest.importorskip("webdataset")
pytestmark = needs_fuse


def test_shardwriter_output_mounts_with_every_sample(tmp_path, mount):
    out = tmp_path / "wds"
    out.mkdir()
    samples = {f"n{c:08d}_{i}": (os.urandom(1000 + 37 * i), c) for c in range(3) for i in range(20)}
    with wds.ShardWriter(str(out / "train-%06d.tar"), maxcount=25) as sink:
        for key, (jpg, cls) in samples.items():
            sink.write({"__key__": key, "jpg": jpg, "cls": cls})
    assert len(list(out.glob("*.tar"))) == 3
    m = mount(out)
    names = set(os.listdir(m.path))
    assert names == {f"{k}.{ext}" for k in samples for ext in ("jpg", "cls")}
    for key, (jpg, cls) in samples.items():
        assert open(os.path.join(m.path, f"{key}.jpg"), "rb").read() == jpg
        assert open(os.path.join(m.path, f"{key}.cls")).read() == str(cls)
