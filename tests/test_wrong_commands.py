"""Every error a user can cause, in every subcommand, as root and as nobody (issue 43): the exit
status a shell would give, stderr exactly one line starting with "shardfs:" (no traceback), and
nothing left behind: no mount, no process, no file or folder that was not there before.

Each row of CASES runs for real, in a private mount namespace of its own (tests/nobody.py) holding
a read-only filesystem ({ro}) and a full one ({full}: a tmpfs of a few pages), beside the world's
shards, files and folders nobody may not read or write. test_every_subcommand_option_and_key_has_a_case
fails when a subcommand, an option that takes a value or a configuration key has no row.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile

import pytest

import nobody
from benchlib.cli import REPO, SAFE_PATH, shardfs
from shardfs.cli import build_parser
from shardfs.service.config import _KEYS as CONFIG_KEYS

needs_nobody = pytest.mark.skipif(not nobody.can_run, reason=nobody.why_not)
USERS = ("root", "nobody")
FULL_SIZE = "16k"  # the full filesystem: four pages, less than any shard or pack here


@dataclasses.dataclass
class Case:
    """``shardfs ARGV`` (or ``mount.shardfs ARGV[1:]``) and what it must answer. In ARGV and TOML,
    {name} is a path of the world (see world()); {config} is TOML written to a file."""

    argv: str
    says: str  # a piece of the one line
    status: int = 2
    users: tuple[str, ...] = USERS
    toml: str | None = None
    report: bool = False  # the answer is the command's report (verify's): says is on stdout, stderr is empty

    def words(self) -> list[str]:
        return shlex.split(self.argv)


def config(body: str, says: str, **kw) -> Case:
    """A configuration file holding the sources and the mountpoint, then ``body``."""
    return Case("mount --config {config}", says, toml=f'sources = ["{{shards}}"]\nmountpoint = "{{mnt}}"\n{body}', **kw)


ME = ("nobody",)  # cases of permissions: root may read and write everything
CASES = [
    # mount: sources
    Case("mount {missing} {mnt}", "no such file or directory"),
    Case("mount {file} {mnt}", "not a shard"),
    Case("mount {empty} {mnt}", "no shard found"),
    Case("mount {top}/x*.tar {mnt}", "matches no shard"),
    Case("mount {junk} {mnt}", "no readable shard"),  # the daemon's refusal, the command's one line
    Case("mount {secret} {mnt}", "{secret}: Permission denied", users=ME),
    Case("mount {unreadable} {mnt}", "Permission denied", users=ME),
    Case("mount {shards}", "name the shards and the mountpoint"),
    # mount: the mountpoint
    Case("mount {shards} {missing}", "does not exist"),
    Case("mount {shards} {file}", "not a directory"),
    Case("mount {shards} /proc/sys", "on proc"),
    Case("mount {shards} {locked}", "not writable by you", users=ME),
    Case("mount {shards} {mnt} -o allow_other", "user_allow_other", users=ME),
    # mount: options
    Case("mount {shards} {mnt} -o rwx", "unknown mount option"),
    Case("mount {shards} {mnt} --cache-size lots", "--cache-size"),
    Case("mount {shards} {mnt} --prefetch some", "--prefetch: invalid choice"),
    Case("mount {shards} {mnt} --loaders 0", "--loaders"),
    Case("mount {shards} {mnt} --workers 0", "--workers"),
    Case("mount {shards} {mnt} --option endpoint_url", "endpoint_url"),
    Case("mount {shards} {mnt} --index-dir {file}", "--index-dir: {file} is not a directory"),
    Case("mount {shards} {mnt} --index-dir {ro}/ix", "read-only"),
    Case("mount {shards} {mnt} --log-file /proc/x.log", "--log-file: /proc is on proc"),
    Case("mount {shards} {mnt} --log-file {empty}", "--log-file: {empty} is a directory"),
    Case("mount {shards} {mnt} --log-file {locked}/x.log", "--log-file: {locked}: permission denied", users=ME),
    Case("mount {shards} {mnt} --disk-cache {file}", "--disk-cache: {file} is not a directory"),
    Case("mount {shards} {mnt} --disk-cache /proc/tier", "--disk-cache: /proc is on proc"),
    Case("mount {shards} {mnt} --disk-cache {ro}/tier", "read-only"),
    Case("mount {shards} {mnt} --disk-cache {locked}/tier", "permission denied", users=ME),
    Case("mount {shards} {mnt} --disk-cache-size 200%", "--disk-cache-size"),
    Case("mount {shards} {mnt} --peers junk", "junk"),
    Case("mount {shards} {mnt} --peers 127.0.0.1:1,127.0.0.2:1 --peer-self 127.0.0.3:1", "127.0.0.3:1"),
    Case("mount {shards} {mnt} --metrics-dir {missing}", "--metrics-dir"),
    Case("mount {shards} {mnt} --metrics-interval 0", "--metrics-interval"),
    Case("mount {shards} {mnt} --layout tree", "--layout: invalid choice"),
    Case("mount {shards} {mnt} --layout imagefolder --class-names {missing}", "--class-names"),
    Case("mount {shards} {mnt} --columns junk", "--columns"),
    Case("mount {shards} {mnt} --ready-timeout 0", "--ready-timeout"),
    Case("mount {shards} {mnt} --log-level loud", "--log-level: invalid choice"),
    Case("mount --config {missing}", "no such configuration file"),
    Case("mount --config {empty}", "Is a directory"),
    Case("mount --config {secret}/x.toml", "Permission denied", users=ME),
    Case("mount --config {file} {shards} {mnt}", "not both"),
    # the configuration file, key by key
    config("sources = [", "not valid TOML"),
    config("cach_size = '1G'", "unknown key"),
    Case("mount --config {config}", "sources: missing", toml='mountpoint = "{mnt}"'),
    Case("mount --config {config}", "sources: expected", toml='sources = 5\nmountpoint = "{mnt}"'),
    Case("mount --config {config}", "mountpoint: missing", toml='sources = ["{shards}"]'),
    Case("mount --config {config}", "not a directory", toml='sources = ["{shards}"]\nmountpoint = "{file}"'),
    config("cache_size = 'lots'", "cache_size"),
    config("prefetch = 'some'", "prefetch"),
    config("loaders = 0", "loaders"),
    config("allow_other = 'yes'", "allow_other"),
    config("index_dir = '{file}'", "--index-dir"),
    config("workers = true", "workers"),
    config("log_level = 'loud'", "log_level"),
    config("auto_unmount = 1", "auto_unmount"),
    config("log_file = '/proc/x.log'", "log_file"),
    config("layout = 'tree'", "layout"),
    config("class_names = '{missing}'\nlayout = 'imagefolder'", "class_names"),
    config("columns = 'junk'", "columns"),
    config("storage_options = 5", "storage_options"),
    config("metrics_dir = '{missing}'", "metrics_dir"),
    config("metrics_interval = 0", "metrics_interval"),
    config("disk_cache = '{file}'", "--disk-cache"),
    config("disk_cache_size = '200%'", "disk_cache_size"),
    config("peers = 'junk'", "peers"),
    config("peers = ['127.0.0.1:1', '127.0.0.2:1']\npeer_self = '127.0.0.3:1'", "127.0.0.3:1"),
    # the fstab helper (mount(8) runs it)
    Case("mount.shardfs {shards}", "mount.shardfs: the following arguments are required: dir"),
    Case("mount.shardfs {missing} {mnt}", "no such file or directory"),
    Case("mount.shardfs {shards} {mnt} -o cache_size=lots", "size 'lots'"),
    # run
    Case("run {shards} {mnt} -- /no/such/command", "/no/such/command: command not found", status=127),
    Case("run {shards} {mnt} -- {file}", "{file}: cannot run it: Permission denied", status=126),
    Case("run {shards} {mnt} -- {empty}", "cannot run it", status=126),
    Case("run {shards} {mnt}", "give the command after --"),
    Case("run {shards} {file} -- true", "looks like a source"),
    Case("run {shards} -m {file} -- true", "not a directory"),
    Case("run {shards} {locked}/mnt -- true", "{locked}/mnt: Permission denied", users=ME),
    Case("run {shards} /proc/shardfs-mnt -- true", "/proc/shardfs-mnt"),
    Case("run {shards} {ro}/mnt -- true", "Read-only file system"),
    Case("run {missing} {new} -- true", "no such file or directory"),
    # umount, status, stats
    Case("umount {mnt}", "not mounted"),
    Case("umount {missing}", "not mounted"),
    Case("umount /proc", "not a shardfs mount"),
    Case("umount {mnt} --wait -1", "--wait"),
    Case("status {mnt}", "not a shardfs mount"),
    Case("status {missing}", "not a shardfs mount"),
    Case("stats {missing}", "not a live shardfs mount"),
    Case("stats {mnt}", "not a live shardfs mount"),
    Case("stats {mnt} --watch --count 1", "not a live shardfs mount"),
    Case("stats {mnt} --watch --interval 0", "--interval"),
    Case("stats {mnt} --watch --count 0", "--count"),
    Case("stats {mnt} --format xml", "--format: invalid choice"),
    # index
    Case("index {missing}", "no such file or directory"),
    Case("index {secret}", "Permission denied", users=ME),
    Case("index {shards} --workers 0", "--workers"),
    Case("index {shards} --index-dir {file}", "not a directory"),
    Case("index {shards} --index-dir /proc/ix", "on proc"),
    Case("index {shards} --index-dir {ro}/ix", "read-only"),
    Case("index {unreadable}", "Permission denied", status=1, users=ME),
    Case("index {shards} --columns junk", "--columns"),
    Case("index {shards} --option endpoint_url", "endpoint_url"),
    # cache
    Case("cache ls {missing}", "no such directory"),
    Case("cache ls {file}", "no such directory"),
    Case("cache clear {secret}", "Permission denied", users=ME),
    Case("cache empty {empty}", "invalid choice"),
    # pack
    Case("pack {missing} {new}", "{missing}"),
    Case("pack {secret} {new}", "Permission denied", users=ME),
    Case("pack {src} {file}", "{file}"),
    Case("pack {src} {locked}/out", "Permission denied", users=ME),
    Case("pack {src} {ro}/out", "Read-only file system"),
    Case("pack {src} /proc/out", "/proc/out"),
    Case("pack {src} {full}/out", "No space left on device", status=1),
    Case("pack {src} {full}/out --format lz4", "No space left on device", status=1),
    Case("pack {src} {new} --shard-size 0", "shard size"),
    Case("pack {src} {new} --shard-size 50%", "--shard-size"),
    Case("pack {src} {new} --shard-members 0", "--shard-members"),
    Case("pack {src} {new} --format lz4 --block-size 1", "--block-size"),
    Case("pack {src} {new} --format zip", "--format: invalid choice"),
    Case("pack {src} {new} --workers 0", "--workers"),
    Case("pack {src} {new} --seed many", "--seed"),
    Case("pack {src} {new} --mtime noon", "--mtime"),
    Case("pack {src} {new} --prefix ../x", "prefix"),
    Case("pack {src} {new} --layout tree", "--layout: invalid choice"),
    Case("pack {src} {new} --under ../x", "climbs out of the tree"),
    Case("pack {mapping} {new} --classes {missing}", "{missing}"),
    Case("pack {mapping} {new} --root {missing}", "{missing}"),
    # verify
    Case("verify {missing}", "no such file or directory"),
    Case("verify {secret}", "Permission denied", users=ME),
    Case("verify {shards} --workers 0", "--workers"),
    Case("verify {unreadable}", "Permission denied", status=1, users=ME, report=True),
    Case("verify {shards} --columns junk", "--columns"),
    # ls
    Case("ls {missing}", "no such file or directory"),
    Case("ls {secret}", "Permission denied", users=ME),
    Case("ls {unreadable}", "Permission denied", users=ME),
    Case("ls {shards} --path no/such/folder", "no/such/folder"),
    Case("ls {shards} --layout imagefolder --class-names {missing}", "{missing}: cannot read"),
    Case("ls {shards} --columns junk", "--columns"),
    Case("ls {shards} --index-dir {file}", "not a directory"),
]


@pytest.fixture(scope="module")
def world():
    """A world-readable work area (nobody.world's), with the things the cases name."""
    with nobody.world("", classes=3, per_class=5) as top:
        paths = {name: os.path.join(top, name) for name in
                 ("shards", "src", "empty", "secret", "unreadable", "junk", "locked", "ro", "full", "missing", "cases")}
        paths["top"] = top
        for name in ("empty", "secret", "unreadable", "junk", "locked", "ro", "full", "cases"):
            os.mkdir(paths[name])
        with open(os.path.join(paths["junk"], "x.tar"), "wb") as f:  # named like a shard: found, then unreadable
            f.write(b"not a tar at all " * 100)
        paths["file"] = os.path.join(top, "file.txt")
        with open(paths["file"], "w") as f:
            f.write("not a shard\n")
        paths["mapping"] = os.path.join(top, "mapping.txt")
        with open(paths["mapping"], "w") as f:  # a path relative to the file's folder, or to --root
            folder = os.path.join(paths["src"], "train", "n00000000")
            f.write(f"{os.path.relpath(folder, top)}/{sorted(os.listdir(folder))[0]} 0\n")
        paths["big"], paths["bigshards"] = os.path.join(top, "big"), os.path.join(top, "bigshards")
        os.makedirs(os.path.join(paths["big"], "noise"))
        os.mkdir(paths["bigshards"])
        with tarfile.open(os.path.join(paths["bigshards"], "big.tar"), "w") as tar:  # 4 times the full disk
            for i in range(4):
                with open(os.path.join(paths["big"], "noise", f"{i}.bin"), "wb") as f:
                    f.write(os.urandom(16 << 10))
                tar.add(os.path.join(paths["big"], "noise", f"{i}.bin"), f"noise/{i}.bin")
        paths["same"] = os.path.join(top, "same.py")
        with open(paths["same"], "w") as f:
            f.write(SAME)
        shard = sorted(os.listdir(paths["shards"]))[0]
        for where in ("secret", "unreadable"):
            shutil.copy(os.path.join(paths["shards"], shard), paths[where])
        shardfs("index", paths["shards"], paths["bigshards"], check=True)  # so no case of a mount writes them
        nobody.share(top)
        os.chmod(paths["secret"], 0o700)
        os.chmod(os.path.join(paths["unreadable"], shard), 0o600)
        os.chmod(paths["cases"], 0o777)
        yield top, paths


# `shardfs run`'s command in test_a_disk_tier_on_a_full_disk_serves_every_byte: the mount's files
# are the source's, byte for byte.
SAME = '''
import os, sys
src, mnt, files = sys.argv[1], os.environ["SHARDFS_MOUNT"], 0
for folder, _, names in os.walk(src):
    for name in names:
        path = os.path.join(folder, name)
        with open(path, "rb") as a, open(os.path.join(mnt, os.path.relpath(path, src)), "rb") as b:
            assert a.read() == b.read(), path
        files += 1
print(files, "files the same")
'''


@dataclasses.dataclass
class Outcome:
    status: int
    stdout: str
    stderr: str
    mounts: list[str]  # mounts under the world left by the command
    made: list[str]  # paths in the world that were not there before it
    gone: list[str]  # and paths there before that are gone
    running: list[int]  # processes it started that still run


_ids = itertools.count()


def attempt(world, case: Case, user: str, tmp_path) -> Outcome:
    """Run the case's command as ``user`` in a private mount namespace; what it left behind."""
    top, world_paths = world
    work = os.path.join(world_paths["cases"], f"{next(_ids)}-{user}")
    paths = {**world_paths, "mnt": os.path.join(work, "mnt"), "new": os.path.join(work, "new"),
             "config": os.path.join(work, "config.toml")}
    uid = nobody.NOBODY if user == "nobody" else 0
    for folder in (work, paths["mnt"]):
        os.mkdir(folder)
        os.chown(folder, uid, uid)
    if case.toml is not None:
        with open(paths["config"], "w") as f:
            f.write(case.toml.format(**paths))
    words = [w.format(**paths) for w in case.words()]
    tag = f"SHARDFS_WRONG_COMMAND={os.path.basename(work)}"
    if words[0] == "mount.shardfs":
        command = [sys.executable, *SAFE_PATH, "-c", "import sys; from shardfs.cli import mount_helper; "
                   "sys.exit(mount_helper())", *words[1:]]
    else:
        command = [sys.executable, *SAFE_PATH, "-m", "shardfs", *words]
    env = {"PYTHONPATH": REPO, "SHARDFS_WRONG_COMMAND": os.path.basename(work)}
    if user == "nobody":
        command = nobody.as_nobody(top, command, env)
    else:
        command = ["env", f"HOME={top}/root-home", *(f"{k}={v}" for k, v in env.items()), *command]
    out = str(tmp_path)
    listing = f"find {top} -path {top}/home -prune -o -path {top}/root-home -prune -o -path {top}/ns -prune -o -print"
    script = nobody.namespace_setup(top) + [
        f"mount -t tmpfs -o mode=777 tmpfs {paths['ro']}", f"mount -o remount,ro {paths['ro']}",
        f"mount -t tmpfs -o size={FULL_SIZE},mode=777 tmpfs {paths['full']}",
        f"{listing} | sort > {out}/before",
        f"{{ {shlex.join(command)} > {out}/stdout 2> {out}/stderr; echo $? > {out}/status; }}",
        f"cat /proc/self/mounts > {out}/mounts", f"{listing} | sort > {out}/after"]
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", " && ".join(script)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    running = _running(tag)

    def read(name: str) -> str:
        with open(os.path.join(out, name)) as f:
            return f.read()

    own = {paths["ro"], paths["full"], f"{top}/ns/pyenv"}
    mounts = [line for line in read("mounts").splitlines()
              if line.split()[1].startswith(top + "/") and line.split()[1] not in own]
    before, after = set(read("before").splitlines()), set(read("after").splitlines())
    return Outcome(int(read("status")), read("stdout"), read("stderr"), mounts, sorted(after - before),
                   sorted(before - after), running)


def _running(tag: str) -> list[int]:
    """Processes whose environment holds ``tag`` (the case's daemon, say); stopped, by pid."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if tag.encode() + b"\0" in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    for pid in found:
        os.kill(pid, signal.SIGKILL)
    return found


def _case_id(case: Case, user: str) -> str:
    return case.argv + (f" [{case.toml.splitlines()[-1]}]" if case.toml else "") + f" as {user}"


@needs_nobody
@pytest.mark.parametrize("case,user", [pytest.param(case, user, id=_case_id(case, user))
                                       for case in CASES for user in case.users])
def test_a_wrong_command_answers_in_one_line_and_leaves_nothing(world, case, user, tmp_path):
    got = attempt(world, case, user, tmp_path)
    says = case.says.format(**world[1])
    if case.report:
        assert got.stderr == "" and says in got.stdout, got
    else:
        lines = got.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("shardfs: "), got
        assert says in lines[0], got
    assert got.status == case.status, got
    assert got.mounts == [] and got.running == [], got
    assert got.made == [] and got.gone == [], got


@needs_nobody
@pytest.mark.parametrize("user", USERS)
def test_a_disk_tier_on_a_full_disk_serves_every_byte(world, user, tmp_path):
    """The disk tier is room to spare, not a place the mount needs: named on a disk too full for the
    shards (with a bound it cannot hold), the mount serves every byte (test_disk_tier.py: the tier
    filling a disk up, and the one log line that gives)."""
    run = Case(f"run {{bigshards}} {{new}} --disk-cache {{full}}/tier --disk-cache-size 1G -- "
               f"{sys.executable} {{same}} {{big}}", "", status=0)
    got = attempt(world, run, user, tmp_path)
    assert got.status == 0 and got.stdout == "4 files the same\n", got
    assert "Traceback" not in got.stderr and got.mounts == [] and got.running == [], got
    full = world[1]["full"]
    assert got.gone == [] and all(path.startswith(f"{full}/tier") for path in got.made), got


def test_every_subcommand_option_and_key_has_a_case():
    """A new subcommand, option that takes a value, or configuration key needs its rows in CASES.
    An option that several subcommands share (the same help: mount's options for `run`) needs one."""
    choices = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    used = {(case.words()[0], word) for case in CASES for word in case.words()}
    missing = []
    for name, parser in choices.items():
        names = {n for n, p in choices.items() if p is parser}
        if not any(case.words()[0] in names for case in CASES):
            missing.append(f"shardfs {name}")
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 or action.help == argparse.SUPPRESS:
                continue
            sharing = {n for n, p in choices.items() for a in p._actions
                       if a.option_strings == action.option_strings and a.help == action.help}
            if not any((n, option) in used for n in sharing for option in action.option_strings):
                missing.append(f"shardfs {name} {action.option_strings[-1]}")
    toml = "\n".join(case.toml or "" for case in CASES)
    missing += [f"configuration key {key}" for key in CONFIG_KEYS if not re.search(rf"^{key} =", toml, re.M)]
    if not any(case.words()[0] == "mount.shardfs" for case in CASES):
        missing.append("mount.shardfs")
    assert not missing, f"cases to add to CASES: {sorted(set(missing))}"
