"""A ``vllm_runner.py`` engine process started at once, its stdout read as it comes.

``until(kind)`` waits for the runner's next ``KVTIER-RUNNER <kind>`` line, so
several engines can run together and be collected later; ``resume()`` answers
a paused runner; ``result()`` is the final JSON.  The engine tests subclass
it with the command lines they need.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any


class RunnerProcess:
    def __init__(self, cmd: list[str], cwd: Path, log: Path, env: dict[str, str]) -> None:
        self.log = log
        with open(self.log, "w") as stderr:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, text=True, cwd=cwd, env=env)
        self.lines: list[str] = []
        self._seen = 0  # lines already searched by until()
        self._cond = threading.Condition()
        self._eof = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    @property
    def stdout(self) -> str:
        with self._cond:
            return "".join(self.lines)

    def until(self, kind: str, timeout: float = 420.0) -> str:
        prefix = f"KVTIER-RUNNER {kind} "
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i in range(self._seen, len(self.lines)):
                    if self.lines[i].startswith(prefix):
                        self._seen = i + 1
                        return self.lines[i][len(prefix):]
                self._seen = len(self.lines)
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    break
                self._cond.wait(left)
        self.proc.kill()
        code = self.proc.wait()
        tail = self.stdout[-3000:] + self.log.read_text()[-4000:]
        raise AssertionError(f"runner ended ({code}) before {kind}:\n{tail}")

    def resume(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        payload: dict[str, Any] = json.loads(self.until("RESULT"))
        assert self.proc.wait(60) == 0, self.log.read_text()[-4000:]
        return payload

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
