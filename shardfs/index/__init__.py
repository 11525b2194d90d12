"""What is in a shard, kept small and persisted: vetted member names (``names``), WebDataset
labels (``labels``), one shard's index as numpy arrays (``shard_index``) and where indexes are
stored and looked up, beside a shard or in the cache directory (``store``)."""
