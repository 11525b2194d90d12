"""Errors a user can act on: the CLI prints the message (one line) and exits 2."""


class UsageError(Exception):
    exit_code = 2
