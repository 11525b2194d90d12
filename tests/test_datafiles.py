"""Parquet, Arrow IPC and HDF5 files mounted as ImageFolder trees (formats/parquet.py, arrowipc.py,
hdf5.py): files written by the real libraries (datasets, pyarrow as the JSC course uses it, h5py),
real mounts, every image compared by sha256 with its source, real torchvision ImageFolder."""

from __future__ import annotations

import collections
import hashlib
import os
import shutil
import sys

import pytest

from conftest import needs_fuse, shardfs_cmd
from remote_servers import bucket, moto_endpoint, aws_env, nginx, tree_digests  # noqa: F401 (fixtures)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
h5py = pytest.importorskip("h5py")
np = pytest.importorskip("numpy")

pytestmark = needs_fuse


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Samples:
    """The sample tree's train images: (class index, file name, bytes), in class order."""

    def __init__(self, root):
        self.classes = sorted(os.listdir(root / "train"))
        self.rows = [(i, name, (root / "train" / c / name).read_bytes())
                     for i, c in enumerate(self.classes) for name in sorted(os.listdir(root / "train" / c))]

    def by_row(self, split: str = "train", rows=None) -> dict[str, str]:
        """What a file without class names or paths shows: SPLIT/<label>/<row>.jpg -> sha256."""
        rows = self.rows if rows is None else rows
        width = len(str(len(rows) - 1))
        return {f"{split}/{label}/{n:0{width}d}.jpg": sha(data) for n, (label, _, data) in enumerate(rows)}


@pytest.fixture(scope="module")
def samples(sample_tree):
    return Samples(sample_tree)


# --------------------------------------------------------------------------- writers


def write_hf(samples: Samples, out, split: str = "train", shards: int = 2) -> None:
    """As the Hugging Face hub's Parquet: datasets' to_parquet, Image() and ClassLabel(names)."""
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=samples.classes)})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": d, "path": n} for _, n, d in samples.rows],
                                     "label": [label for label, _, _ in samples.rows]}, features=features)
    os.makedirs(out, exist_ok=True)
    for i in range(shards):
        ds.shard(shards, i, contiguous=True).to_parquet(str(out / f"{split}-{i:05d}-of-{shards:05d}.parquet"))


def write_saved(samples: Samples, out) -> None:
    """datasets' save_to_disk: the Arrow stream format plus dataset_info.json."""
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=samples.classes)})
    datasets.Dataset.from_dict({"image": [{"bytes": d, "path": n} for _, n, d in samples.rows],
                                "label": [label for label, _, _ in samples.rows]},
                               features=features).save_to_disk(str(out))


def write_course_arrow(samples: Samples, path) -> None:
    """The JSC course's Arrow IPC file: one record batch per sample, image_data binary, label uint16."""
    schema = pa.schema([pa.field("image_data", pa.binary()), pa.field("label", pa.uint16())])
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, schema) as writer:
        for label, _, data in samples.rows:
            writer.write(pa.record_batch([pa.array([data], type=pa.binary()), pa.array([label], type=pa.uint16())],
                                         schema=schema))


def write_stream_arrow(samples: Samples, path) -> None:
    """The Arrow IPC stream format, record batches of 10 rows."""
    schema = pa.schema([pa.field("image_data", pa.binary()), pa.field("label", pa.uint16())])
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, schema) as writer:
        for i in range(0, len(samples.rows), 10):
            part = samples.rows[i : i + 10]
            writer.write(pa.record_batch([pa.array([d for _, _, d in part], pa.binary()),
                                          pa.array([label for label, _, _ in part], pa.uint16())], schema=schema))


def write_course_h5(samples: Samples, path, splits=("train", "val")) -> None:
    """The JSC course's HDF5 file: a group per split, vlen uint8 `images`, int16 `targets`."""
    with h5py.File(str(path), "w") as f:
        for split in splits:
            group = f.create_group(split)
            images = group.create_dataset("images", (len(samples.rows),), dtype=h5py.vlen_dtype(np.dtype(np.uint8)))
            targets = group.create_dataset("targets", (len(samples.rows),), dtype=np.dtype("int16"))
            for idx, (label, _, data) in enumerate(samples.rows):
                images[idx] = np.frombuffer(data, dtype=np.uint8)
                targets[idx] = label


def write_codec(samples: Samples, path, codec: str, **kw) -> None:
    """Parquet of several row groups and many pages, compressed with ``codec``."""
    table = pa.table({"image_data": pa.array([d for _, _, d in samples.rows], pa.binary()),
                      "label": pa.array([label for label, _, _ in samples.rows], pa.int64())})
    pq.write_table(table, str(path), compression=codec, row_group_size=20, data_page_size=4096, **kw)


# --------------------------------------------------------------------------- mounts of each writer's files


def check_imagefolder(root: str, split: str, classes: list[str], rows) -> None:
    """torchvision's ImageFolder on the mount: its classes, and each sample's target = its stored label."""
    from torchvision.datasets import ImageFolder

    folder = ImageFolder(os.path.join(root, split))
    assert folder.classes == classes
    served = collections.Counter()
    for path, target in folder.samples:
        with open(path, "rb") as f:
            served[sha(f.read()), target] += 1
    # as a multiset: a sample served twice cannot stand in for one that is missing
    assert served == collections.Counter((sha(data), label) for label, _, data in rows)


@pytest.mark.parametrize("kind", ["hf_parquet", "saved_arrow"])
def test_the_hubs_files_mounted_under_their_paths_and_class_names(kind, samples, sample_tree, mount, tmp_path):
    """datasets' to_parquet (split from the file name) and save_to_disk (no split): each image under
    its stored path, in the folder of its ClassLabel name."""
    src = tmp_path / "src"
    if kind == "hf_parquet":
        write_hf(samples, src)
        want, split = tree_digests(sample_tree), "train"
    else:
        write_saved(samples, src)
        want = {f"{samples.classes[label]}/{n}": sha(d) for label, n, d in samples.rows}
        split = ""
    m = mount(src, options=("--layout", "imagefolder"))
    assert tree_digests(m.path) == want
    check_imagefolder(m.path, split, samples.classes, samples.rows)
    assert m.stats()["read_errors"] == 0
    assert "rows have an ImageFolder class index other" not in m.log()


def test_a_hub_snapshot_and_a_saved_dataset_dict_mount_from_their_top_folder(samples, tar_shards, mount, tmp_path):
    """Dataset files only below the folder named: the hub's snapshot (`data/*.parquet`, links into
    its blob store, a README beside) and `datasets`' save_to_disk of a DatasetDict (a folder per
    split, `data-0000K-of-0000N.arrow` in each): each split's images under SPLIT/CLASS/NAME. Hidden
    folders are not searched; tar shards below the top are left out, with a warning."""
    datasets = pytest.importorskip("datasets")

    def want(split: str) -> dict[str, str]:
        return {f"{split}/{samples.classes[label]}/{n}": sha(d) for label, n, d in samples.rows}

    snapshot, blobs = tmp_path / "snapshot", tmp_path / "blobs"
    write_hf(samples, blobs / "train", "train")
    write_hf(samples, blobs / "validation", "validation", shards=1)
    write_hf(samples, snapshot / ".cache" / "huggingface", "test", shards=1)  # not the dataset's
    (snapshot / "data").mkdir()
    (snapshot / "README.md").write_text("---\nlicense: other\n---\n")
    for blob in sorted(blobs.glob("*/*.parquet")):
        (snapshot / "data" / blob.name).symlink_to(blob)
    (snapshot / "wds").mkdir()
    shutil.copy(sorted(tar_shards.glob("*.tar"))[0], snapshot / "wds")
    m = mount(snapshot)
    assert tree_digests(m.path) == {**want("train"), **want("validation")}
    for split in ("train", "validation"):
        check_imagefolder(m.path, split, samples.classes, samples.rows)
    assert "mounting the 3 dataset files in its subdirectories" in m.log()
    assert "1 tar/lz4 shards below its top left out" in m.log()

    saved = tmp_path / "saved"
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=samples.classes)})
    split = datasets.Dataset.from_dict({"image": [{"bytes": d, "path": n} for _, n, d in samples.rows],
                                        "label": [label for label, _, _ in samples.rows]}, features=features)
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(saved), num_shards={"train": 2, "test": 1})
    m = mount(saved, name="mnt-saved")
    assert tree_digests(m.path) == {**want("train"), **want("test")}
    check_imagefolder(m.path, "test", samples.classes, samples.rows)
    assert m.stats()["read_errors"] == 0


def test_the_courses_files_and_the_stream_format(samples, mount, tmp_path):
    """The course's Arrow IPC file (train) and HDF5 file (a group per split), and an Arrow stream
    (validation): names are row numbers, class folders the labels zero-padded."""
    src = tmp_path / "src"
    src.mkdir()
    write_course_arrow(samples, src / "ImageNet-train.arrow")
    write_stream_arrow(samples, src / "validation.arrow")
    write_course_h5(samples, src / "ImageNet.h5", splits=("val", "test"))
    m = mount(src, options=("--layout", "imagefolder"))
    splits = ("train", "validation", "val", "test")
    assert tree_digests(m.path) == {k: v for split in splits for k, v in samples.by_row(split).items()}
    for split in splits:
        check_imagefolder(m.path, split, [str(c) for c in range(len(samples.classes))], samples.rows)
    assert m.stats()["read_errors"] == 0


def test_parquet_row_groups_and_codecs_every_image(samples, mount, tmp_path):
    """Parquet of several row groups and many pages, one file per codec (a split each)."""
    src = tmp_path / "src"
    src.mkdir()
    codecs = {"train": "snappy", "validation": "zstd", "val": "gzip", "test": "none"}
    for split, codec in codecs.items():
        write_codec(samples, src / f"{split}.parquet", codec)
        assert pq.ParquetFile(str(src / f"{split}.parquet")).metadata.num_row_groups > 1
    m = mount(src)  # plain layout: dataset files still show their class folders
    assert tree_digests(m.path) == {k: v for split in codecs for k, v in samples.by_row(split).items()}


def test_dictionary_pages_and_data_page_v2(samples, tmp_path):
    """Pages pyarrow writes with other settings: a dictionary page (indices in the data pages), and
    v2 pages with checksums. Read through the layout as the daemon reads them."""
    from shardfs.formats import format_for
    from shardfs.storage import open_shard

    for name, kw in {"dict.parquet": {"use_dictionary": True, "data_page_version": "2.0"},
                     "v2.parquet": {"use_dictionary": False, "data_page_version": "2.0",
                                    "write_page_checksum": True}}.items():
        path = str(tmp_path / name)
        write_codec(samples, path, "snappy", **kw)
        shard = open_shard(path)
        fmt = format_for(path)
        result, layout = fmt.scan(shard), fmt.open_layout(shard, shard.size)
        assert result.error is None and not result.warnings
        got = [sha(layout.read(m.offset, m.size, shard.pread)) for m in result.members]
        assert got == [sha(d) for _, _, d in samples.rows]
        assert [m.label for m in result.members] == [label for label, _, _ in samples.rows]


def test_parquet_pages_and_lz4_blocks_share_one_bounded_cache_under_keys_of_their_own(samples, tmp_path):
    """Decoded Parquet pages and lz4 blocks are kept in one cache: a layout of either kind never
    reads the other's entries (keyed by (owner, page offset or block number))."""
    from shardfs.formats import format_for
    from shardfs.formats.lz4shard import Lz4ShardWriter
    from shardfs.storage import open_shard

    path = str(tmp_path / "train.parquet")
    write_codec(samples, path, "snappy")
    with Lz4ShardWriter(str(tmp_path / "a.lz4shard"), block_size=1024) as w:
        for i, (_, name, data) in enumerate(samples.rows[:8]):
            w.add_file(name, data, mode=0o644, mtime=1.7e9)
    parquet, lz4 = open_shard(path), open_shard(str(tmp_path / "a.lz4shard"))
    pq_members, lz_members = format_for(path).scan(parquet).members, format_for(lz4.path).scan(lz4).members
    for _ in range(3):  # fresh layouts of both kinds, reading alternately
        pq_layout, lz_layout = format_for(path).open_layout(parquet, parquet.size), \
            format_for(lz4.path).open_layout(lz4, lz4.size)
        for m, row in zip(pq_members, samples.rows):
            assert pq_layout.read(m.offset, m.size, parquet.pread) == row[2]
        for m, row in zip(lz_members, samples.rows):
            assert lz_layout.read(m.offset, m.size, lz4.pread) == row[2]


def test_beside_tar_shards_in_one_tree_with_index_reused(samples, sample_tree, tar_shards, mount, tmp_path):
    """Tar shards (train) and the hub's Parquet (validation) in one SRC: one tree; a remount loads
    every index; the uncompressed Parquet is served as stored (the compiled loop's path)."""
    from shardfs.view.dataset import open_dataset

    write_hf(samples, tar_shards, split="validation", shards=1)
    write_codec(samples, tar_shards / "test-zstd.parquet", "zstd")
    want = {**tree_digests(sample_tree), **{f"validation/{k}": v for k, v in tree_digests(sample_tree / "train").items()},
            **samples.by_row("test")}
    m = mount(tar_shards)  # plain: the tars' members as stored, the dataset files' rows in class folders
    assert tree_digests(m.path) == want
    check_imagefolder(m.path, "validation", samples.classes, samples.rows)
    assert m.stats()["indexes_built"] == 6
    assert shardfs_cmd("umount", m.path).returncode == 0
    again = mount(tar_shards, name="again")
    assert again.stats()["indexes_built"] == 0
    assert tree_digests(again.path) == want
    ds = open_dataset([str(tar_shards)])
    stored = dict(zip((os.path.basename(s.path) for s in ds.shards), ds.as_stored().tolist()))
    assert stored["validation-00000-of-00001.parquet"] and not stored["test-zstd.parquet"]
    assert stored["train-000000.tar"]


def test_ls_index_verify_on_dataset_files(samples, tmp_path):
    write_course_h5(samples, tmp_path / "ImageNet.h5", splits=("val",))
    write_codec(samples, tmp_path / "train.parquet", "gzip")
    done = shardfs_cmd("index", str(tmp_path), check=True)
    assert "2 indexes built" in done.stdout
    listing = shardfs_cmd("ls", str(tmp_path), "-R", check=True).stdout
    assert "train:\n0\n1\n" in listing and "val/3:\n" in listing
    done = shardfs_cmd("verify", str(tmp_path), "--decode")
    assert done.returncode == 0 and "all good" in done.stdout, done.stdout + done.stderr
    # Files that carry no class names take them from --class-names, label i = line i
    names = tmp_path / "classes.txt"
    names.write_text("".join(f"class{c}\n" for c in range(len(samples.classes))))
    listing = shardfs_cmd("ls", str(tmp_path), "--layout", "imagefolder", "--class-names", str(names), check=True)
    assert listing.stdout.split() == ["train", "val"]
    listing = shardfs_cmd("ls", str(tmp_path), "--path", "val", "--layout", "imagefolder", "--class-names",
                          str(names), check=True)
    assert listing.stdout.split() == [f"class{c}" for c in range(len(samples.classes))]
    # Class names out of sorted order: ImageFolder would number those folders otherwise; counted
    datasets = pytest.importorskip("datasets")
    names = list(reversed(samples.classes))
    rows = samples.rows[:12] + samples.rows[-12:]  # the first and last class: labels 0 and 5
    datasets.Dataset.from_dict({"image": [{"bytes": d, "path": n} for _, n, d in rows],
                                "label": [label for label, _, _ in rows]},
                               features=datasets.Features({"image": datasets.Image(),
                                                           "label": datasets.ClassLabel(names=names)})
                               ).to_parquet(str(tmp_path / "test-00000-of-00001.parquet"))
    listing = shardfs_cmd("ls", str(tmp_path), "--path", "test", check=True)
    assert listing.stdout.split() == [names[5], names[0]]
    assert "dataset files: 24 of " in listing.stderr and "ImageFolder class index other than" in listing.stderr


# --------------------------------------------------------------------------- damage and refusals


def test_a_truncated_file_serves_what_precedes_the_damage_and_the_rest_mounts(samples, mount, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write_course_arrow(samples, src / "ImageNet-train.arrow")
    write_course_h5(samples, src / "ImageNet.h5", splits=("val",))
    whole = (src / "ImageNet-train.arrow").read_bytes()
    (src / "ImageNet-train.arrow").write_bytes(whole[: len(whole) // 2])
    write_codec(samples, tmp_path / "whole.parquet", "snappy")
    (src / "test.parquet").write_bytes((tmp_path / "whole.parquet").read_bytes()[:-100])  # no footer
    m = mount(src)
    log = m.log()
    assert "ImageNet-train.arrow: truncated" in log and "test.parquet" in log
    served = tree_digests(m.path)
    train = {k: v for k, v in served.items() if k.startswith("train/")}
    assert 0 < len(train) < len(samples.rows)
    assert all(samples.by_row()[k] == v for k, v in train.items())  # what precedes the cut, exactly
    assert {k: v for k, v in served.items() if k.startswith("val/")} == samples.by_row("val")
    assert not any(k.startswith("test/") for k in served)


@pytest.mark.parametrize("codec, options", [("gzip", {}), ("snappy", {"write_page_checksum": True})])
def test_a_corrupt_page_answers_eio_for_its_images_only(codec, options, samples, mount, tmp_path):
    """A page damaged after its index was built: its images answer EIO, with a log line; every
    other image is served. What tells: gzip's own CRC; a snappy page's Parquet checksum (snappy
    alone keeps incompressible bytes as literals, unchecked: pyarrow would return them too)."""
    from shardfs.formats import format_for
    from shardfs.formats.parquet import VIRTUAL, read_header
    from shardfs.storage import open_shard

    src = tmp_path / "src"
    src.mkdir()
    path = src / "train.parquet"
    write_codec(samples, path, codec, **options)
    shardfs_cmd("index", str(src), check=True)
    shard = open_shard(str(path))
    members = format_for(str(path)).scan(shard).members
    page_of = [(m.offset & ~VIRTUAL) >> 26 for m in members]  # the page header's offset (parquet.virtual)
    page_at = page_of[30]
    in_page = [i for i, at in enumerate(page_of) if at == page_at]
    _, body_at = read_header(shard.pread, page_at, shard.size)
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    for k in range(body_at + 10, body_at + 30):  # inside the page's compressed body
        data[k] ^= 0x5A
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the index still counts as current
    m = mount(src)
    want = samples.by_row()
    width = len(str(len(samples.rows) - 1))
    bad = {f"train/{samples.rows[i][0]}/{i:0{width}d}.jpg" for i in in_page}
    for rel, digest in want.items():
        if rel in bad:
            with pytest.raises(OSError) as err:
                with open(os.path.join(m.path, rel), "rb") as f:
                    f.read()
            assert err.value.errno == 5
        else:
            with open(os.path.join(m.path, rel), "rb") as f:
                assert sha(f.read()) == digest
    assert f"page at {page_at}" in m.log()


def test_a_file_without_image_and_label_columns_is_refused_naming_its_columns(samples, mount, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write_codec(samples, src / "train.parquet", "snappy")
    data = [d for _, _, d in samples.rows]
    pq.write_table(pa.table({"pixels": pa.array(data, pa.binary()), "thumb": pa.array(data, pa.binary()),
                             "cls": pa.array([label for label, _, _ in samples.rows], pa.int8()),
                             "score": pa.array([0.5] * len(data))}), str(src / "val.parquet"))
    done = mount(src, expect_ok=False)
    assert done.returncode != 0
    first = done.stderr.splitlines()[0]  # the daemon's one line (then the mount says the daemon exited)
    assert first.startswith("shardfs: val.parquet: no image and label columns; it has pixels, thumb, cls, score")
    # Named, the columns are used (as -o, as on an fstab line); train.parquet has no `pixels`: refused then
    os.unlink(src / "train.parquet")
    m = mount(src, options=("-o", "cache_size=64M,columns=image=pixels\\,label=cls"))
    assert tree_digests(m.path) == samples.by_row("val")


def test_a_missing_reader_says_which_package_to_install(samples, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write_codec(samples, src / "train.parquet", "none")
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'pyarrow':\n"
        "            raise ImportError(f'No module named {name!r} (hidden by the test)')\n"
        "sys.meta_path.insert(0, Hide())\n")
    env = {**os.environ, "PYTHONPATH": str(blocker)}
    (tmp_path / "mnt").mkdir()
    done = shardfs_cmd("mount", str(src), str(tmp_path / "mnt"), env=env)
    assert done.returncode == 2
    assert "train.parquet: reading it needs pyarrow: pip install 'shardfs[formats]'" in done.stderr
    assert not os.path.ismount(tmp_path / "mnt")


@pytest.mark.parametrize("kind", ["course.arrow", "stream.arrow", "snappy.parquet", "none.parquet"])
def test_damaged_bytes_anywhere_are_recorded_never_raised(kind, samples, tmp_path):
    """Bytes flipped at random places (headers, metadata, footers, values): the index build records
    what it could not read and never fails otherwise; every member it keeps lies inside the file."""
    import random

    from shardfs.formats.parquet import _WITHIN_BITS, VIRTUAL
    from shardfs.index import shard_index
    from shardfs.errors import UsageError

    whole = tmp_path / f"whole-{kind}"
    {"course.arrow": write_course_arrow, "stream.arrow": write_stream_arrow,
     "snappy.parquet": lambda s, p: write_codec(s, p, "snappy"),
     "none.parquet": lambda s, p: write_codec(s, p, "none")}[kind](samples, whole)
    data = whole.read_bytes()
    rng, outcomes = random.Random(24), collections.Counter()
    for trial in range(40):
        damaged = bytearray(data)
        for _ in range(rng.choice((1, 4, 32))):
            at = rng.randrange(len(damaged)) if rng.random() < 0.5 else rng.randrange(min(len(damaged), 600))
            damaged[at] = rng.randrange(256) if trial % 2 else damaged[len(damaged) - 1 - at % 600]
        path = tmp_path / f"train-{trial}.{kind.split('.')[1]}"
        path.write_bytes(bytes(damaged))
        try:
            ix = shard_index.build(str(path))
        except UsageError:
            outcomes["refused"] += 1  # the damage renamed a column: refused, naming its columns
            continue
        raw = (ix.offset & VIRTUAL) == 0
        assert (ix.offset[raw] + ix.size[raw] <= len(damaged)).all()
        pages = (ix.offset[~raw] & ~VIRTUAL) >> _WITHIN_BITS  # a decoded page's header: in the file too
        assert (pages < len(damaged)).all()
        outcomes["indexed"] += 1
        outcomes["members checked"] += len(ix.offset)
    # the check above must have run, on members that lie in the file: not every trial refused
    assert outcomes["indexed"] >= 10 and outcomes["members checked"] >= 100, outcomes


# --------------------------------------------------------------------------- remote


@pytest.mark.parametrize("kind", ["s3", "http"])
def test_from_s3_and_http(kind, samples, sample_tree, mount, tmp_path, request, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    files = tmp_path / "files"
    write_hf(samples, files, split="train", shards=1)
    write_course_arrow(samples, files / "ImageNet-val.arrow")
    write_course_h5(samples, files / "ImageNet.h5", splits=("test",))
    write_codec(samples, files / "zstd-validation.parquet", "zstd")
    if kind == "s3":
        bucket, endpoint = request.getfixturevalue("bucket"), request.getfixturevalue("moto_endpoint")
        source, options = bucket.upload_dir(files), ("--option", f"endpoint_url={endpoint}")
    else:
        base, www = request.getfixturevalue("nginx")
        for name in os.listdir(files):
            shutil.copy(files / name, www / name)
        source, options = f"{base}/{{train-00000-of-00001.parquet,ImageNet-val.arrow,ImageNet.h5," \
                          f"zstd-validation.parquet}}", ()
    m = mount(source, options=options)
    want = {**tree_digests(sample_tree), **samples.by_row("val"), **samples.by_row("test"),
            **samples.by_row("validation")}
    assert tree_digests(m.path) == want
    assert m.stats()["read_errors"] == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
