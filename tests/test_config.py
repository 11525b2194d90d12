"""The configuration file and the systemd unit."""

import os
import shutil
import subprocess

import pytest

from shardfs.service.config import load_config, parse_config
from shardfs.errors import UsageError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "systemd", "example.toml")


def test_the_commented_example_parses():
    cfg = load_config(EXAMPLE)
    assert cfg.sources == ["/lustre/proj/imagenet-shards"] and cfg.mountpoint == "/mnt/imagenet"
    assert cfg.cache_size == "64G" and cfg.prefetch == "touched" and cfg.allow_other is True
    assert cfg.loaders == 2 and cfg.workers == 4 and cfg.index_dir == "/var/cache/shardfs"


BASE = {"sources": ["/d"], "mountpoint": "/m"}


@pytest.mark.parametrize("change,message", [
    ({"cache_sise": "1G"}, "cache_sise: unknown key"),
    ({"sources": 3}, "sources: expected a list of shard directories"),
    ({"sources": []}, "sources: expected a non-empty list"),
    ({"sources": ["/d", 4]}, "sources: expected a non-empty list"),
    ({"mountpoint": ["/m"]}, "mountpoint: expected a path, got list"),
    ({"cache_size": 1.5}, "cache_size: expected a size"),
    ({"cache_size": "lots"}, "cache_size: cannot read size 'lots'"),
    ({"prefetch": "some"}, "prefetch: expected one of touched, all"),
    ({"loaders": "2"}, "loaders: expected a whole number"),
    ({"loaders": True}, "loaders: expected a whole number >= 1, got bool"),
    ({"loaders": 0}, "loaders: expected a whole number >= 1, got 0"),
    ({"workers": -1}, "workers: expected a whole number >= 1"),
    ({"allow_other": "yes"}, "allow_other: expected true or false, got str"),
    ({"log_level": "loud"}, "log_level: expected one of debug, info"),
    ({"index_dir": 7}, "index_dir: expected a path"),
    ({"disk_cache": 1}, "disk_cache: expected a directory on node-local disk"),
    ({"disk_cache_size": "huge"}, "disk_cache_size: cannot read size 'huge'"),
    ({"columns": "pixels"}, "columns: --columns 'pixels': expected image=COL,label=COL"),
])
def test_each_wrong_key_or_type_names_key_and_file(change, message):
    with pytest.raises(UsageError) as exc:
        parse_config({**BASE, **change}, "/etc/shardfs/x.toml")
    assert str(exc.value).startswith("/etc/shardfs/x.toml: ")
    assert message in str(exc.value)


def test_disk_tier_keys_from_every_front_door():
    from shardfs.service.api import mount_command
    from shardfs.service.config import MountConfig, apply_options, to_args

    cfg = parse_config({**BASE, "disk_cache": "/local/t", "disk_cache_size": 10**12})
    assert (cfg.disk_cache, cfg.disk_cache_size) == ("/local/t", str(10**12))
    fstab = MountConfig(sources=["/d"], mountpoint="/m")
    apply_options(fstab, "ro,disk_cache=/local/t,disk_cache_size=80%")
    assert (fstab.disk_cache, fstab.disk_cache_size) == ("/local/t", "80%")
    args = to_args(fstab)
    assert args[args.index("--disk-cache") + 1] == "/local/t" and "80%" in args
    cmd = mount_command(["/d"], "/m", {"disk_cache": "/local/t", "disk_cache_size": "800G"})
    assert cmd[-4:] == ["--disk-cache", "/local/t", "--disk-cache-size", "800G"]


def test_columns_from_every_front_door():
    """Dataset files' --columns: TOML, -o (a comma in the value escaped, as libfuse takes it), the
    daemon's command line."""
    from shardfs.formats.datafile import Columns
    from shardfs.service.config import MountConfig, apply_options, to_args

    cfg = parse_config({**BASE, "columns": "image=pixels,label=cls"}, "f.toml")
    fstab = MountConfig(sources=["/d"], mountpoint="/m")
    apply_options(fstab, "ro,columns=image=pixels\\,label=cls,cache_size=1G")
    assert cfg.columns == fstab.columns == "image=pixels,label=cls" and fstab.cache_size == "1G"
    args = to_args(fstab)
    assert Columns.parse(args[args.index("--columns") + 1]) == Columns("pixels", "cls")


def test_missing_keys_and_bad_files(tmp_path):
    for key in ("sources", "mountpoint"):
        with pytest.raises(UsageError, match=f"{key}: missing"):
            parse_config({k: v for k, v in BASE.items() if k != key}, "f.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("sources = [\n")
    with pytest.raises(UsageError, match="bad.toml: not valid TOML"):
        load_config(str(bad))
    with pytest.raises(UsageError, match="no such configuration file"):
        load_config(str(tmp_path / "none.toml"))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_unit_verifies(tmp_path):
    unit = tmp_path / "shardfs@imagenet.service"  # an instance of the template
    shutil.copy(os.path.join(REPO, "systemd", "shardfs@.service"), unit)
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "shardfs@" not in done.stderr  # no warnings about our unit
