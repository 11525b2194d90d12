"""Pass signals on to a command exactly once (`shardfs run`).

The command runs in a process group of its own. So a signal sent to our process group (a
batch system: Slurm signals a task's process group on scancel and at the time limit) or to
us alone (kill PID) reaches only us, and we pass it on: once. When we are the terminal's
foreground job, the command's group becomes the foreground instead (as a shell does for a
job): Ctrl-C and Ctrl-\\ reach the command straight from the terminal, not us, and the
command reads the terminal as usual. Before, the command shared our group and got such
signals twice: from the sender and from us.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _terminal() -> int | None:
    """A descriptor of our controlling terminal if we are its foreground job, else None."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return fd
        except OSError:
            continue
    return None


def _set_foreground(fd: int, pgrp: int) -> None:
    # A process that is not in the foreground gets SIGTTOU for this unless it ignores it.
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgrp)
    except OSError:
        pass  # the terminal went away (hangup)
    finally:
        signal.signal(signal.SIGTTOU, previous)


@contextlib.contextmanager
def command_with_signals(command: list[str], env: dict) -> Iterator[subprocess.Popen]:
    """Start ``command`` in a process group of its own, owning the terminal if we did, with
    the signals we get passed on. Handlers and the terminal are restored on exit."""
    terminal = _terminal()

    def in_child() -> None:  # between fork and exec
        os.setpgid(0, 0)
        if terminal is not None:
            _set_foreground(terminal, os.getpgrp())  # before exec: it never runs as a background job

    child = subprocess.Popen(command, env=env, preexec_fn=in_child)
    previous = {sig: signal.signal(sig, lambda signum, _frame: child.send_signal(signum)) for sig in FORWARDED}
    try:
        yield child
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if terminal is not None:
            _set_foreground(terminal, os.getpgrp())
