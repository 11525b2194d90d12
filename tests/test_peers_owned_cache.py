"""An owned shard refused room while the shards in the RAM cache were busy is admitted at its
next read once they are not: an owner never keeps reading its own shard from storage member by
member (each epoch) because a peer's shard was being read at the wrong moment."""

from test_peers_parts import _shards

from shardfs.storage.buffers import footprint
from shardfs.storage.ram import CHUNK, ShardCache


def test_an_owned_shard_refused_while_others_were_busy_is_admitted_later(tmp_path):
    a, b, mine = _shards(tmp_path, 3, CHUNK)
    cache = ShardCache([], 2 * footprint(CHUNK), keep_first=lambda shard: shard is mine)
    try:
        for shard in (a, b):
            cache.fetch(shard, 0, 10)
        for shard in (a, b):  # both being read now (as by readers mid-copy): neither can go
            cache.resident[shard].busy += 1
        assert bytes(cache.fetch(mine, 0, 10)) == b"\x02" * 10
        assert mine not in cache.resident and cache.snapshot()["direct_reads"] == 1
        for shard in (a, b):
            cache.resident[shard].busy -= 1
        assert bytes(cache.fetch(mine, 0, 10)) == b"\x02" * 10
        assert mine in cache.resident  # no eviction came between: it asked again all the same
    finally:
        cache.close()
