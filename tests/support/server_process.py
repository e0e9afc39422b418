"""The process lifecycle the test servers share (SeaweedFS, redis-server).

A subclass starts its server as ``self._proc`` (then calls :meth:`_track`)
and writes its log to ``self.log_path``; stopping, killing, the context
manager and the log tail are the same for every server.
"""

from __future__ import annotations

import atexit
import signal
import subprocess
from pathlib import Path
from typing import TypeVar

_Started = TypeVar("_Started", bound="StartedInWith")


class StartedInWith:
    """``with`` starts the server and stops it on the way out, whatever the block did.

    For a single server and for the clusters of several, so that a fixture is
    ``with Server(...) as server: yield server``.
    """

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Started) -> _Started:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServerProcess(StartedInWith):
    log_path: Path
    _proc: subprocess.Popen[bytes] | None = None
    stop_timeout = 15.0  # seconds from SIGTERM to SIGKILL
    log_lines = 40  # lines of log quoted in error messages

    def start(self) -> None:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _track(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        atexit.register(self._atexit_kill, proc)

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(self.stop_timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL at once: a crash, for fault tests."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    @staticmethod
    def _atexit_kill(proc: subprocess.Popen[bytes]) -> None:
        # a test run that dies without finalizers must not leave a server behind
        if proc.poll() is None:
            proc.kill()

    def log_tail(self, lines: int | None = None) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-(lines or self.log_lines):])
