"""The one base class of every error shardfs raises on purpose, so users and the Python API
catch one thing (``except shardfs.ShardfsError``); subclasses live beside the code that raises them."""


class ShardfsError(Exception):
    """Anything shardfs reports as a problem with its input, its storage or its use."""


class UsageError(ShardfsError):
    """A problem the user can fix: the CLI prints the message (one line) and exits 2."""

    exit_code = 2
