"""Pass signals on to a command exactly once (`shardfs run`).

A signal can reach the command three ways, and only one of them needs us:

* **The terminal** (Ctrl-C, Ctrl-\\) signals its foreground process group. The command runs in a
  group of its own that is made the terminal's foreground (as a shell does for a job), so it
  gets them straight from the terminal, reads the terminal as usual, and we get none.
* **Slurm** (scancel, the time limit) has slurmstepd signal every process of the job step, the
  command included: we do not send it again.
* **Anyone else** who signals `shardfs run` alone (kill PID, a batch system signalling the
  job's process group, which the command has left): we pass it on.

Signals are taken with ``sigwaitinfo`` on a thread, which tells who sent them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
SENDERS_OF_EVERY_PROCESS = ("slurmstepd",)


def _sender(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _forward(child: subprocess.Popen, done: threading.Event) -> None:
    while True:
        info = signal.sigwaitinfo(FORWARDED)
        if done.is_set():  # the command has ended: the signal is ours again
            os.kill(os.getpid(), info.si_signo)
            return
        if info.si_code == getattr(signal, "SI_KERNEL", 0x80) or _sender(info.si_pid) in SENDERS_OF_EVERY_PROCESS:
            continue  # from the terminal or Slurm: the command has it already
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(info.si_signo)


def _terminal() -> int | None:
    """Our controlling terminal's fd if we are its foreground job, else None."""
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
    signals passed on as described above. Everything is restored on exit."""
    terminal = _terminal()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)

    def in_child() -> None:  # between fork and exec: a group of its own, the terminal, our old mask
        os.setpgid(0, 0)
        if terminal is not None:
            _set_foreground(terminal, os.getpgrp())  # before exec, so it never reads as a background job
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    try:
        child = subprocess.Popen(command, env=env, preexec_fn=in_child)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        raise
    done = threading.Event()
    threading.Thread(target=_forward, args=(child, done), name="shardfs-signals", daemon=True).start()
    try:
        yield child
    finally:
        if terminal is not None:
            _set_foreground(terminal, os.getpgrp())
        # From now on signals act on us as they would have without the command (SIGTERM ends us).
        done.set()
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
