"""What the benchmarks, the stress tool, the demo and the tests have in common (not part of the package).

    cli       the `shardfs` command as a subprocess, running this checkout's code
    mounts    mount lifecycles: wait until mounted, unmount in order, stop a child we started
    caches    dropping the page cache, and noticing when someone else did
    capped    slow shared storage: a loop-mounted ext4 image, its reads capped by a blkio cgroup
    machine   machine facts, CPU meters, waiting for a quiet machine, a VM's free page reporting
    methods   the ways of serving a dataset that the benchmarks compare (plain, shardfs, squashfuse_ll, ...)
    readers   reading as training code reads: the ImageFolder listing, reader process pools
    rounds    rounds of passes over every method, in rotating order, redone when others disturbed them
    tables    result tables: medians, spreads (min-max) and ratios to a baseline; PASS/FAIL targets
    chart     the results as a PNG chart (matplotlib)
    servers   real S3 (moto) and HTTP (nginx) servers on loopback, for remote shards
    sample    real JPEGs in ImageFolder class folders, and tar shards of them

Tools import it as `benchlib` (a script's own directory is on sys.path); the tests through pytest's
`pythonpath` option.
"""
