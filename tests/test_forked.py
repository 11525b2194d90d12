"""The daemon of a detaching `shardfs mount` is a forked child of the command (service/forked.py):
what the new interpreter it replaces was (a session of its own, /dev/null for stdin and stdout,
no descriptor of the caller's), and where the command still starts a new interpreter."""

import hashlib
import os
import subprocess
import sys
import textwrap

from conftest import needs_fuse, shardfs_cmd, wait_for
from benchlib.cli import REPO
from benchlib.mounts import mount_stats
from shardfs.service.mount import process_alive


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()  # state ppid pgrp session tty_nr ...


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().split("\0")


def _sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _python(script: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          env=env, timeout=300, **kw)


@needs_fuse
def test_the_daemon_is_a_forked_child_in_its_own_session_serving_after_the_command_returned(
        tar_shards, sample_tree, tmp_path, mount):
    m = mount(tar_shards)  # returns once `shardfs mount` has exited
    _state, _ppid, pgrp, session, tty = _stat_fields(m.pid)[:5]
    assert int(pgrp) == m.pid and int(session) == m.pid and int(tty) == 0
    # the command's own command line: no second interpreter was started
    assert "--ready-fd" not in _cmdline(m.pid) and "--foreground" not in _cmdline(m.pid)
    assert os.readlink(f"/proc/{m.pid}/fd/0") == os.readlink(f"/proc/{m.pid}/fd/1") == os.devnull
    assert os.path.samefile(f"/proc/{m.pid}/fd/2", m.log_file)  # stderr to its log once detached
    figures = mount_stats(m.path)
    assert figures["ready_seconds"] >= figures["index_seconds"] > 0  # from its start of work until ready
    files = [os.path.relpath(os.path.join(d, f), sample_tree) for d, _, fs in os.walk(sample_tree) for f in fs]
    assert len(files) == 72
    for rel in files:
        assert _sha256(os.path.join(m.path, rel)) == _sha256(sample_tree / rel), rel
    done = shardfs_cmd("umount", m.path)
    assert done.returncode == 0, done
    with open(m.log_file) as f:
        log = f.read()
    assert "mounted at" in log and "unmounted" in log  # its log flushed by the child's own exit


@needs_fuse
def test_the_daemon_holds_no_descriptor_of_the_caller(tar_shards, tmp_path):
    caller_read, caller_write = os.pipe()  # a descriptor the caller lets the command inherit
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        done = _python(f"""
            import sys
            from shardfs.cli import main
            sys.exit(main(["mount", {str(tar_shards)!r}, {str(mnt)!r}, "--log-file", {str(tmp_path / "log")!r}]))
        """, pass_fds=(caller_write,))
        assert done.returncode == 0, done
        assert "--ready-fd" not in _cmdline(mount_stats(str(mnt))["pid"])  # forked
        os.close(caller_write)
        caller_write = None
        assert os.read(caller_read, 1) == b""  # end of file: no process holds the write end any more
    finally:
        for fd in (caller_read, caller_write):
            if fd is not None:
                os.close(fd)
        pid = (mount_stats(str(mnt)) or {}).get("pid")
        shardfs_cmd("umount", str(mnt))
        if pid:
            wait_for(lambda: not process_alive(pid), f"the daemon (pid {pid}) outlived its unmount")


@needs_fuse
def test_storage_options_on_the_command_line_start_a_new_interpreter(tar_shards, tmp_path, mount):
    # `--option` may carry credentials: a forked daemon would show the command's argv for as long as it serves
    m = mount(tar_shards, options=("--option", "anon=true"))
    args = _cmdline(m.pid)
    assert "--ready-fd" in args and "--foreground" in args and "anon=true" not in args


@needs_fuse
def test_a_command_with_threads_starts_a_new_interpreter(tar_shards, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = _python(f"""
        import sys, threading
        from shardfs.cli import main
        stop = threading.Event()
        threading.Thread(target=stop.wait).start()  # a fork would leave its locks held in the child
        try:
            code = main(["mount", {str(tar_shards)!r}, {str(mnt)!r}, "--log-file", {str(tmp_path / "log")!r}])
        finally:
            stop.set()
        sys.exit(code)
    """)
    pid = (mount_stats(str(mnt)) or {}).get("pid")
    try:
        assert done.returncode == 0, done
        assert "--ready-fd" in _cmdline(pid)
    finally:
        shardfs_cmd("umount", str(mnt))


def test_the_child_exits_with_the_work_status_and_never_runs_the_parent_cleanup():
    done = _python("""
        import atexit, os, sys
        from shardfs.errors import UsageError
        from shardfs.service import forked
        atexit.register(lambda: print("parent cleanup", file=sys.stderr, flush=True))  # stderr: the children's too

        def refuse():
            raise UsageError("no shard here")

        def crash():
            raise RuntimeError("boom")

        def interrupted():
            raise KeyboardInterrupt

        assert forked.can_fork()
        for work in (lambda: 0, lambda: 3, refuse, crash, interrupted):
            child = forked.start(work, ())
            print("status", child.wait(timeout=60), flush=True)
        print("parent done", flush=True)
    """)
    assert done.returncode == 0, done
    assert done.stdout.splitlines() == ["status 0", "status 3", "status 2", "status 1", "status 130",
                                        "parent done"]  # the children's stdout: /dev/null
    assert done.stderr.count("parent cleanup") == 1, done.stderr
    assert "shardfs: no shard here" in done.stderr and "RuntimeError: boom" in done.stderr


def test_a_stuck_child_is_stopped_with_its_session():
    done = _python("""
        import os, signal, time
        from shardfs.service import forked
        from shardfs.service.mount import process_alive, stop_session

        def stuck():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a daemon hung in the kernel would not go
            pid = os.fork()
            if pid == 0:  # what it forked (an index builder) goes with it
                while True:
                    time.sleep(1)
            os.write(ready, str(pid).encode())
            while True:
                time.sleep(1)

        read_end, ready = os.pipe()
        child = forked.start(stuck, (ready,))
        os.close(ready)
        grandchild = int(os.read(read_end, 32))
        stop_session(child, grace=1)
        assert child.returncode == -signal.SIGKILL, child.returncode
        deadline = time.monotonic() + 60
        while process_alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_alive(grandchild)
        print("stopped")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done
