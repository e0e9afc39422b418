"""A real Redis server for tests: Debian's ``redis-server`` on a free port of 127.0.0.1.

:class:`RedisServer` runs one ``redis-server`` process bound to 127.0.0.1 with
persistence switched off (no RDB snapshots, no append-only file) and its
working directory, log and any file it might still write under a directory of
the caller's, so nothing lands outside the test's temporary tree.  ``stop``
and a later ``start`` reuse the same port: a restart (which loses every block,
persistence being off), not a new server.

:func:`find_redis_server` looks on ``PATH`` and in Debian's locations; when
the binary is missing and the process runs as root (a CI container), it
installs Debian's ``redis-server`` package with ``apt-get``.  Readiness is a
``PING`` answered ``+PONG`` over a plain socket, so the helper needs no Redis
client library.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from server_process import ServerProcess

__all__ = ["RedisServer", "find_redis_server"]

_DEBIAN_PATHS = ("/usr/bin/redis-server", "/usr/sbin/redis-server", "/usr/local/bin/redis-server")


def _which() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    for path in _DEBIAN_PATHS:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _apt_install() -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "redis-server"]
    first = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
    if first.returncode == 0:
        return
    # a clean machine has no package lists yet: fetch them once, then retry
    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, check=True)
    subprocess.run(install, env=env, capture_output=True, check=True)


def find_redis_server(install: bool = True) -> str:
    """Path of ``redis-server``; installed with apt-get when missing and running as root."""
    found = _which()
    if found:
        return found
    can_install = install and os.name == "posix" and os.geteuid() == 0 and shutil.which("apt-get")
    if can_install:
        try:
            _apt_install()
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or b"").decode(errors="replace")[-2000:]
            raise FileNotFoundError(f"apt-get could not install redis-server: {detail}") from exc
        found = _which()
        if found:
            return found
    raise FileNotFoundError(
        "no redis-server binary: install Debian's package (apt-get install redis-server)"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _ping(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer(ServerProcess):
    """One ``redis-server`` on ``127.0.0.1:port``; see the module docstring.

    ``base_dir`` receives ``redis.log`` (the server's log, appended across
    restarts) and is the server's working directory.
    """

    stop_timeout = 10.0  # SIGTERM saves nothing (snapshots are off): it exits at once
    log_lines = 30

    def __init__(self, base_dir: str | os.PathLike[str], *, startup_timeout: float = 30.0) -> None:
        self.base_dir = Path(base_dir)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.base_dir / "redis.log"
        self.startup_timeout = startup_timeout
        self.binary = find_redis_server()
        self.port = _free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def command(self) -> list[str]:
        return [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.base_dir),
            "--logfile", str(self.log_path),
            "--daemonize", "no",
            "--save", "",  # no RDB snapshots
            "--appendonly", "no",
            "--databases", "16",
        ]

    def start(self) -> None:
        """Start (or restart) on the same port; wait until it answers PING."""
        if self.running:
            return
        self._track(subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.base_dir,
            start_new_session=True,  # a Ctrl-C in the terminal is pytest's
        ))
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if not self.running:
                code = self._proc.returncode
                raise RuntimeError(
                    f"redis-server exited with status {code} during startup; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if _ping(self.port):
                return
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(
            f"redis-server on port {self.port} did not answer PING within "
            f"{self.startup_timeout:.0f}s; log {self.log_path}:\n{self.log_tail()}"
        )
