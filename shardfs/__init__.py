"""shardfs: mount directories of dataset shards (tar, lz4) as one read-only tree."""

__version__ = "0.1.0"
