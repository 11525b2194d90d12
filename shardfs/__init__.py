"""shardfs: mount directories of dataset shards (tar, lz4) as one read-only tree."""

__version__ = "0.1.0"

from shardfs.errors import ShardfsError  # noqa: E402,F401  (catch this one: every error shardfs raises)


def mounted(*args, **kwargs):
    """``with shardfs.mounted(src, mountpoint=None, **options) as root:`` (see shardfs.service.api)."""
    from shardfs.service.api import mounted as _mounted

    return _mounted(*args, **kwargs)
