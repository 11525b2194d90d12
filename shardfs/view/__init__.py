"""What a mount shows: the shards named by the sources (``sources``), their indexes presented
as stored or as ImageFolder classes (``layouts``), merged into one tree with lookups and listings
(``tree``), the dataset that ties tree and shards together (``dataset``), and member reads
through a shard's data layout (``reader``)."""
