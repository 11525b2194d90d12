"""The kernel's side: the compiled request loop on libfuse's low-level API (``_lowlevel``, run by
``server``) answering per-file requests and cached reads from a view's arrays (``table``), the
Python half of the operations for misses and control (``ops``, fusepy's API), loading libfuse and
checking that a mount can work (``lib``), and the counters a mount exposes (``stats``). The read
path lives here only."""
