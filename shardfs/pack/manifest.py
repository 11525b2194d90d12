"""The manifest `shardfs pack` writes beside its shards: ``<prefix>.manifest.json``.

One manifest per pack (so ``train`` and ``val`` packs can share a directory), listing
each shard's name, format, size, member count and sha256, the totals, and the options
that shaped the output. It holds nothing that changes between runs (no dates, no
absolute paths, no worker count), so packing the same input twice gives the same
manifest, byte for byte. `shardfs verify` checks shards against it.

    {
      "manifest": "shardfs-pack", "version": 1, "tool": "shardfs 0.1.0",
      "prefix": "train",
      "source": {"kind": "directory", "name": "imagenet", "classes": null},
      "options": {"format": "tar", "shard_size": 1073741824, "shard_members": null,
                  "shuffle": true, "seed": 0, "block_size": null, "under": "", "mtime": null},
      "shards": [{"name": "train-000000.tar", "format": "tar", "size": 1073735680,
                  "members": 9412, "data_bytes": 1068433919, "sha256": "9f2c..."}, ...],
      "totals": {"shards": 138, "members": 1281167, "size": ..., "data_bytes": ...}
    }
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict

from shardfs import __version__
from shardfs.atomic import atomic_file

KIND = "shardfs-pack"
VERSION = 1
SUFFIX = ".manifest.json"


def path_for(out_dir: str, prefix: str) -> str:
    return os.path.join(out_dir, prefix + SUFFIX)


def build(prefix: str, shards: list, source: dict, options: dict, extra_tool: dict | None = None) -> dict:
    rows = [s if isinstance(s, dict) else asdict(s) for s in shards]
    return {
        "manifest": KIND,
        "version": VERSION,
        "tool": f"shardfs {__version__}",
        **(extra_tool or {}),
        "prefix": prefix,
        "source": source,
        "options": options,
        "shards": rows,
        "totals": {
            "shards": len(rows),
            "members": sum(r["members"] for r in rows),
            "size": sum(r["size"] for r in rows),
            "data_bytes": sum(r["data_bytes"] for r in rows),
        },
    }


def write(path: str, manifest: dict) -> None:
    with atomic_file(path, "w") as f:
        f.write(json.dumps(manifest, indent=2) + "\n")


def load(path: str) -> dict:
    """The manifest at path; ValueError if it is not one this version understands."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("manifest") != KIND:
        raise ValueError("not a shardfs pack manifest")
    if data.get("version") != VERSION:
        raise ValueError(f"manifest version {data.get('version')}, this shardfs reads {VERSION}")
    shards = data.get("shards")
    if not isinstance(shards, list) or not all(
        isinstance(s, dict) and isinstance(s.get("name"), str) and isinstance(s.get("size"), int)
        and isinstance(s.get("sha256"), str) for s in shards
    ):
        raise ValueError("malformed shard list")
    return data


def find(directory: str) -> list[str]:
    """Manifests in a directory, sorted."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return []
    return sorted(os.path.join(directory, n) for n in entries if n.endswith(SUFFIX) and not n.startswith("."))
