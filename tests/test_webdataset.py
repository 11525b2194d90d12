"""WebDataset shards: as they are (plain layout), and as an ImageFolder tree (--layout imagefolder)
checked against webdataset's own reader; `shardfs pack --layout webdataset` round-trips."""

import hashlib
import io
import os
import tarfile

import numpy as np
import pytest

from conftest import needs_fuse, shardfs_cmd
from benchlib import sample
from remote_servers import aws_env, bucket, moto_endpoint  # noqa: F401 (fixtures)
from shardfs.index import index_file, shard_index
from shardfs.index import store as index_store
from benchlib import sample
from shardfs.index import labels
from shardfs.view import layouts
from shardfs.service.config import MountConfig, apply_options, check, parse_config, to_args
from shardfs.errors import UsageError

wds = pytest.importorskip("webdataset")
torch = pytest.importorskip("torch")
datasets = pytest.importorskip("torchvision.datasets")
transforms = pytest.importorskip("torchvision.transforms")


@needs_fuse
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


# ---- the imagefolder layout over webdataset's own shards --------------------------------


@pytest.fixture(scope="module")
def wds_shards(tmp_path_factory):
    """12 classes x 3 real JPEGs, written by webdataset's ShardWriter over 5 shards (classes
    span shards), and the class-name list (sorted: ImageFolder numbers them as the labels)."""
    root = tmp_path_factory.mktemp("wds")
    top = sample.make_imagefolder(str(root / "src"), classes=12, per_class=3, side=32)
    source = datasets.ImageFolder(top)
    out = root / "shards"
    out.mkdir()
    order = np.random.RandomState(1).permutation(len(source.samples))
    with wds.ShardWriter(str(out / "train-%06d.tar"), maxcount=8, verbose=0) as sink:
        for i in order:
            path, label = source.samples[i]
            stem = os.path.splitext(os.path.basename(path))[0]
            sink.write({"__key__": stem, "jpg": open(path, "rb").read(), "cls": label})
    (root / "classes.txt").write_text("".join(f"{c}\n" for c in source.classes))
    return out, root / "classes.txt", source.classes


def wds_reference(urls):
    """{key: (jpg bytes, label)} as webdataset itself reads the shards."""
    ds = wds.WebDataset(sorted(map(str, urls)), shardshuffle=False).to_tuple("__key__", "jpg;jpeg;png", "cls")
    return {key: (jpg, int(cls)) for key, jpg, cls in ds}


def wds_pixels(urls):
    ds = wds.WebDataset(sorted(map(str, urls)), shardshuffle=False).decode("pil").to_tuple("__key__", "jpg;jpeg;png", "cls")
    return {key: (transforms.functional.pil_to_tensor(img), cls) for key, img, cls in ds}


def imagefolder_view(root):
    ds = datasets.ImageFolder(root)
    return ds, {os.path.splitext(os.path.basename(p))[0]: (open(p, "rb").read(), t) for p, t in ds.samples}


def loader_pixels(ds):
    """Every sample through a DataLoader with worker processes, keyed by file stem."""
    ds.transform = transforms.PILToTensor()
    got = {}
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, shuffle=False)
    n = 0
    for images, targets in loader:
        for img, t in zip(images, targets):
            key = os.path.splitext(os.path.basename(ds.samples[n][0]))[0]
            got[key] = (img, int(t))
            n += 1
    return got


def same_pixels(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key][0], b[key][0]) and a[key][1] == b[key][1], key


@needs_fuse
def test_imagefolder_layout_matches_webdataset_reader(wds_shards, mount):
    out, names_file, classes = wds_shards
    urls = sorted(out.glob("*.tar"))
    reference = wds_reference(urls)
    assert len(urls) == 5 and len(reference) == 36

    m = mount(out, options=("--layout", "imagefolder", "--class-names", str(names_file)))
    ds, view = imagefolder_view(m.path)
    assert ds.classes == classes and view == reference
    assert "left out" not in m.log()
    same_pixels(loader_pixels(ds), wds_pixels(urls))


@needs_fuse
def test_imagefolder_layout_of_shards_on_s3(wds_shards, bucket, moto_endpoint, mount):
    """The labels of remote shards are read at index build through the scan's 8 MiB windows."""
    out, names_file, classes = wds_shards
    reference = wds_reference(sorted(out.glob("*.tar")))
    url = bucket.upload_dir(out, prefix="wds/")
    m = mount(url, options=("--option", f"endpoint_url={moto_endpoint}", "--layout", "imagefolder",
                            "--class-names", str(names_file)))
    ds, view = imagefolder_view(m.path)
    assert ds.classes == classes and view == reference
    requests = m.stats()["remote"]["requests"]
    assert 0 < requests < 40, requests  # 5 small shards: a listing, then a few requests each


@needs_fuse
def test_imagefolder_layout_without_class_list_pads_labels(wds_shards, mount):
    out, _names, _classes = wds_shards
    reference = wds_reference(out.glob("*.tar"))
    m = mount(out, options=("-o", "layout=imagefolder"))  # as fstab gives it
    ds, view = imagefolder_view(m.path)
    assert ds.classes == [f"{i:02d}" for i in range(12)]  # sorted order = numeric order
    assert view == reference  # so ImageFolder's class index is the .cls label


@needs_fuse
def test_samples_without_a_usable_label_are_reported_and_left_out(tmp_path, mount):
    out = tmp_path / "wds"
    out.mkdir()
    jpg = open(sample.make_imagefolder(str(tmp_path / "src"), classes=1, per_class=1, side=16)
               + "/n00000000/n00000000_0.JPEG", "rb").read()
    with wds.ShardWriter(str(out / "s-%06d.tar"), maxcount=4, verbose=0) as sink:
        for i in range(6):
            sink.write({"__key__": f"good{i}", "jpg": jpg, "cls": i % 2})
        sink.write({"__key__": "nolabel", "jpg": jpg})
        sink.write({"__key__": "badlabel", "jpg": jpg, "cls": b"cat"})
        sink.write({"__key__": "negative", "jpg": jpg, "cls": b"-1"})
        sink.write({"__key__": "toolarge", "jpg": jpg, "cls": 2})  # only 2 names in the list
        sink.write({"__key__": "noimage", "txt": b"x", "cls": 0})
        sink.write({"__key__": "sub/dir/deep", "png": jpg, "cls": 1})  # key with "/": its last component
    (tmp_path / "names.txt").write_text("dog\ncat\n")  # not sorted: a warning
    m = mount(out, options=("--layout", "imagefolder", "--class-names", str(tmp_path / "names.txt")))
    assert sorted(os.listdir(os.path.join(m.path, "dog"))) == ["good0.jpg", "good2.jpg", "good4.jpg"]
    assert sorted(os.listdir(os.path.join(m.path, "cat"))) == ["deep.png", "good1.jpg", "good3.jpg", "good5.jpg"]
    assert open(os.path.join(m.path, "cat", "deep.png"), "rb").read() == jpg
    log = m.log()
    assert "1 sample without a .cls label, left out (e.g. s-000001.tar:nolabel)" in log
    assert "1 sample with a .cls that is not an integer, left out (e.g. s-000001.tar:badlabel)" in log
    assert "2 samples with a label out of range, left out (e.g. s-000002.tar:negative, s-000002.tar:toolarge)" in log
    assert "1 sample without an image member, left out (e.g. s-000002.tar:noimage)" in log
    assert log.count("not in sorted order") == 1
    assert "classes have no sample" not in log
    listed = shardfs_cmd("ls", str(out), "cat", "--layout", "imagefolder", "--class-names", str(tmp_path / "names.txt"))
    assert listed.stdout.split() == ["deep.png", "good1.jpg", "good3.jpg", "good5.jpg"]
    assert "1 sample without a .cls label" in listed.stderr


@needs_fuse
def test_two_samples_on_one_path_follow_the_duplicate_rule(tmp_path, mount):
    out = tmp_path / "wds"
    out.mkdir()
    for n, payload in enumerate((b"first", b"second")):
        with wds.TarWriter(str(out / f"s-{n}.tar")) as sink:
            sink.write({"__key__": f"dir{n}/same", "jpg": payload, "cls": 3})
    m = mount(out, options=("--layout", "imagefolder"))
    assert open(os.path.join(m.path, "3", "same.jpg"), "rb").read() == b"second"
    assert "3/same.jpg is in several shards (s-0.tar, s-1.tar)" in m.log()


# ---- shardfs pack --layout webdataset ---------------------------------------------------


def digests(folder):
    return {p: hashlib.sha256((folder / p).read_bytes()).hexdigest() for p in sorted(os.listdir(folder))
            if not p.startswith(".") and not p.endswith(shard_index.INDEX_SUFFIX)}


@needs_fuse
@pytest.mark.parametrize("fmt", ["tar", "lz4"])
def test_pack_webdataset_round_trips(sample_tree, tmp_path, mount, fmt):
    src = sample_tree / "train"
    source = datasets.ImageFolder(str(src))
    out = tmp_path / "out"
    shardfs_cmd("pack", str(src), str(out), "--layout", "webdataset", "--format", fmt, "--shuffle",
                "--shard-members", "16", "--workers", "2", check=True)
    assert (out / "classes.txt").read_text().split() == source.classes
    shards = sorted(out.glob("train-*"))
    shards = [s for s in shards if not s.name.endswith(shard_index.INDEX_SUFFIX)]
    assert len(shards) == 9  # 72 samples, 8 a shard: a sample is never split

    if fmt == "tar":  # webdataset reads tar shards only
        reference = wds_reference(shards)
        expected = {os.path.splitext(os.path.basename(p))[0]: (open(p, "rb").read(), t) for p, t in source.samples}
        assert reference == expected

        again = tmp_path / "again"
        shardfs_cmd("pack", str(src), str(again), "--layout", "webdataset", "--shuffle", "--shard-members", "16",
                    check=True)
        assert digests(again) == digests(out)  # same bytes for any --workers

    m = mount(out, options=("--layout", "imagefolder", "--class-names", str(out / "classes.txt")))
    assert sample.files_under(m.path) == sample.files_under(str(src))
    for rel in sample.files_under(str(src)):
        assert open(os.path.join(m.path, rel), "rb").read() == (src / rel).read_bytes()


def test_pack_webdataset_keys_are_unique_and_dotless(tmp_path):
    src = tmp_path / "src"
    for folder, name in [("a", "x.jpg"), ("b", "x.jpg"), ("b", "x_1.png"), ("a", "y.v2.jpeg"), ("a", "notes.txt")]:
        (src / folder).mkdir(parents=True, exist_ok=True)
        (src / folder / name).write_bytes(f"{folder}/{name}".encode())
    (src / "top.jpg").write_bytes(b"not in a class")
    shardfs_cmd("pack", str(src), str(tmp_path / "out"), "--layout", "webdataset", "--under", "train", check=True)
    with tarfile.open(tmp_path / "out" / "src-000000.tar") as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar}
    assert got == {"train/x.jpg": b"a/x.jpg", "train/x.cls": b"0", "train/x_2.jpg": b"b/x.jpg", "train/x_2.cls": b"1",
                   "train/x_1.png": b"b/x_1.png", "train/x_1.cls": b"1",
                   "train/y_v2.jpeg": b"a/y.v2.jpeg", "train/y_v2.cls": b"0"}
    assert (tmp_path / "out" / "classes.txt").read_text() == "a\nb\n"


# ---- units: labels in the index, the transform, the options ---------------------------


def write_tar(path, members):
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_labels_are_read_at_build_and_loaded_from_the_saved_index(tmp_path, monkeypatch):
    shard = str(tmp_path / "s.tar")
    write_tar(shard, [("k1.jpg", b"J1"), ("k1.cls", b"7"), ("k2.jpg", b"J2"), ("k2.cls", b"x"),
                      ("k3.CLS", b" 12\n"), ("big.cls", b"1" * 40), ("k4.txt", b"5")])
    ix, how = index_store.load_or_build(shard)
    assert how == "built"
    got = {ix.name(int(m)): int(v) for m, v in zip(ix.cls_member, ix.cls_value)}
    assert got == {b"k1.cls": 7, b"k2.cls": int(labels.UNPARSABLE), b"k3.CLS": 12}  # big.cls: not a label

    def fail(*_a, **_k):
        raise AssertionError("the shard was read again although its index is current")

    monkeypatch.setattr(shard_index, "build", fail)
    monkeypatch.setattr(labels, "read_labels", fail)
    again, how = index_store.load_or_build(shard)
    assert how == "loaded"
    assert (again.cls_member == ix.cls_member).all() and (again.cls_value == ix.cls_value).all()


def test_shards_without_cls_members_read_no_labels(tar_shards, monkeypatch):
    def fail(*_a, **_k):
        raise AssertionError("labels read from a shard without .cls members")

    monkeypatch.setattr(labels, "read_labels", fail)
    ix = shard_index.build(str(sorted(tar_shards.glob("*.tar"))[0]))
    assert len(ix) == 18 and len(ix.cls_member) == 0


def test_an_index_of_the_previous_version_is_rebuilt(tmp_path, monkeypatch, caplog):
    shard = str(tmp_path / "s.tar")
    write_tar(shard, [("k.jpg", b"J"), ("k.cls", b"3")])
    with monkeypatch.context() as patch:
        patch.setattr(index_file, "INDEX_VERSION", 1)
        index_store.load_or_build(shard)
    caplog.set_level("INFO")
    ix, how = index_store.load_or_build(shard)
    assert how == "built" and ix.cls_value.tolist() == [3]
    assert f"index version 1, this shardfs writes {index_file.INDEX_VERSION}; rebuilding" in caplog.text
    assert index_store.load_or_build(shard)[1] == "loaded"


def test_tar_labels_come_with_the_scan_not_a_second_pass(tmp_path, monkeypatch):
    """The scan keeps each tiny member's data it read anyway: no read per label afterwards."""
    from shardfs.formats.tar import TarFormat

    shard = str(tmp_path / "s.tar")
    write_tar(shard, [item for i in range(30) for item in ((f"k{i}.jpg", os.urandom(5000)), (f"k{i}.cls", b"%d" % i))]
              + [("last.cls", b"9")])

    def fail(*_a, **_k):
        raise AssertionError("the shard was read again for its labels")

    monkeypatch.setattr(TarFormat, "open_layout", fail)
    ix = shard_index.build(shard)
    assert {ix.name(int(m)): int(v) for m, v in zip(ix.cls_member, ix.cls_value)} == {
        **{f"k{i}.cls".encode(): i for i in range(30)}, b"last.cls": 9}


def test_lz4_labels_are_read_through_the_layout(tmp_path):
    from shardfs.formats.lz4shard import Lz4ShardWriter

    shard = str(tmp_path / "s.lz4shard")
    with Lz4ShardWriter(shard, block_size=4096) as w:
        for i in range(50):
            w.add_file(f"k{i}.jpg", os.urandom(300))
            w.add_file(f"k{i}.cls", str(i % 7).encode())
    ix = shard_index.build(shard)
    assert ix.cls_value.tolist() == [i % 7 for i in range(50)]


def test_imagefolder_transform_renames_and_keeps_the_bytes(tmp_path):
    shard = str(tmp_path / "s.tar")
    write_tar(shard, [("a/k1.jpg", b"J1"), ("a/k1.cls", b"1"), ("a/k1.json", b"{}"), ("k2.seg.png", b"S"),
                      ("k2.PNG", b"P2"), ("k2.cls", b"0"), ("README", b"r")])
    ix = shard_index.build(shard)
    skipped = layouts.Skipped()
    view = layouts.imagefolder(ix, layouts.ImageFolderLayout(["zero", "one"]), "s.tar", skipped)
    assert [view.name(i) for i in range(len(view))] == [b"one/k1.jpg", b"zero/k2.PNG"]
    assert view.dirs == [b"one", b"zero"] and view.parent.tolist() == [0, 1]
    originals = {ix.name(i): (int(ix.offset[i]), int(ix.size[i])) for i in range(len(ix))}
    assert [(int(o), int(s)) for o, s in zip(view.offset, view.size)] == [originals[b"a/k1.jpg"], originals[b"k2.PNG"]]
    assert view.hash.tolist() == [shard_index.path_hash(view.name(i)) for i in range(2)]
    assert not skipped.counts
    assert layouts.imagefolder(ix, layouts.ImageFolderLayout(["zero"]), "s.tar", skipped).name(0) == b"zero/k2.PNG"
    assert skipped.lines() == ["imagefolder layout: 1 sample with a label out of range, left out (e.g. s.tar:a/k1)"]


def test_classes_without_samples_are_noted(tmp_path):
    shard = str(tmp_path / "s.tar")
    write_tar(shard, [("a.jpg", b"A"), ("a.cls", b"0"), ("b.jpg", b"B"), ("b.cls", b"3")])
    views, notes = layouts.apply(layouts.ImageFolderLayout(), ["s.tar"], [shard_index.build(shard)])
    assert notes == ["imagefolder layout: 2 of 4 classes have no sample (1, 2), so ImageFolder's class indices "
                     "differ from the .cls labels after the first of them"]
    _views, notes = layouts.apply(layouts.ImageFolderLayout(["a", "b", "c", "d", "e"]), ["s.tar"],
                                  [shard_index.build(shard)])
    assert "3 of 5 classes have no sample (b, c, e)" in notes[0]


def test_layout_options_from_toml_fstab_and_command_line(tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("a\nb\n")
    cfg = parse_config({"sources": ["/d"], "mountpoint": "/m", "layout": "imagefolder", "class_names": str(names)})
    assert (cfg.layout, cfg.class_names) == ("imagefolder", str(names))
    args = to_args(cfg)
    assert args[args.index("--layout"):][:4] == ["--layout", "imagefolder", "--class-names", str(names)]
    with pytest.raises(UsageError, match="layout: expected plain or imagefolder"):
        parse_config({"sources": ["/d"], "mountpoint": "/m", "layout": "wds"}, "x.toml")
    with pytest.raises(UsageError, match="class_names: applies to layout imagefolder only"):
        parse_config({"sources": ["/d"], "mountpoint": "/m", "class_names": str(names)}, "x.toml")
    with pytest.raises(UsageError, match="class_names: .*cannot read"):
        parse_config({"sources": ["/d"], "mountpoint": "/m", "layout": "imagefolder",
                      "class_names": str(tmp_path / "none")}, "x.toml")
    fstab = MountConfig(sources=["/d"], mountpoint="/m")
    apply_options(fstab, f"ro,layout=imagefolder,class_names={names}")
    check(fstab)
    assert (fstab.layout, fstab.class_names) == ("imagefolder", str(names))
    # A readable shard, so that only the class names can be what the command refuses.
    shard = tmp_path / "s.tar"
    write_tar(str(shard), [("a.jpg", b"A"), ("a.cls", b"0")])
    assert shardfs_cmd("ls", str(shard), "--layout", "imagefolder", "--class-names", str(names)).returncode == 0
    done = shardfs_cmd("ls", str(shard), "--layout", "imagefolder", "--class-names", str(tmp_path / "none"))
    assert done.returncode == 2
    assert f"{tmp_path / 'none'}: cannot read" in done.stderr


@needs_fuse
def test_sighup_rescan_keeps_the_imagefolder_layout(tmp_path, mount):
    out = tmp_path / "wds"
    out.mkdir()
    with wds.TarWriter(str(out / "s-0.tar")) as sink:
        sink.write({"__key__": "a", "jpg": b"A", "cls": 0})
    m = mount(out, options=("--layout", "imagefolder"))
    assert os.listdir(m.path) == ["0"]
    with wds.TarWriter(str(out / "s-1.tar")) as sink:
        sink.write({"__key__": "b", "jpg": b"B", "cls": 1})
        sink.write({"__key__": "nolabel", "jpg": b"N"})
    m.rescan()
    assert m.stats()["shards"] == 2
    assert sorted(os.listdir(m.path)) == ["0", "1"]
    assert open(os.path.join(m.path, "1", "b.jpg"), "rb").read() == b"B"
    assert "1 sample without a .cls label, left out (e.g. s-1.tar:nolabel)" in m.log()


def test_pack_dataset_webdataset_labels_are_the_targets(tmp_path):
    from shardfs.pack.packer import pack_dataset

    class Unsorted(datasets.FakeData):
        classes = ["zz", "aa", "mm", "unused"]

    ds = Unsorted(size=6, image_size=(3, 8, 8), num_classes=3)
    pack_dataset(ds, str(tmp_path / "out"), "fake", layout="webdataset", shard_members=4)
    reference = wds_reference(sorted((tmp_path / "out").glob("*.tar")))
    assert {k: label for k, (_png, label) in reference.items()} == {str(i): ds[i][1] for i in range(6)}
    assert (tmp_path / "out" / "classes.txt").read_text().split() == Unsorted.classes
