"""`shardfs pack`: every source kind round-trips through a real mount; output is reproducible."""

import hashlib
import json
import os
import shutil
import tarfile

import numpy as np
import pytest
from conftest import needs_fuse

from shardfs.index import shard_index
from shardfs.cli import main
from shardfs.pack.packer import pack_dataset

datasets = pytest.importorskip("torchvision.datasets")
Image = pytest.importorskip("PIL.Image")


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def ok(capsys, *args) -> str:
    code, out, err = run(capsys, *args)
    assert code == 0, f"shardfs {' '.join(map(str, args))} -> {code}\n{out}\n{err}"
    return out


def digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def rel_samples(ds):
    return [(os.path.relpath(p, ds.root), t) for p, t in ds.samples]


def shard_files(out, prefix=""):
    return sorted(p for p in os.listdir(out) if p.startswith(prefix) and p.endswith((".tar", ".lz4shard")))


def member_names(path) -> list[str]:
    ix = shard_index.build(str(path))
    return [ix.name(i).decode() for i in range(len(ix))]


@pytest.fixture
def src(sample_tree, tmp_path):
    """A copy of the sample (src/train/<class>/<n>.JPEG) plus a JSON mapping beside it and
    a text mapping with a class list elsewhere."""
    root = tmp_path / "src"
    shutil.copytree(sample_tree, root)
    reference = datasets.ImageFolder(str(root / "train"))
    rel = [(os.path.relpath(p, root), t) for p, t in reference.samples]
    (root / "train.json").write_text(json.dumps(dict(rel)))
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "train.txt").write_text("# path label\n" + "".join(f"{p} {t}\n" for p, t in rel))
    (lists / "classes.txt").write_text("".join(c + "\n" for c in reference.classes))
    return root


@needs_fuse
@pytest.mark.parametrize("fmt", ["tar", "lz4"])
def test_every_source_kind_round_trips_through_a_mount(src, tmp_path, mount, fmt):
    out = tmp_path / "shards"
    common = ["--format", fmt, "--shard-size", "64K", "--shuffle", "--block-size", "16K"]
    # A directory keeps paths relative to it: src holds train/..., so members are train/...
    assert main(["pack", str(src), str(out), "--prefix", "dir", *common]) == 0
    assert main(["pack", str(src / "train.json"), str(out), "--under", "json", *common]) == 0
    assert main(["pack", str(tmp_path / "lists" / "train.txt"), str(out), "--classes",
                 str(tmp_path / "lists" / "classes.txt"), "--root", str(src), "--under", "text", "--prefix", "text",
                 *common]) == 0
    fake = datasets.FakeData(size=30, image_size=(3, 20, 20), num_classes=4)
    summary = pack_dataset(fake, str(out), "fake", under="fake", format=fmt, shard_members=8)
    assert summary.members == 30 and len(summary.shards) == 4

    suffix = ".tar" if fmt == "tar" else ".lz4shard"
    manifests = sorted(p for p in os.listdir(out) if p.endswith(".manifest.json"))
    assert manifests == ["dir.manifest.json", "fake.manifest.json", "text.manifest.json", "train.manifest.json"]
    for name in shard_files(out):
        assert name.endswith(suffix)
        assert os.path.exists(out / (name + shard_index.INDEX_SUFFIX))  # indexed at pack time

    m = mount(out)
    assert m.stats()["indexes_built"] == 0
    theirs = datasets.ImageFolder(str(src / "train"))

    def same_files(ours, expected_rel):
        assert rel_samples(ours) == expected_rel
        for (path, _), (their_path, _) in zip(ours.samples, sorted(theirs.samples)):
            assert digest(path) == digest(their_path)

    # directory and text mapping with a class list: identical ImageFolder
    for top in ("train", "text"):
        ours = datasets.ImageFolder(os.path.join(m.path, top))
        assert ours.classes == theirs.classes and ours.class_to_idx == theirs.class_to_idx
        same_files(ours, rel_samples(theirs))
    assert open(os.path.join(m.path, "train.json")).read() == (src / "train.json").read_text()

    # JSON mapping without a class list: folders are the label numbers
    ours = datasets.ImageFolder(os.path.join(m.path, "json"))
    assert ours.classes == [str(i) for i in range(len(theirs.classes))]
    same_files(ours, [(f"{t}/{os.path.basename(p)}", t) for p, t in rel_samples(theirs)])

    # FakeData: decoded pixels and labels equal the dataset's
    ours = datasets.ImageFolder(os.path.join(m.path, "fake"))
    assert ours.classes == ["0", "1", "2", "3"] and len(ours) == 30
    for path, target in ours.samples:
        i = int(os.path.splitext(os.path.basename(path))[0])
        image, label = fake[i]
        assert target == label
        assert path.endswith(".png")
        assert np.array_equal(np.asarray(Image.open(path)), np.asarray(image))


def test_same_input_and_seed_give_identical_shards_for_any_workers(src, tmp_path, capsys):
    for fmt in ("tar", "lz4"):
        outs = []
        for workers, seed in ((1, 3), (2, 3), (3, 3), (2, 4)):
            out = tmp_path / f"{fmt}-{workers}-{seed}"
            ok(capsys, "pack", src / "train", out, "--prefix", "p", "--format", fmt, "--shuffle", "--seed", seed,
               "--shard-size", "40K", "--workers", workers, "--block-size", "8K")
            outs.append({name: (out / name).read_bytes() for name in os.listdir(out)
                         if not name.endswith(shard_index.INDEX_SUFFIX)})
        assert len(outs[0]) > 4  # several shards and the manifest
        assert outs[0] == outs[1] == outs[2]
        assert outs[0] != outs[3]  # another seed, another order


def test_pack_dataset_output_does_not_depend_on_workers(tmp_path):
    fake = datasets.FakeData(size=300, image_size=(3, 8, 8), num_classes=3)  # two encoding chunks
    outs = []
    for workers in (1, 3):
        out = tmp_path / f"w{workers}"
        pack_dataset(fake, str(out), "fake", workers=workers, shard_members=64, shuffle=True, seed=1,
                     format="lz4")
        outs.append({n: (out / n).read_bytes() for n in os.listdir(out) if not n.endswith(shard_index.INDEX_SUFFIX)})
        assert not [n for n in os.listdir(out) if n.startswith(".")]  # the spool is gone
    assert outs[0] == outs[1]


def test_pack_dataset_stores_imagefolder_files_as_they_are_and_jpeg_on_request(sample_tree, tmp_path):
    folder = datasets.ImageFolder(str(sample_tree / "train"))
    summary = pack_dataset(folder, str(tmp_path / "a"), "imgs")
    assert summary.members == len(folder)
    with tarfile.open(tmp_path / "a" / "imgs-000000.tar") as tar:
        for i, (path, target) in enumerate(folder.samples):
            member = f"{folder.classes[target]}/{i:02d}.JPEG"
            assert tar.extractfile(member).read() == open(path, "rb").read()

    fake = datasets.FakeData(size=4, image_size=(3, 16, 16), num_classes=2)
    pack_dataset(fake, str(tmp_path / "b"), "j", image_format="JPEG", quality=80)
    with tarfile.open(tmp_path / "b" / "j-000000.tar") as tar:
        names = tar.getnames()
        assert all(n.endswith(".jpg") for n in names) and len(names) == 4
        assert Image.open(tar.extractfile(names[0])).format == "JPEG"


@pytest.mark.parametrize("fmt", ["tar", "lz4"])
def test_shard_limits_are_respected(src, tmp_path, capsys, fmt):
    files = [p for p in (src / "train").rglob("*") if p.is_file()]
    biggest = max(p.stat().st_size for p in files)
    limit = 48 * 1024
    out = tmp_path / "bytes"
    ok(capsys, "pack", src / "train", out, "--format", fmt, "--shard-size", "48K", "--block-size", "4K")
    shards = shard_files(out)
    sizes = [os.path.getsize(out / s) for s in shards]
    assert len(sizes) >= 3 and all(size <= limit for size in sizes), sizes  # full shards below are compared
    # full: only the next member (at most ~biggest + header / tar record padding) did not fit
    slack = biggest + 512 + (10240 if fmt == "tar" else 4096)
    assert all(size > limit - slack for size in sizes[:-1]), sizes
    assert sum(len(member_names(out / s)) for s in shards) == len(files)

    out = tmp_path / "members"
    ok(capsys, "pack", src / "train", out, "--format", fmt, "--shard-members", "7")
    counts = [len(member_names(out / s)) for s in shard_files(out)]
    assert counts == [7] * (len(files) // 7) + ([len(files) % 7] if len(files) % 7 else [])


def test_sorted_shards_hold_one_class_and_shuffled_shards_mix_classes(src, tmp_path, capsys):
    classes_of = lambda names: {n.split("/")[0] for n in names}  # noqa: E731 (<class>/<file>)
    ok(capsys, "pack", src / "train", tmp_path / "sorted", "--shard-members", "12")
    per_shard = [classes_of(member_names(tmp_path / "sorted" / s)) for s in shard_files(tmp_path / "sorted")]
    assert [len(c) for c in per_shard] == [1] * 6  # 6 classes of 12 images, in order
    assert [c.pop() for c in per_shard] == sorted(os.listdir(src / "train"))

    ok(capsys, "pack", src / "train", tmp_path / "shuffled", "--shard-members", "12", "--shuffle")
    for s in shard_files(tmp_path / "shuffled"):
        names = member_names(tmp_path / "shuffled" / s)
        assert len(classes_of(names)) >= 3, names


def test_tar_headers_are_normalised_and_long_names_survive(tmp_path, capsys):
    tree = tmp_path / "t"
    long_dir = tree / ("d" * 90) / ("e" * 90)
    long_dir.mkdir(parents=True)
    (long_dir / "deep.bin").write_bytes(b"x" * 1000)
    (tree / "caf\u00e9.txt").write_text("accent")
    script = tree / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o775)
    os.utime(script, (1_600_000_000, 1_600_000_000))
    out = ok(capsys, "pack", tree, tmp_path / "out", "--prefix", "t")
    assert "packed 3 files" in out
    shard = tmp_path / "out" / "t-000000.tar"
    with tarfile.open(shard) as tar:
        infos = {i.name: i for i in tar.getmembers()}
    assert set(infos) == {f"{'d' * 90}/{'e' * 90}/deep.bin", "caf\u00e9.txt", "run.sh"}
    for info in infos.values():
        assert (info.uid, info.gid, info.uname, info.gname) == (0, 0, "", "")
        assert info.mode in (0o644, 0o755)
    assert infos["run.sh"].mode == 0o755 and infos["run.sh"].mtime == 1_600_000_000
    ix = shard_index.build(str(shard))
    assert not ix.warnings and not ix.error and len(ix) == 3
    assert os.path.getsize(shard) % 10240 == 0

    ok(capsys, "pack", tree, tmp_path / "fixed", "--prefix", "t", "--mtime", "0")
    with tarfile.open(tmp_path / "fixed" / "t-000000.tar") as tar:
        assert {i.mtime for i in tar.getmembers()} == {0}


def test_an_earlier_pack_is_kept_unless_overwrite(src, tmp_path, capsys):
    out = tmp_path / "out"
    ok(capsys, "pack", src / "train", out, "--prefix", "p", "--shard-members", "10")
    assert len(shard_files(out)) == 8
    code, _, err = run(capsys, "pack", src / "train", out, "--prefix", "p")
    assert code == 2 and "--overwrite" in err
    ok(capsys, "pack", src / "train", out, "--prefix", "p", "--overwrite")
    assert shard_files(out) == ["p-000000.tar"]
    assert sorted(os.listdir(out)) == ["p-000000.tar", "p-000000.tar.shardfs-idx", "p.manifest.json"]
    manifest = json.loads((out / "p.manifest.json").read_text())
    assert manifest["totals"]["members"] == 72 and manifest["shards"][0]["sha256"] == digest(out / "p-000000.tar")


def test_usage_errors(src, tmp_path, capsys):
    lists = tmp_path / "lists"
    bad_label = tmp_path / "bad.txt"
    bad_label.write_text("train/n00000000/n00000000_0.JPEG 9\n")
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"train/nope.JPEG": 0}))
    twice = tmp_path / "twice.txt"
    twice.write_text("train/n00000000/n00000000_0.JPEG 0\ntrain/n00000001/n00000000_0.JPEG 0\n")
    (src / "train" / "n00000001" / "n00000000_0.JPEG").write_bytes(b"x")
    cases = [
        (["pack", tmp_path / "nope", tmp_path / "o1"], "no such file"),
        (["pack", bad_label, tmp_path / "o2", "--classes", lists / "classes.txt", "--root", src], "class list"),
        (["pack", missing, tmp_path / "o3", "--root", src], "cannot stat"),
        (["pack", twice, tmp_path / "o4", "--root", src], "two sources"),
        (["pack", src, tmp_path / "o5", "--shard-size", "lots"], "--shard-size"),
        (["pack", src, tmp_path / "o6", "--classes", lists / "classes.txt"], "mapping file"),
    ]
    for args, fragment in cases:
        code, _, err = run(capsys, *args)
        assert code == 2 and fragment in err, (args, err)
