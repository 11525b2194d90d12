"""Remote shards, end to end: S3 (moto's server) and HTTP (nginx), real mounts, real JPEGs.

Every test runs against both stores. Failures are injected by a TCP proxy between the
daemon and the store (503s, connections cut mid-body), or by changing the store under a
live mount (an object overwritten, an object deleted).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest

from conftest import (DEADLINE, drop_page_cache, force_unmount, needs_fuse, read_concurrently, read_in_background,
                      read_or_none, shardfs_cmd, wait_for)
from remote_servers import (  # noqa: F401 (fixtures)
    ACCESS_KEY, SECRET_KEY, aws_env, bucket, digest, moto_endpoint, nginx, nginx_without_etag, proxy, tree_digests,
)

pytestmark = needs_fuse
SHARDS = [f"train-{i:06d}.tar" for i in range(4)]  # what the tar_shards fixture writes


class Store:
    """One dataset of shards in one store, and how to change it behind a mount's back."""

    kind: str

    def source(self, port: int | None = None) -> str: ...

    def options(self, port: int | None = None) -> tuple[str, ...]:
        return ()

    def put(self, name: str, data: bytes) -> None: ...

    def delete(self, name: str) -> None: ...

    def upstream_port(self) -> int: ...


class S3Store(Store):
    kind = "s3"

    def __init__(self, bucket, endpoint, shards):
        self.bucket, self.endpoint = bucket, endpoint
        self.url = bucket.upload_dir(shards)

    def source(self, port=None):
        return self.url

    def options(self, port=None):
        endpoint = f"http://127.0.0.1:{port}" if port else self.endpoint
        return ("--option", f"endpoint_url={endpoint}")

    def put(self, name, data):
        self.bucket.put("ds/" + name, data)

    def delete(self, name):
        self.bucket.delete("ds/" + name)

    def upstream_port(self):
        return int(self.endpoint.rsplit(":", 1)[1])


class HTTPStore(Store):
    kind = "http"

    def __init__(self, base, www, shards):
        self.base, self.www = base, www
        for name in os.listdir(shards):
            shutil.copy(shards / name, www / name)

    def source(self, port=None):
        base = f"http://127.0.0.1:{port}" if port else self.base
        return f"{base}/train-{{000000..000003}}.tar"  # WebDataset's brace notation

    def put(self, name, data):
        path = self.www / name
        old = os.stat(path).st_mtime if path.exists() else 0
        path.write_bytes(data)
        os.utime(path, (old + 10, old + 10))  # a new Last-Modified, so a new ETag even at the same size

    def delete(self, name):
        (self.www / name).unlink()

    def upstream_port(self):
        return int(self.base.rsplit(":", 1)[1])


@pytest.fixture(params=["s3", "http"])
def store(request, tar_shards, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if request.param == "s3":
        return S3Store(request.getfixturevalue("bucket"), request.getfixturevalue("moto_endpoint"), tar_shards)
    base, www = request.getfixturevalue("nginx")
    return HTTPStore(base, www, tar_shards)


def index_cache(tmp_path):
    folder = tmp_path / "cache" / "shardfs"
    return sorted(p.name for p in folder.glob("*.shardfs-idx")) if folder.exists() else []


def members(tmp_path, shard: str) -> list[str]:
    """The JPEGs of one of the tar_shards fixture's shards."""
    listing = subprocess.run(["tar", "-tf", str(tmp_path / "shards" / shard)], capture_output=True, text=True)
    return [name for name in listing.stdout.split() if name.endswith(".JPEG")]


def _read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_imagefolder_epoch_and_every_byte(store, sample_tree, mount):
    datasets = pytest.importorskip("torchvision.datasets")
    torch = pytest.importorskip("torch")
    transforms = pytest.importorskip("torchvision.transforms")
    m = mount(store.source(), options=store.options())
    assert tree_digests(m.path) == tree_digests(sample_tree)
    ds = datasets.ImageFolder(os.path.join(m.path, "train"), transform=transforms.ToTensor())
    theirs = datasets.ImageFolder(str(sample_tree / "train"))
    assert ds.classes == theirs.classes and len(ds) == len(theirs) == 72
    seen = 0
    for images, targets in torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2):
        assert images.shape[1:] == (3, 64, 64)
        seen += len(targets)
    assert seen == 72
    stats = m.stats()
    assert stats["read_errors"] == 0 and stats["shards"] == 4
    assert stats["remote"]["failed"] == 0 and stats["cache"]["shards_cached"] == 4
    # the index was built by streaming each shard in large reads, not one GET per tar header
    assert stats["remote"]["requests"] < 4 * 6


def test_index_is_kept_in_the_local_cache_and_reused(store, mount, tmp_path):
    m = mount(store.source(), options=store.options())
    assert m.stats()["indexes_built"] == 4
    assert len(index_cache(tmp_path)) == 4
    assert shardfs_cmd("umount", m.path).returncode == 0
    m2 = mount(store.source(), options=store.options(), name="again")
    assert m2.stats()["indexes_built"] == 0
    # an object that changed (same size, other bytes) invalidates its index
    data = bytearray((tmp_path / "shards" / SHARDS[1]).read_bytes())
    data[2000] ^= 0xFF
    store.put(SHARDS[1], bytes(data))
    assert shardfs_cmd("umount", m2.path).returncode == 0
    m3 = mount(store.source(), options=store.options(), name="third")
    assert m3.stats()["indexes_built"] == 1


def _upload_local_indexes(store, tar_shards):
    shardfs_cmd("index", str(tar_shards), check=True)  # writes train-*.tar.shardfs-idx beside them
    for name in SHARDS:
        store.put(name + ".shardfs-idx", (tar_shards / (name + ".shardfs-idx")).read_bytes())


def test_index_uploaded_beside_the_shards_is_used(store, tar_shards, mount, tmp_path):
    _upload_local_indexes(store, tar_shards)
    m = mount(store.source(), options=store.options())
    assert m.stats()["indexes_built"] == 0  # checked by their fingerprints, not rebuilt
    assert "does not describe" not in m.log()
    assert len(index_cache(tmp_path)) == 4  # copied into the local cache for the next mount
    assert _read(os.path.join(m.path, "train/n00000003/n00000003_7.JPEG"))
    assert shardfs_cmd("umount", m.path).returncode == 0
    # cached with the objects' ETags: the next mount trusts them without reading a byte
    again = mount(store.source(), options=store.options(), name="again").stats()
    assert again["indexes_built"] == 0 and again["remote"]["bytes"] == 0


def _repacked(shard) -> bytes:
    """The shard's members in reverse order, written as it was: the same size, other bytes
    at every offset (a dataset packed again with another seed)."""
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(shard) as src, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst:
        for info in reversed(src.getmembers()):
            dst.addfile(info, src.extractfile(info))
    return out.getvalue()


def test_a_stale_index_beside_repacked_shards_is_rebuilt_never_serves_wrong_bytes(store, tar_shards, sample_tree,
                                                                                   mount, tmp_path):
    _upload_local_indexes(store, tar_shards)  # indexes of the first packing...
    repacked = _repacked(tar_shards / SHARDS[1])
    assert len(repacked) == (tar_shards / SHARDS[1]).stat().st_size
    store.put(SHARDS[1], repacked)  # ...uploaded with a shard packed again: same name, same size
    m = mount(store.source(), options=store.options())
    assert tree_digests(m.path) == tree_digests(sample_tree)
    assert m.stats()["indexes_built"] == 1  # that shard's; the other three indexes are used
    log = m.log()
    assert f"{SHARDS[1]}.shardfs-idx does not describe" in log and "fingerprint differs" in log


def test_an_index_without_a_fingerprint_is_rebuilt(store, tar_shards, mount, tmp_path):
    from shardfs.index import index_file

    _upload_local_indexes(store, tar_shards)
    ix = index_file.load(str(tar_shards / (SHARDS[2] + ".shardfs-idx")))
    ix.shard_fingerprint = ""  # as an older shardfs wrote it
    index_file.save(ix, str(tmp_path / "old.shardfs-idx"))
    store.put(SHARDS[2] + ".shardfs-idx", (tmp_path / "old.shardfs-idx").read_bytes())
    m = mount(store.source(), options=store.options())
    assert m.stats()["indexes_built"] == 1
    assert "no fingerprint to check it by" in m.log()


def test_transient_failures_are_retried_and_never_give_wrong_bytes(store, sample_tree, mount, proxy, tmp_path):
    p = proxy(store.upstream_port())
    m = mount(store.source(p.port), options=(*store.options(p.port), "--cache-size", "1G"))
    p.arm(fail=3)  # the next three connections answer 503
    for rel in members(tmp_path, SHARDS[0]) + members(tmp_path, SHARDS[1]):
        assert digest(os.path.join(m.path, rel)) == digest(sample_tree / rel)
    # then three connections are cut 20 KB into their response (the shards are 90-100 KB)
    p.arm(cuts=3, cut_after=20_000)
    assert tree_digests(m.path) == tree_digests(sample_tree)
    assert p.failed == 3 and p.cut >= 1
    log = m.log()
    assert "HTTP 503" in log and "retry 1 of" in log
    stats = m.stats()
    assert stats["read_errors"] == 0 and stats["remote"]["retries"] >= 4 and stats["shards_broken"] == 0


def test_an_overwritten_object_answers_eio_never_new_bytes(store, sample_tree, mount, tmp_path):
    m = mount(store.source(), options=(*store.options(), "--cache-size", "1G"))
    first = members(tmp_path, SHARDS[0])[0]  # read (and cached) before
    assert _read(os.path.join(m.path, first)) == (sample_tree / first).read_bytes()
    data = bytearray((tmp_path / "shards" / SHARDS[1]).read_bytes())
    for i in range(1024, len(data) - 1024, 512):  # same size, other bytes everywhere
        data[i] ^= 0x5A
    store.put(SHARDS[1], bytes(data))
    for _ in range(2):
        for rel in members(tmp_path, SHARDS[1]):
            with pytest.raises(OSError) as exc:
                _read(os.path.join(m.path, rel))
            assert exc.value.errno == errno.EIO
    assert _read(os.path.join(m.path, first)) == (sample_tree / first).read_bytes()  # untouched shards serve
    log = m.log()
    assert log.count(f"{SHARDS[1]}: GET") == 1 and "its files now answer EIO" in log
    assert "412" in log or "changed" in log
    assert m.stats()["shards_broken"] == 1


def test_a_deleted_object_answers_eio_logged_once(store, mount, tmp_path):
    m = mount(store.source(), options=store.options())
    store.delete(SHARDS[2])
    for rel in members(tmp_path, SHARDS[2]) * 2:
        with pytest.raises(OSError) as exc:
            _read(os.path.join(m.path, rel))
        assert exc.value.errno == errno.EIO
    log = m.log()
    assert log.count("not found") == 1 and log.count("its files now answer EIO") == 1
    assert "retry" not in log  # a 404 is permanent: not retried


def test_credentials_never_appear_in_logs_status_or_stats(bucket, tar_shards, moto_endpoint, mount, tmp_path,
                                                         monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    url = bucket.upload_dir(tar_shards)
    creds = ("--option", f"key={ACCESS_KEY}", "--option", f"secret={SECRET_KEY}",
             "--option", f"endpoint_url={moto_endpoint}")
    m = mount(url, options=(*creds, "--log-level", "debug"))
    assert _read(os.path.join(m.path, members(tmp_path, SHARDS[0])[0]))
    bucket.delete("ds/" + SHARDS[3])  # an error to log, with its request
    with pytest.raises(OSError):
        _read(os.path.join(m.path, members(tmp_path, SHARDS[3])[0]))
    status = shardfs_cmd("status", m.path, "--json").stdout
    stats = os.getxattr(m.path, "user.shardfs.stats").decode()
    with open("/proc/self/mounts") as f:
        mounts = f.read()
    with open(f"/proc/{m.pid}/cmdline", "rb") as f:
        cmdline = f.read().decode(errors="replace")
    bad = shardfs_cmd("mount", f"s3://{bucket.name}/nothing-here/", str(tmp_path), *creds)
    wrong = shardfs_cmd("ls", url, "--option", f"endpoint_url={moto_endpoint}", "--option", f"token={SECRET_KEY}",
                        "--option", "key=x=1")
    assert bad.returncode != 0 and "nothing-here" in bad.stderr
    everywhere = "\n".join([m.log(), m.output, status, stats, mounts, cmdline, bad.stdout, bad.stderr,
                            wrong.stdout, wrong.stderr])
    assert "not found" in m.log() and "shards" in status
    assert SECRET_KEY not in everywhere and ACCESS_KEY not in everywhere


def test_storage_options_in_a_config_file_and_as_fstab_options(bucket, tar_shards, moto_endpoint, mount, tmp_path):
    url = bucket.upload_dir(tar_shards)
    m = mount(url, options=("-o", f"ro,storage_options.endpoint_url={moto_endpoint},loaders=3"))
    assert m.stats()["files"] == 72
    conf = tmp_path / "m.toml"
    conf.write_text(f'sources = ["{url}"]\nmountpoint = "{tmp_path / "viaconf"}"\n'
                    f'log_file = "{tmp_path / "conf.log"}"\n[storage_options]\nendpoint_url = "{moto_endpoint}"\n')
    (tmp_path / "viaconf").mkdir()
    done = shardfs_cmd("mount", "--config", str(conf))
    try:
        assert done.returncode == 0, done.stderr
        assert len(os.listdir(tmp_path / "viaconf" / "train")) == 6
    finally:
        if shardfs_cmd("umount", str(tmp_path / "viaconf")).returncode != 0:
            force_unmount(str(tmp_path / "viaconf"))


def test_lz4_shards_and_shardfs_index_on_s3(bucket, sample_tree, tar_shards, moto_endpoint, mount, tmp_path):
    from benchlib import sample
    from shardfs.formats.lz4shard import Lz4ShardWriter

    files = sample.files_under(str(sample_tree))
    with Lz4ShardWriter(str(tmp_path / "all.lz4shard"), block_size=64 * 1024) as w:
        for rel in files:
            w.add_file(rel, (sample_tree / rel).read_bytes(), mode=0o644, mtime=1.7e9)
    bucket.put("lz4/all.lz4shard", (tmp_path / "all.lz4shard").read_bytes())
    url = f"s3://{bucket.name}/lz4/"
    done = shardfs_cmd("index", url, "--option", f"endpoint_url={moto_endpoint}", check=True)
    assert "1 indexes built" in done.stdout and len(index_cache(tmp_path)) == 1  # kept locally, keyed by URL
    m = mount(url, options=("--option", f"endpoint_url={moto_endpoint}"))
    assert m.stats()["indexes_built"] == 0
    assert tree_digests(m.path) == tree_digests(sample_tree)
    assert os.getxattr(os.path.join(m.path, files[0]), "user.shardfs.format") == b"lz4"


def test_zip_squashfs_and_compressed_tar_on_s3_as_one_tree(bucket, sample_tree, moto_endpoint, mount, tmp_path):
    """The archives users already have, as objects: a zip (Info-ZIP, JPEGs stored), a SquashFS image
    (mksquashfs, zstd) and a .tar.gz, each holding a third of the files, mounted from one prefix as
    one tree, every byte the source's."""
    from benchlib import sample

    files = sample.files_under(str(sample_tree))
    parts = [tmp_path / f"part{i}" for i in range(3)]
    for i, rel in enumerate(files):
        dest = parts[i % 3] / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(sample_tree / rel, dest)
    out = tmp_path / "arch"
    out.mkdir()
    subprocess.run(["zip", "-q", "-r", "-n", ".jpg", str(out / "a.zip"), "."], cwd=parts[0], check=True)
    subprocess.run(["mksquashfs", str(parts[1]), str(out / "b.sqfs"), "-comp", "zstd", "-no-xattrs", "-quiet"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["tar", "-C", str(parts[2]), "-czf", str(out / "c.tar.gz"), "."], check=True)
    url = bucket.upload_dir(out, "arch/")
    m = mount(url, options=("--option", f"endpoint_url={moto_endpoint}"))
    assert m.stats()["problems"] == 0 and m.stats()["shards"] == 3
    assert tree_digests(m.path) == tree_digests(sample_tree)
    assert [os.getxattr(os.path.join(m.path, files[i]), "user.shardfs.format") for i in range(3)] == [
        b"zip", b"squashfs", b"ctar"]


def test_sighup_picks_up_added_objects_and_changed_ones_answer_eio(bucket, moto_endpoint, mount):
    from tarcraft import archive, member

    bucket.put("r/a.tar", archive(member(b"cls/a.txt", b"from a\n")))
    bucket.put("r/b.tar", archive(member(b"cls/b.txt", b"from b\n")))
    m = mount(f"s3://{bucket.name}/r/", options=("--option", f"endpoint_url={moto_endpoint}"))
    assert sorted(os.listdir(os.path.join(m.path, "cls"))) == ["a.txt", "b.txt"]
    bucket.put("r/c.tar", archive(member(b"cls/c.txt", b"from c\n")))
    bucket.put("r/b.tar", archive(member(b"cls/b.txt", b"BOOM b\n")))
    m.rescan()
    assert (m.stats()["shards"], m.stats()["shards_broken"]) == (3, 1)
    assert _read(os.path.join(m.path, "cls", "c.txt")) == b"from c\n"
    assert _read(os.path.join(m.path, "cls", "a.txt")) == b"from a\n"
    with pytest.raises(OSError) as exc:
        _read(os.path.join(m.path, "cls", "b.txt"))
    assert exc.value.errno == errno.EIO


def test_brace_urls_on_s3_and_an_http_directory_listing(bucket, tar_shards, sample_tree, moto_endpoint, nginx,
                                                        mount):
    bucket.upload_dir(tar_shards)
    m = mount(f"s3://{bucket.name}/ds/train-{{000000..000003}}.tar",
              options=("--option", f"endpoint_url={moto_endpoint}"))
    assert tree_digests(m.path) == tree_digests(sample_tree)
    base, www = nginx
    for name in SHARDS:
        shutil.copy(tar_shards / name, www / name)
    (www / "notes.txt").write_text("not a shard\n")
    listed = shardfs_cmd("ls", base + "/", "train/n00000002", check=True)
    assert len(listed.stdout.split()) == 12


def test_credentials_and_endpoint_from_aws_config_files(bucket, tar_shards, moto_endpoint, mount, tmp_path,
                                                        monkeypatch):
    url = bucket.upload_dir(tar_shards)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    (tmp_path / "aws-credentials").write_text(
        f"[default]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n")
    (tmp_path / "aws-config").write_text(f"[default]\nregion = us-east-1\nendpoint_url = {moto_endpoint}\n")
    m = mount(url)  # no --option: what the AWS tools read is enough
    assert m.stats()["files"] == 72
    (tmp_path / "aws-credentials").unlink()
    done = mount(url, name="nocreds", expect_ok=False)
    assert done.returncode != 0 and "credentials" in done.stderr.lower()


def test_http_server_without_etag_is_checked_by_last_modified(nginx_without_etag, tar_shards, sample_tree, mount,
                                                             tmp_path):
    base, www = nginx_without_etag
    store = HTTPStore(base, www, tar_shards)
    m = mount(store.source(), options=("--cache-size", "1G"))
    first = members(tmp_path, SHARDS[0])[0]
    assert _read(os.path.join(m.path, first)) == (sample_tree / first).read_bytes()
    data = bytearray((tmp_path / "shards" / SHARDS[3]).read_bytes())
    data[3000] ^= 0xFF
    store.put(SHARDS[3], bytes(data))  # same size, a later Last-Modified
    with pytest.raises(OSError) as exc:
        _read(os.path.join(m.path, members(tmp_path, SHARDS[3])[0]))
    assert exc.value.errno == errno.EIO
    assert "412" in m.log()


def test_a_store_down_for_longer_than_the_retries_gives_eio_then_recovers(nginx, tar_shards, sample_tree, mount,
                                                                          proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDFS_REMOTE_RETRIES", "2")
    base, www = nginx
    store = HTTPStore(base, www, tar_shards)
    p = proxy(store.upstream_port())
    m = mount(store.source(p.port), options=("--cache-size", "1G"))
    p.arm(fail=1000)  # every connection answers 503 until disarmed
    rel = members(tmp_path, SHARDS[2])[0]
    with pytest.raises(OSError) as exc:
        _read(os.path.join(m.path, rel))
    assert exc.value.errno == errno.EIO
    assert "gave up after 2 attempts" in m.log()
    p.arm()  # the store is back: the next read of the same file gets its bytes
    assert _read(os.path.join(m.path, rel)) == (sample_tree / rel).read_bytes()
    assert tree_digests(m.path) == tree_digests(sample_tree)
    assert m.stats()["shards_broken"] == 0


STORAGE_TIMEOUT = "5"  # SHARDFS_STORAGE_TIMEOUT in the outage tests (30 s by default)


def test_a_store_that_stops_answering_holds_storage_reads_not_fuse_workers(store, sample_tree, mount, proxy,
                                                                          tmp_path, monkeypatch):
    """Reads waiting on a store that takes connections and never answers hold storage threads,
    not the FUSE workers. They wait as long as the outage lasts here (a timeout and retries far
    beyond the test), so the rest of the tree must answer while they are provably waiting."""
    import threading

    monkeypatch.setenv("SHARDFS_STORAGE_TIMEOUT", "3600")
    monkeypatch.setenv("SHARDFS_REMOTE_RETRIES", "1000")
    p = proxy(store.upstream_port())
    m = mount(store.source(p.port), options=(*store.options(p.port), "--cache-size", "1G"))
    cached = members(tmp_path, SHARDS[0])
    for rel in cached:
        assert digest(os.path.join(m.path, rel)) == digest(sample_tree / rel)
    wait_for(lambda: m.stats()["cache"]["shards_cached"] >= 1, "shard 0 was not cached")
    p.arm(hang=True)  # the store takes connections and never answers
    try:
        names = members(tmp_path, SHARDS[2])[:4]
        threads, results = read_in_background([os.path.join(m.path, rel) for rel in names])
        wait_for(lambda: p.hung >= 1, "no read reached the store")

        def rest_answers():  # cached files, listings and attributes
            for rel in cached:
                drop_page_cache(os.path.join(m.path, rel))
                assert digest(os.path.join(m.path, rel)) == digest(sample_tree / rel)
            assert sorted(os.listdir(os.path.join(m.path, "train"))) == sorted(os.listdir(sample_tree / "train"))
            assert os.stat(os.path.join(m.path, names[0])).st_size == (sample_tree / names[0]).stat().st_size
            checked.set()

        checked = threading.Event()
        threading.Thread(target=rest_answers, daemon=True).start()
        assert checked.wait(DEADLINE), "the rest of the tree waited for the store"
        assert all(t.is_alive() for t in threads) and not results
    finally:
        p.arm()  # the store answers again: the waiting reads get their bytes
    for t in threads:
        t.join(timeout=DEADLINE)
    assert {os.path.relpath(k, m.path): v for k, v in results.items()} == {
        rel: (sample_tree / rel).read_bytes() for rel in names}


def test_a_store_that_stops_answering_gives_eio_in_bounded_time_and_reads_recover(
        store, sample_tree, mount, proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDFS_STORAGE_TIMEOUT", STORAGE_TIMEOUT)
    p = proxy(store.upstream_port())
    m = mount(store.source(p.port), options=(*store.options(p.port), "--cache-size", "1G"))
    for rel in members(tmp_path, SHARDS[0]):
        assert digest(os.path.join(m.path, rel)) == digest(sample_tree / rel)
    wait_for(lambda: m.stats()["cache"]["shards_cached"] >= 1, "shard 0 was not cached")
    p.arm(hang=True)  # the store takes connections and never answers
    try:
        paths = [os.path.join(m.path, rel) for rel in members(tmp_path, SHARDS[2])[:4]]
        assert read_concurrently(paths) == dict.fromkeys(paths, errno.EIO)
        assert p.hung >= 1
        assert f"no answer within {STORAGE_TIMEOUT} s" in m.log()
    finally:
        p.arm()  # the store answers again
    rel = members(tmp_path, SHARDS[2])[0]
    wait_for(lambda: read_or_none(os.path.join(m.path, rel)) == (sample_tree / rel).read_bytes(),
              "reads did not recover")
    assert tree_digests(m.path) == tree_digests(sample_tree)
    assert "answers again" in m.log()
    stats = m.stats()
    assert stats["shards_broken"] == 0
    assert stats["cache"]["shards_cached"] == 4  # what failed in the outage was loaded again after it


def test_a_rescan_during_an_outage_leaves_every_shard_intact(store, sample_tree, mount, proxy, tmp_path,
                                                             monkeypatch):
    monkeypatch.setenv("SHARDFS_STORAGE_TIMEOUT", STORAGE_TIMEOUT)
    p = proxy(store.upstream_port())
    m = mount(store.source(p.port), options=(*store.options(p.port), "--cache-size", "1G"))
    uncached = os.path.join(m.path, members(tmp_path, SHARDS[3])[0])
    postponed = 0
    for fault in ({"fail": 1000}, {"hang": True}):  # a store answering 503, then one not answering at all
        p.arm(**fault)
        if "hang" in fault:  # a read notices first (after the deadline); the rescan then fails at once
            with pytest.raises(OSError):
                _read(uncached)
        m.rescan()
        postponed += 1
        assert m.log().count("still serving the previous view") == postponed
        stats = m.stats()
        assert stats["shards"] == 4 and stats["shards_broken"] == 0
        p.arm()
    # Once a probe finds the store answering again (within seconds), the same files, right bytes.
    wait_for(lambda: read_or_none(uncached) is not None, "reads did not recover")
    assert tree_digests(m.path) == tree_digests(sample_tree)
    m.rescan()  # and a rescan with the store back finds nothing changed
    assert "rescan: " in m.log()
    assert m.stats()["shards_broken"] == 0


def test_verify_reads_remote_shards_and_finds_a_damaged_one(store, tar_shards):
    """`shardfs verify` takes URLs, as mount does: every shard read through the storage layer."""
    good = shardfs_cmd("verify", store.source(), *store.options())
    assert good.returncode == 0, good.stdout + good.stderr
    assert "verified 4 shards" in good.stdout + good.stderr and "all good" in good.stdout + good.stderr
    data = bytearray((tar_shards / SHARDS[1]).read_bytes())
    data[0:100] = b"\x00" * 100  # the first header's name is gone: its checksum no longer agrees
    store.put(SHARDS[1], bytes(data))
    bad = shardfs_cmd("verify", store.source(), *store.options())
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert SHARDS[1] in bad.stdout + bad.stderr
