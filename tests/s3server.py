"""A real S3-compatible server for the tiered-storage tests: versitygw with
its posix backend, on 127.0.0.1 only, one fresh data dir per server.

versitygw's posix backend keeps every object as a plain file:

    <data_dir>/<bucket>/<key>        key split on "/" into directories

so tests can list, read and corrupt objects directly (`object_path`,
`object_keys`). ETag, content type and checksums live in `user.*` xattrs of
that file, so overwriting the file by hand changes what GET returns but not
the stored ETag. versitygw also keeps its own bookkeeping there, which is not
an object: `<data_dir>/.vgwlocks/` (conditional-put locks) and
`<bucket>/.sgwtmp/` (temp files, multipart parts).

The port and data dir stay the same across stop/start, so a test can take
the object store away and bring it back with its objects intact.

Environment:
  KEEL_VERSITYGW=path   versitygw binary (default: `versitygw` on PATH, then
                        $GOBIN, then $GOPATH/bin or ~/go/bin, where .ci/run
                        installs it).

Usable on its own as a context manager:

    with S3Server(tmp / "s3") as s3:
        client = s3.client()
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from conftest import ServerProcess, free_port, terminate
from s3client import S3Client

VERSITYGW_VERSION = "v1.8.0"
INSTALL_HINT = (f"go install github.com/versity/versitygw/cmd/versitygw@{VERSITYGW_VERSION}"
                " (.ci/run does this)")
START_TIMEOUT_S = 30.0

# versitygw's bookkeeping inside the data dir and inside each bucket.
ROOT_INTERNAL = {".vgwlocks"}
BUCKET_INTERNAL = {".sgwtmp"}


def find_versitygw() -> Path | None:
    explicit = os.environ.get("KEEL_VERSITYGW")
    if explicit:
        return Path(explicit)
    on_path = shutil.which("versitygw")
    if on_path:
        return Path(on_path)
    dirs = [os.environ.get("GOBIN"),
            *(str(Path(p) / "bin") for p in os.environ.get("GOPATH", "").split(os.pathsep) if p),
            str(Path.home() / "go" / "bin")]
    for d in dirs:
        if d and (Path(d) / "versitygw").is_file():
            return Path(d) / "versitygw"
    return None


class S3Server(ServerProcess):
    """versitygw on 127.0.0.1:port serving `data_dir` through its posix backend,
    with one bucket (`bucket`) created through the S3 API on first start."""

    access_key = "keel-test-access"
    secret_key = "keel-test-secret"
    region = "us-east-1"
    log_name = "versitygw"  # in failing tests' reports (conftest.py)

    def __init__(self, base_dir: Path, bucket: str = "keel-tier", binary: Path | None = None):
        self.bin = binary or find_versitygw()
        if self.bin is None:
            raise FileNotFoundError(f"versitygw not found; install it with {INSTALL_HINT}")
        base_dir = Path(base_dir)
        self.data_dir = base_dir / "objects"
        self.log_path = base_dir / "versitygw.log"
        # Its working directory: nothing of it should land in the repo.
        self.work_dir = base_dir / "work"
        self.bucket = bucket
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    # ------------------------------------------------------------ addresses

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def bucket_dir(self) -> Path:
        return self.data_dir / self.bucket

    def client(self, secret_key: str | None = None) -> S3Client:
        return S3Client(self.endpoint, self.region, self.access_key,
                        secret_key if secret_key is not None else self.secret_key)

    # ------------------------------------------------------------ objects as files

    def object_path(self, key: str, bucket: str | None = None) -> Path:
        """The plain file that holds object `key`."""
        return self.data_dir / (bucket or self.bucket) / key

    def object_keys(self, bucket: str | None = None) -> list[str]:
        """Every object key in the bucket, read from the file system (sorted;
        versitygw's own files left out)."""
        root = self.data_dir / (bucket or self.bucket)
        keys = []
        for dirpath, dirnames, filenames in os.walk(root):
            if Path(dirpath) == root:
                dirnames[:] = [d for d in dirnames if d not in BUCKET_INTERNAL]
            rel = Path(dirpath).relative_to(root)
            keys += [(rel / f).as_posix() for f in filenames]
        return sorted(keys)

    # ------------------------------------------------------------ process

    def command(self) -> list[str]:
        # Flags rather than versitygw's environment variables (ROOT_ACCESS_KEY,
        # VGW_*), and the environment scrubbed of those, so a stray variable
        # on a developer's machine cannot change the server under test.
        return [str(self.bin), "--port", f"127.0.0.1:{self.port}",
                "--access", self.access_key, "--secret", self.secret_key,
                "--region", self.region, "posix", str(self.data_dir)]

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        env = {k: v for k, v in os.environ.items()
               if not (k.startswith(("VGW_", "ROOT_")) or k in ("LOGFILE", "WEBHOOK"))}
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.work_dir, env=env)
        self._wait_ready()
        # Through the S3 API rather than mkdir, so the bucket gets the owner
        # and ACL xattrs a real CreateBucket gives it.
        if self.client().head_bucket(self.bucket) == 404:
            self.client().create_bucket(self.bucket)
        assert self.client().head_bucket(self.bucket) == 200, f"bucket {self.bucket} missing"

    def _wait_ready(self) -> None:
        # Listening is not enough: wait for a signed request (ListBuckets) to
        # be served. A process that exits fails at once, with its log.
        deadline = time.monotonic() + START_TIMEOUT_S
        client = self.client()
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"versitygw exited with {self.proc.returncode} during"
                                     f" startup:\n{self.log_tail()}")
            try:
                status = client.request("GET", "").status
                if status == 200:
                    return
                last = f"ListBuckets answered {status}"
            except OSError as e:
                last = repr(e)
            if time.monotonic() >= deadline:
                raise AssertionError(f"versitygw not serving S3 on {self.endpoint} after"
                                     f" {START_TIMEOUT_S}s (last: {last}):\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM and wait: the object store is gone, its data stays."""
        terminate(self.proc, "versitygw")

    def __enter__(self) -> "S3Server":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
