"""Run ``kvtier serve`` in a subprocess for tests.

The server is started the way an operator starts it (a YAML file, a listen
address, the secret in the environment), and the tests learn its port from
the one line it prints once it accepts connections.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import yaml

# Until `kvtier serve` is registered in kvtier.cli, run the click command directly.
SERVE = [sys.executable, "-c", "from kvtier.peer.server import serve_command; serve_command()"]
SECRET_ENV = "KVTIER_PEER_SECRET"


def node_config(root: Path, *, ram: str = "256MiB", disk: bool = True) -> dict[str, Any]:
    """A node's chain: RAM, written through to a directory under ``root``."""
    tiers: list[dict[str, Any]] = [{"name": "ram", "backend": "host", "capacity": ram}]
    if disk:
        tiers.append({"name": "disk", "backend": "fs", "url": f"file://{root}/disk",
                      "write": "through"})
    return {"chain": tiers}


def server_env(secret: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    if secret is not None:
        env[SECRET_ENV] = secret
    return env


def run_serve(args: list[str], *, secret: str | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``kvtier serve`` expecting it to exit by itself (refusing to start)."""
    return subprocess.run([*SERVE, *args], capture_output=True, text=True, timeout=timeout,
                          env=server_env(secret), check=False)


class PeerServer:
    """One ``kvtier serve`` process serving ``config`` (default: :func:`node_config`)."""

    def __init__(self, root: Path, *, config: dict[str, Any] | None = None,
                 listen: str = "127.0.0.1:0", secret: str | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.config_path = root / "node.yaml"
        self.config_path.write_text(yaml.safe_dump(config or node_config(root)))
        self.listen = listen
        self.secret = secret
        self.args = args
        self.log_path = root / "serve.log"
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""
        self._log: IO[str] | None = None

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    def start(self, timeout: float = 60) -> PeerServer:
        """Start and wait (up to ``timeout`` s) for the "listening on" line."""
        self._log = open(self.log_path, "a")  # noqa: SIM115 - closed in _reap
        self.proc = subprocess.Popen(
            [*SERVE, "--config", str(self.config_path), "--listen", self.listen,
             "--stats-interval", "0", *self.args],
            stdout=subprocess.PIPE, stderr=self._log, text=True, env=server_env(self.secret))
        lines: queue.Queue[str] = queue.Queue()
        stdout = self.proc.stdout
        assert stdout is not None

        def pump() -> None:  # readline blocks: read in a thread, wait with a deadline
            with stdout:  # closed here, at end of file, never under the reader's feet
                for line in stdout:
                    lines.put(line)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout
        prefix = "kvtier serve: listening on "
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if line.startswith(prefix):
                self.address = line[len(prefix):].strip()
                return self
        self.kill()
        raise AssertionError(f"kvtier serve did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM; the server must exit 0 (graceful) within ``timeout``."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"kvtier serve ignored SIGTERM:\n{self.log()}") from None
        self._reap()
        assert code == 0, f"kvtier serve exited {code}:\n{self.log()}"

    def kill(self) -> None:
        """SIGKILL: no chance to finish anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(60)
        self._reap()

    def _reap(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> PeerServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        if self.running():
            if exc[0] is None:
                self.stop()
            else:
                self.kill()
        else:
            self._reap()
