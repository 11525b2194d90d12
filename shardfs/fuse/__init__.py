"""The kernel's side: FUSE operations over a dataset view (``ops``), the adapter over mfusepy that
keeps the hot path lean (``glue``), loading libfuse and checking that a mount can work (``lib``),
and the per-operation counters a mount exposes (``stats``). The read path lives here only."""
