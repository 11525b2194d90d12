"""Where shardfs keeps a user's files: indexes of shards it cannot write beside, logs, caches."""

from __future__ import annotations

import os
import tempfile


def cache_dir() -> str:
    """$XDG_CACHE_HOME/shardfs, else ~/.cache/shardfs; a private folder in /tmp for users
    without a usable home (system accounts, some batch setups)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    preferred = os.path.join(base, "shardfs")
    try:
        os.makedirs(preferred, exist_ok=True)
        if os.access(preferred, os.W_OK):
            return preferred
    except OSError:
        pass
    fallback = os.path.join(tempfile.gettempdir(), f"shardfs-{os.getuid()}")
    os.makedirs(fallback, mode=0o700, exist_ok=True)
    return fallback
