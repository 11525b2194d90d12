"""The data owners' tools: what to pack (``inputs``, ``torchdata``, ``samples``), planning and
running a pack (``packer``), writing shards (``writers``), the pack manifest (``manifest``),
and checking or previewing shards without a mount (``verify``, ``listing``)."""
