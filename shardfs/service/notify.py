"""systemd's sd_notify protocol (READY, STATUS, STOPPING, WATCHDOG) over $NOTIFY_SOCKET.

A few lines of socket code rather than a dependency: the protocol is one datagram of
``KEY=value`` lines to a unix socket, whose name may start with ``@`` (abstract namespace).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, env: dict[str, str] | None = None):
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):
            address = "\0" + address[1:]
        self.address = address or None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and (not pid or pid == str(os.getpid())) else None
        self._stop = threading.Event()

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, **fields: str) -> None:
        if self.address is None:
            return
        message = "\n".join(f"{key.upper()}={value}" for key, value in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message, self.address)
        except OSError as exc:  # systemd gone or socket misconfigured: never fatal for the mount
            log.debug("sd_notify failed: %s", exc)

    def start_background(self, healthy: Callable[[], bool], status: Callable[[], str],
                         status_every: float = 10.0) -> None:
        """STATUS lines every ``status_every`` s; WATCHDOG=1 at half the watchdog interval while healthy."""
        if not self.enabled:
            return
        period = min(status_every, self.watchdog_s / 2) if self.watchdog_s else status_every

        def run() -> None:
            last_status = 0.0
            while not self._stop.wait(period):
                if self.watchdog_s and healthy():
                    self.send(watchdog="1")
                now = time.monotonic()
                if now - last_status >= status_every:
                    self.send(status=status())
                    last_status = now

        threading.Thread(target=run, name="shardfs-notify", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
