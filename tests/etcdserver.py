"""A real etcd for the cluster tests: Debian's `etcd-server` (the `etcd`
binary), one member on loopback ports with its own data dir.

The ports and data dir stay the same across stop/start, so a test can take
the coordination store away and bring it back with its keys intact.

Environment:
  KEEL_ETCD=path   etcd binary (default: `etcd` on PATH, which .ci/run
                   installs with apt-get).
"""
from __future__ import annotations

import os
import shutil
import json
import subprocess
import urllib.request
from pathlib import Path

from conftest import ServerProcess, free_port, port_accepts, terminate, wait_until

INSTALL_HINT = "apt-get install etcd-server (tests/setup.sh does this)"
START_TIMEOUT_S = 30.0


def find_etcd() -> Path | None:
    explicit = os.environ.get("KEEL_ETCD")
    if explicit:
        return Path(explicit)
    found = shutil.which("etcd")
    return Path(found) if found else None


class EtcdServer(ServerProcess):
    log_name = "etcd"

    def __init__(self, base_dir: Path, binary: Path | None = None):
        self.bin = binary or find_etcd()
        self.base_dir = Path(base_dir)
        self.data_dir = self.base_dir / "data"
        self.log_path = self.base_dir / "etcd.log"
        self.client_port = free_port()
        self.peer_port = free_port()
        while self.peer_port == self.client_port:
            self.peer_port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def bootstrap(self) -> str:
        return self.endpoint

    def command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [str(self.bin), "--name", "keel-test", "--data-dir", str(self.data_dir),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"keel-test={peer}",
                # Leases are checked against a 100 ms heartbeat.
                "--heartbeat-interval", "100", "--election-timeout", "1000"]

    def start(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"etcd exited with {self.proc.returncode}:\n{self.log_tail()}")
            if not port_accepts(self.client_port):
                return False
            # Listening comes before electing itself leader; /health says
            # when it serves.
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=5) as r:
                return json.load(r).get("health") == "true"
        wait_until(ready, START_TIMEOUT_S, f"etcd to serve on {self.endpoint}")

    def stop(self) -> None:
        terminate(self.proc, "etcd")

