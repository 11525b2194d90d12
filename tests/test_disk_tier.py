"""The disk tier through real mounts: filled once, reused by later and concurrent mounts, never
wrong bytes (flipped bytes on local disk, a changed shard, a full disk, a daemon killed mid-fill),
remote shards too. Every read is checked by sha256 against the source."""

import contextlib
import errno
import hashlib
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import tarfile
import threading

import pytest

from conftest import needs_fuse, shardfs_cmd, wait_for
from faulty_storage import faulty_mount, held
from remote_servers import aws_env, bucket, moto_endpoint, nginx  # noqa: F401 (fixtures)
from shardfs.service.mount import process_alive
from shardfs.storage.placement import is_local_disk
from shardfs.storage.disk import FILL_RUN
from shardfs.storage.tierfile import CHUNK, TierFile, read_header

pytestmark = needs_fuse

SMALL_RAM = "1M"  # no shard fits: members are read through the tier, which fills in the background
BIG_RAM = "256M"  # every shard fits: the RAM loaders fill RAM and the tier in one pass


def write_shards(out, seed: int = 7, shards: int = 4, members: int = 12, largest: int = 1_500_000,
                 first: int = 0) -> dict:
    """Tar shards part-<first>.tar... of random members; returns {member: sha256}."""
    rng = random.Random(seed)
    out.mkdir(exist_ok=True)
    digests = {}
    for s in range(first, first + shards):
        with tarfile.open(out / f"part-{s:02d}.tar", "w") as tf:
            for i in range(members):
                data = rng.randbytes(rng.randrange(10_000, largest))
                info = tarfile.TarInfo(f"c{i % 3}/f{s}_{i}.bin")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
                digests[info.name] = hashlib.sha256(data).hexdigest()
    return digests


@pytest.fixture
def shards(tmp_path):
    out = tmp_path / "shards"
    digests = write_shards(out)
    return out, digests, tar_bytes(out)


def tar_bytes(folder) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.tar"))  # not the indexes beside them


def read_all(root, digests, seed: int = 0) -> None:
    names = sorted(digests)
    random.Random(seed).shuffle(names)
    for name in names:
        with open(os.path.join(root, name), "rb", buffering=0) as f:
            assert hashlib.sha256(f.read()).hexdigest() == digests[name], name
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def read_uncached(root, name) -> bytes:
    """The file's bytes through the mount, none from the kernel's page cache."""
    with open(os.path.join(root, name), "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        return f.read()


def cached(tier) -> list[dict]:
    return json.loads(shardfs_cmd("cache", "ls", str(tier), "--json", check=True).stdout)


def wait_filled(tier, total: int) -> None:
    wait_for(lambda: sum(c["filled"] for c in cached(tier)) >= total, lambda: cached(tier))


@contextlib.contextmanager
def hanging_storage(tmp_path, src, name: str, flag, start: int = 0):
    """``src`` behind faultyfs, whose reads of shard ``name`` from byte ``start`` on block while
    ``flag`` exists, as on a busy or hung network filesystem. Yields the mountpoint."""
    mnt = tmp_path / "storage"
    with faulty_mount(src, mnt, name, start, 1 << 40, hang_while=flag):
        yield mnt


def storage_bytes(m) -> int:
    return m.stats()["cache"]["storage_bytes_read"]


def options(tier, ram: str, *more: str) -> tuple[str, ...]:
    return ("--disk-cache", str(tier), "--cache-size", ram, *more)


def mount_and_fill(mount, source, tier, ram: str, digests: dict, total: int, *more: str):
    """A mount with a disk tier, every file read (and checked) once, the tier filled."""
    m = mount(source, options=options(tier, ram, *more))
    read_all(m.path, digests)
    wait_filled(tier, total)
    return m


@pytest.mark.parametrize("ram", [SMALL_RAM, BIG_RAM])
def test_filled_once_then_a_second_mount_reads_nothing_from_storage(shards, mount, tmp_path, ram):
    src, digests, total = shards
    tier = tmp_path / "tier"
    m = mount_and_fill(mount, src, tier, ram, digests, total)
    first = m.stats()
    assert first["cache"]["storage_bytes_read"] <= 1.05 * total
    assert first["disk"]["bytes_written"] == total and first["disk"]["shards"] == 4
    assert oct(os.stat(tier).st_mode & 0o777) == "0o700"
    assert [oct(os.stat(c["path"]).st_mode & 0o777) for c in cached(tier)] == ["0o600"] * 4
    assert shardfs_cmd("umount", m.path).returncode == 0

    again = mount(src, options=options(tier, ram), name="again")
    read_all(again.path, digests, seed=1)
    read_all(again.path, digests, seed=2)  # a second epoch: RAM or the tier, never storage
    second = again.stats()
    assert second["cache"]["storage_bytes_read"] == 0
    assert second["disk"]["hits"] > 0 and second["disk"]["bytes_written"] == 0
    assert re.search(r"^disk\s.*held_bytes=\d+.*hits=\d+", shardfs_cmd("stats", again.path, check=True).stdout, re.M)
    assert "disk tier" in shardfs_cmd("stats", again.path, "--watch", "--count", "1", check=True).stdout
    metrics = shardfs_cmd("stats", again.path, "--format", "prometheus", check=True).stdout
    assert re.search(r"^shardfs_disk_hits_total\{.*\} [1-9]", metrics, re.M) and "shardfs_disk_bytes{" in metrics


def test_two_daemons_share_one_directory_at_once(shards, mount, tmp_path):
    src, digests, total = shards
    tier = tmp_path / "tier"
    ms = [mount(src, options=options(tier, ram), name=f"mnt{i}") for i, ram in enumerate([BIG_RAM, SMALL_RAM])]
    errors = []

    def reader(root, seed):
        try:
            read_all(root, digests, seed)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(m.path, i)) for i, m in enumerate(ms)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    wait_filled(tier, total)
    fetched = sum(storage_bytes(m) for m in ms)
    assert fetched <= 1.1 * total, (fetched, total)  # one pass between both, a few chunks of margin
    assert len(cached(tier)) == 4
    held = [c for c in cached(tier) if c["in_use"]]
    assert len(held) == 4
    # clear skips what live mounts hold
    assert "4 skipped" in shardfs_cmd("cache", "clear", str(tier), check=True).stdout
    for m in ms:
        read_all(m.path, digests, seed=5)


def flip_byte(cache_file: str, offset_in_shard: int) -> None:
    fd = os.open(cache_file, os.O_RDWR)
    try:
        where = TierFile(fd, cache_file, read_header(fd)).data_at + offset_in_shard
        byte = os.pread(fd, 1, where)
        os.pwrite(fd, bytes([byte[0] ^ 0x40]), where)
    finally:
        os.close(fd)


@pytest.mark.parametrize("ram", [SMALL_RAM, BIG_RAM])
def test_a_flipped_byte_on_local_disk_is_read_again_from_storage(shards, mount, tmp_path, ram):
    src, digests, total = shards
    tier = tmp_path / "tier"
    m = mount_and_fill(mount, src, tier, ram, digests, total)
    assert shardfs_cmd("umount", m.path).returncode == 0
    victim = next(c for c in cached(tier) if c["source"].endswith("part-01.tar"))
    flip_byte(victim["path"], 700_000)  # inside the first chunk, past the first member's header

    again = mount(src, options=options(tier, ram), name="again")
    read_all(again.path, digests, seed=3)
    disk = again.stats()["disk"]
    assert disk["checksum_failures"] == 1
    assert 0 < storage_bytes(again) <= 1 << 20  # that chunk, and only it, from storage
    assert "failed its checksum in the disk tier" in again.log()
    assert shardfs_cmd("umount", again.path).returncode == 0
    third = mount(src, options=options(tier, ram), name="third")  # the chunk was written again, good
    read_all(third.path, digests, seed=4)
    assert storage_bytes(third) == 0 and third.stats()["disk"]["checksum_failures"] == 0


def test_a_changed_shard_is_dropped_from_the_tier(shards, mount, tmp_path):
    src, digests, total = shards
    tier = tmp_path / "tier"
    m = mount_and_fill(mount, src, tier, SMALL_RAM, digests, total)
    assert shardfs_cmd("umount", m.path).returncode == 0
    old = {c["source"]: c for c in cached(tier)}

    fresh = write_shards(tmp_path / "fresh", seed=99, shards=1, members=8, first=2)
    changed = src / "part-02.tar"
    os.replace(tmp_path / "fresh" / "part-02.tar", changed)
    digests = {k: v for k, v in digests.items() if not k.split("/")[1].startswith("f2_")}
    digests.update(fresh)

    again = mount(src, options=options(tier, SMALL_RAM), name="again")
    read_all(again.path, digests, seed=6)
    assert storage_bytes(again) <= 1.05 * changed.stat().st_size  # the others came from the tier
    wait_filled(tier, tar_bytes(src))
    now = {c["source"]: c for c in cached(tier)}
    assert now[str(changed)]["size"] == changed.stat().st_size != old[str(changed)]["size"]
    assert len(now) == 4


def two_shards_in_the_tier(tmp_path, mount):
    """Two small shards (RAM refuses them), mounted, every file read once and the tier filled."""
    src = tmp_path / "shards"
    first = write_shards(src, seed=1, shards=2, members=6)
    tier = tmp_path / "tier"
    m = mount(src, options=options(tier, SMALL_RAM))
    read_all(m.path, first)
    wait_filled(tier, tar_bytes(src))
    return src, first, tier, m


def test_rewritten_in_place_with_the_same_names(tmp_path, mount):
    """A shard rewritten with other bytes under the same member names: the tier must not serve old bytes."""
    src, first, tier, m = two_shards_in_the_tier(tmp_path, mount)
    assert shardfs_cmd("umount", m.path).returncode == 0
    second = write_shards(src, seed=2, shards=2, members=6)
    assert second != first
    again = mount(src, options=options(tier, SMALL_RAM), name="again")
    read_all(again.path, second)


@pytest.fixture
def small_tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "small"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize("ram", [SMALL_RAM, BIG_RAM])
def test_a_full_local_disk_degrades_to_storage_with_one_log_line(shards, mount, small_tmpfs, ram):
    src, digests, total = shards
    assert total > 3 * 2**20
    m = mount(src, options=options(small_tmpfs / "tier", ram, "--disk-cache-size", "1G"))
    read_all(m.path, digests)
    read_all(m.path, digests, seed=1)
    stats = m.stats()
    assert stats["read_errors"] == 0
    assert stats["disk"]["disabled"]
    assert m.log().count("reading from shared storage only from now on") == 1


def test_restart_during_a_fill_resumes_and_never_trusts_half_written_chunks(tmp_path, mount):
    src = tmp_path / "shards"
    digests = write_shards(src, seed=3, shards=1, members=12, largest=3_000_000)  # ~18 MB, 18 chunks
    total = (src / "part-00.tar").stat().st_size
    tier, flag, source = tmp_path / "tier", tmp_path / "hang", tmp_path / "storage"
    indexes = ("--index-dir", str(tmp_path / "indexes"))  # the storage is read-only
    # The shard's second half hangs while the flag exists: the fill stops there, mid-shard,
    # whatever the machine's speed, and the daemon is killed with the tier partly filled.
    with faulty_mount(src, source, "part-00.tar", total // 2, total, flag):
        shardfs_cmd("index", str(source), *indexes, check=True)  # before the hang: the scan reads it all
        flag.touch()
        m = mount(source, options=options(tier, SMALL_RAM, *indexes))
        name = sorted(digests)[0]  # the first member: in the first half
        with open(os.path.join(m.path, name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digests[name]
        wait_for(lambda: held(flag), "the fill never reached the second half")
        os.kill(m.pid, signal.SIGKILL)
        # Its thread in the hung read exits once the read returns (FUSE lets a request already
        # taken by the server finish): the storage answers in full again from now on, and that
        # thread dies on its way back, before it could store anything.
        os.unlink(flag)
        # auto_unmount: fusermount3 removes the mount once the daemon is gone
        wait_for(lambda: not (process_alive(m.pid) or os.path.ismount(m.path)), "the killed mount stayed")
        filled = sum(c["filled"] for c in cached(tier))
        assert 0 < filled <= total // 2  # killed mid-fill: only chunks before the hang are there

        again = mount(source, options=options(tier, SMALL_RAM, *indexes), name="again")
        read_all(again.path, digests)
        wait_filled(tier, total)
        assert storage_bytes(again) <= total - filled + (2 << 20)  # resumed: what was there is not read again
        assert shardfs_cmd("umount", again.path).returncode == 0
        third = mount(source, options=options(tier, SMALL_RAM, *indexes), name="third")
        read_all(third.path, digests, seed=1)
        assert storage_bytes(third) == 0
        assert shardfs_cmd("umount", third.path).returncode == 0


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_remote_shards_go_through_the_tier(shards, mount, tmp_path, monkeypatch, request, kind):
    src, digests, total = shards
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if kind == "http":
        base, www = request.getfixturevalue("nginx")
        for p in src.iterdir():
            os.link(p, www / p.name)
        source, more = f"{base}/part-{{00..03}}.tar", ()
    else:
        source = request.getfixturevalue("bucket").upload_dir(src)
        more = ("--option", f"endpoint_url={request.getfixturevalue('moto_endpoint')}")
    tier = tmp_path / "tier"
    m = mount_and_fill(mount, source, tier, SMALL_RAM, digests, total, *more)
    assert shardfs_cmd("umount", m.path).returncode == 0

    again = mount(source, options=options(tier, SMALL_RAM, *more), name="again")
    read_all(again.path, digests, seed=1)
    stats = again.stats()
    assert stats["cache"]["storage_bytes_read"] == 0 and stats["remote"]["bytes"] == 0


def test_cache_ls_and_clear(shards, mount, tmp_path):
    src, digests, total = shards
    tier = tmp_path / "tier"
    # (SMALL_RAM: served through the tier, whose files the daemon then holds open; shards kept in
    # RAM as their indexes were built need not reach the tier's files again)
    m = mount_and_fill(mount, src, tier, SMALL_RAM, digests, total)
    listing = shardfs_cmd("cache", "ls", str(tier), check=True).stdout
    assert "4 shards" in listing and listing.count("in use") == 4
    assert shardfs_cmd("umount", m.path).returncode == 0
    assert "idle" in shardfs_cmd("cache", "ls", str(tier), check=True).stdout
    assert shardfs_cmd("cache", "clear", str(tier), check=True).stdout.startswith("4 shards removed")
    assert cached(tier) == []


CHILD = """
import hashlib, json, os, sys
root = os.environ["SHARDFS_MOUNT"]
digests = json.load(open(sys.argv[1]))
for name, want in digests.items():
    with open(os.path.join(root, name), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == want, name
print(json.dumps(json.loads(os.getxattr(root, "user.shardfs.stats"))["disk"]))
"""


def test_shardfs_run_in_a_batch_job_uses_the_jobs_local_scratch(shards, tmp_path):
    src, digests, total = shards
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    if not is_local_disk(str(scratch)):
        pytest.skip(f"{scratch} is not on a local disk filesystem")
    (tmp_path / "digests.json").write_text(json.dumps(digests))
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_TMPDIR", "CACHE_DIRECTORY")}
    env.update(SLURM_JOB_ID="4242", TMPDIR=str(scratch))
    done = shardfs_cmd("run", str(src), "--cache-size", SMALL_RAM, "--", sys.executable, "-c", CHILD,
                       str(tmp_path / "digests.json"), env=env)
    assert done.returncode == 0, done.stderr
    disk = json.loads(done.stdout.strip().splitlines()[-1])
    assert disk["dir"] == str(scratch / f"shardfs-cache-{os.getuid()}") and disk["hits"] + disk["bytes_written"] > 0
    has_tier = ("import os, json; "
                "print('disk' in json.loads(os.getxattr(os.environ['SHARDFS_MOUNT'], 'user.shardfs.stats')))")
    done = shardfs_cmd("run", str(src), "--disk-cache", "off", "--", sys.executable, "-c", has_tier, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
    env.pop("SLURM_JOB_ID")  # not a batch job: no tier unless asked for
    done = shardfs_cmd("run", str(src), "--", sys.executable, "-c", has_tier, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_python_api_takes_the_disk_tier_options(shards, tmp_path):
    import shardfs

    src, digests, total = shards
    with shardfs.mounted(src, disk_cache=tmp_path / "tier", disk_cache_size="1G", cache_size=SMALL_RAM) as root:
        read_all(root, digests)
        disk = json.loads(os.getxattr(root, "user.shardfs.stats"))["disk"]
    assert disk["dir"] == str(tmp_path / "tier") and disk["bound_bytes"] == 1 << 30


def test_a_tier_smaller_than_the_dataset_stays_bounded_and_never_thrashes(shards, mount, tmp_path):
    src, digests, total = shards
    tier = tmp_path / "tier"
    bound = total // 2
    m = mount(src, options=options(tier, SMALL_RAM, "--disk-cache-size", str(bound)))
    read_all(m.path, digests)
    kept = sum(c["size"] for c in cached(tier))
    wait_filled(tier, kept)  # the background fills of the admitted shards end
    first = storage_bytes(m)
    built = m.stats()["cache"]["build_bytes_read"]  # the index builds read every shard once
    assert total <= built <= 1.05 * total
    assert first - built <= total - kept + 0.05 * total  # nothing fetched whole and then dropped
    assert 0 < kept <= bound and m.stats()["disk"]["shards_refused"] > 0
    read_all(m.path, digests, seed=1)
    assert storage_bytes(m) - first <= total - kept + 0.05 * total  # the tier's part came from local disk


def test_a_shard_changed_under_a_live_mount_answers_eio_not_tier_bytes(tmp_path, mount):
    """Reads of a refused shard come from its tier file in C; once a rescan finds the source
    changed, they must reach Python and answer EIO, never the old bytes."""
    src, first, tier, m = two_shards_in_the_tier(tmp_path, mount)
    read_all(m.path, first, seed=1)
    assert m.stats()["reads_in_c_from_disk"] > 0
    write_shards(src, seed=2, shards=2, members=6)  # same names, other bytes, both shards
    m.rescan()
    assert m.stats()["shards_broken"] == 2
    for name in first:
        with pytest.raises(OSError) as exc:
            read_uncached(m.path, name)
        assert exc.value.errno == errno.EIO, name


def test_a_read_that_finds_its_shard_changed_stops_the_tier_bytes_in_c_at_once(tmp_path, mount):
    """No rescan: one member's tier chunk is damaged, so its read goes to storage, which finds
    the shard rewritten. From then on the other members, whole in the tier and served in C until
    then, answer EIO too: never the old bytes beside the EIO of the member next to them."""
    src, first, tier, m = two_shards_in_the_tier(tmp_path, mount)
    with tarfile.open(src / "part-00.tar") as tf:
        at = {info.name: info.offset_data for info in tf.getmembers()}
    damaged = min(at, key=at.get)  # in chunk 0; the others here start in later chunks
    others = [name for name in at if at[name] >= CHUNK]
    assert others, at
    read_all(m.path, {name: first[name] for name in others})
    served_in_c = m.stats()["reads_in_c_from_disk"]
    assert served_in_c > 0
    write_shards(src, seed=2, shards=1, members=6)  # part-00.tar: same names, other bytes
    flip_byte(next(c["path"] for c in cached(tier) if c["source"].endswith("part-00.tar")), at[damaged] + 10)
    for name in [damaged] + others:
        with pytest.raises(OSError) as exc:
            read_uncached(m.path, name)
        assert exc.value.errno == errno.EIO, name
    assert m.stats()["reads_in_c_from_disk"] == served_in_c
    assert "changed since its index was built" in m.log()
    for name in (n for n in first if "f1_" in n):  # part-01.tar: unchanged, still served
        assert hashlib.sha256(read_uncached(m.path, name)).hexdigest() == first[name]


def test_an_unmount_during_a_fill_of_hung_storage_exits_at_once_and_the_fill_resumes(tmp_path, mount,
                                                                                   monkeypatch):
    """A background fill still reading storage (which hangs) at unmount must not keep the daemon
    alive; the chunks it had not written are fetched by the next mount's fill, the rest is reused."""
    monkeypatch.setenv("SHARDFS_STORAGE_TIMEOUT", "120")  # far longer than the wait below
    src = tmp_path / "src"
    digests = write_shards(src, seed=5, shards=1, members=16, largest=2_500_000)
    total = (src / "part-00.tar").stat().st_size
    # The fill reads FILL_RUN chunks per request from the first one missing: its first run ends
    # within 2 runs whichever chunks the read below took first; from there on reads hang.
    hang = 2 * FILL_RUN * CHUNK
    assert total > hang + CHUNK
    first = min(digests, key=lambda name: int(name.split("_")[-1].split(".")[0]))  # member 0, before that
    flag, tier = tmp_path / "hang", tmp_path / "tier"
    with hanging_storage(tmp_path, src, "part-00.tar", flag, start=hang) as storage:
        # (indexed first: a first mount's index build would fill the tier itself, buildfill.py)
        shardfs_cmd("index", str(storage), check=True)
        m = mount(storage, options=options(tier, SMALL_RAM))
        flag.touch()
        with open(os.path.join(m.path, first), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digests[first]
        # the fill that read queued is now blocked past chunk 0
        wait_for(lambda: held(flag), "no fill reached the hung storage")
        done = shardfs_cmd("umount", "--wait", "10", m.path)
        assert done.returncode == 0, done.stderr
        assert not process_alive(m.pid)  # (a zombie until its parent, init, reaps it)
        assert "unmounted" in m.log()
        filled = sum(c["filled"] for c in cached(tier))
        assert FILL_RUN * CHUNK <= filled < total  # at least the first run is there, the one under way is not
        flag.unlink()
        again = mount(storage, options=options(tier, SMALL_RAM), name="again")
        read_all(again.path, digests)
        wait_filled(tier, total)
        assert storage_bytes(again) == total - filled  # resumed: what was there is not read again
