"""Shared fixtures for Keel's integration suite.

Every test talks to a real broker process over 127.0.0.1 with real clients.

Modes (environment):
  KEEL_BIN=path            keel binary (default <repo>/target/debug/keel).
  KEEL_TEST_BOOTSTRAP=h:p  run against an already running external broker
                           (e.g. Apache Kafka); tests that restart or kill the
                           broker, or need --set overrides, are skipped.
  KEEL_TEST_IMPL=kafka     start Apache Kafka from bench/kafka/ instead of keel
                           (same Broker API, restart/kill9 included), to check
                           that the tests themselves are right.
  KEEL_VERSITYGW=path      versitygw binary for the `s3server` fixture
                           (tests/s3server.py says where it looks otherwise).
  KEEL_ETCD=path           etcd binary for the `etcd` fixture (tests/etcdserver.py).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXTERNAL_BOOTSTRAP = os.environ.get("KEEL_TEST_BOOTSTRAP")
IMPL = os.environ.get("KEEL_TEST_IMPL", "keel")
START_TIMEOUT_S = float(os.environ.get("KEEL_TEST_START_TIMEOUT_S", "30"))
STOP_TIMEOUT_S = 30.0


def wait_until(cond, timeout_s: float, what: str, interval_s: float = 0.05):
    """Poll cond() until it returns a truthy value; fail with `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last_exc = None
    while True:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - reported below if we time out
            last_exc = e
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}"
                                 + (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(interval_s)


def terminate(proc: subprocess.Popen | None, what: str) -> None:
    """SIGTERM and wait for a clean exit (nothing to do if not running); a
    process that needs SIGKILL fails the test."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{what} ignored SIGTERM for {STOP_TIMEOUT_S}s")


def free_port() -> int:
    """A port that was free a moment ago, and whose +1 is free too (Kafka lab
    mode puts its controller there)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65535:
            continue
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair found")


def port_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def go_build(tmp_path_factory, src: Path, name: str) -> Path:
    """Builds the Go program in `src` into a fresh temporary dir. Without
    `go` on PATH the test is skipped, or failed under CI=true (CI installs
    Go, so a missing one is a broken setup, not a reason to skip)."""
    import shutil
    go = shutil.which("go")
    if go is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but `go` is not on PATH: {src} needs Go")
        pytest.skip(f"`go` is not on PATH; {src} cannot be built")
    out = tmp_path_factory.mktemp(name) / name
    build = subprocess.run([go, "build", "-o", str(out), "."], cwd=src,
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, f"go build failed:\n{build.stdout}\n{build.stderr}"
    return out


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Broker:
    """A keel process on 127.0.0.1:port with its own data dir; `admin` is its
    admin HTTP endpoint ("127.0.0.1:port", None where there is none).

    The port and data dir stay the same across stop/start/restart/kill9, so
    clients can reconnect and data must survive.
    """

    restartable = True
    has_admin = True

    def __init__(self, data_dir: Path, log_path: Path, sets: dict[str, str] | None = None,
                 env: dict[str, str] | None = None, nofile: int | None = None):
        self.bin = Path(os.environ.get("KEEL_BIN", REPO / "target" / "debug" / "keel"))
        self.data_dir = Path(data_dir)
        self.log_path = Path(log_path)
        self.sets = dict(sets or {})
        # Extra environment (KEEL_FAILPOINTS=1), and a hard open-files limit.
        self.env = dict(env or {})
        self.nofile = nofile
        self.port = free_port()
        self.admin: str | None = None
        if self.has_admin:
            # A free port of its own, so brokers never collide on the
            # default; an explicit empty keel.admin.listen disables it.
            if "keel.admin.listen" not in self.sets:
                admin_port = free_port()
                while admin_port in (self.port, self.port + 1):
                    admin_port = free_port()
                self.sets["keel.admin.listen"] = f"127.0.0.1:{admin_port}"
            self.admin = self.sets["keel.admin.listen"] or None
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [str(self.bin), "serve", "--listen", self.bootstrap,
               "--advertised", self.bootstrap, "--data-dir", str(self.data_dir)]
        for k, v in self.sets.items():
            cmd += ["--set", f"{k}={v}"]
        return cmd

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        if not self.bin.exists():
            raise AssertionError(f"keel binary not found at {self.bin} (build it, or set KEEL_BIN)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log = open(self.log_path, "ab")
        log.write(f"\n===== start #{self.starts}: {' '.join(self.command())}\n".encode())
        log.flush()
        nofile = self.nofile

        def limit():
            if nofile is not None:
                import resource
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=dict(os.environ, **self.env),
                                     preexec_fn=limit if nofile is not None else None)
        log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"broker exited with {self.proc.returncode} during startup:\n"
                                     + self.log_tail())
            return port_accepts(self.port) and (
                self.admin is None or port_accepts(int(self.admin.rsplit(":", 1)[1])))
        wait_until(ready, START_TIMEOUT_S, f"broker to listen on {self.bootstrap}")

    def stop(self) -> None:
        """SIGTERM and wait for a clean exit; a broker that needs SIGKILL fails the test."""
        terminate(self.proc, "broker")

    def kill9(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, "broker not running"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT_S)

    def restart(self) -> None:
        self.stop()
        self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n_bytes: int = 20000) -> str:
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return "(no log)"
        return data[-n_bytes:].decode(errors="replace")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class KafkaLabBroker(Broker):
    """Apache Kafka started by bench/kafka/start.sh, driven like a keel Broker
    (KEEL_TEST_IMPL=kafka). Only the `sets` that are Kafka config keys apply."""

    has_admin = False

    def command(self) -> list[str]:
        return [str(REPO / "bench" / "kafka" / "start.sh"), str(self.port), str(self.data_dir)]

    def _pid(self) -> int | None:
        try:
            return int((self.data_dir / "kafka.pid").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        env = dict(os.environ, KAFKA_EXTRA_PROPS="\n".join(f"{k}={v}" for k, v in self.sets.items()),
                   KAFKA_START_TIMEOUT_S=str(int(START_TIMEOUT_S * 2)))
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(self.command())}\n".encode())
            log.flush()
            subprocess.run(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                           check=True, timeout=START_TIMEOUT_S * 3)

    @staticmethod
    def _pid_running(pid: int) -> bool:
        # A killed JVM lingers as a zombie until init reaps it: not running.
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            return False
        return state != "Z"

    def _running(self) -> bool:
        pid = self._pid()
        return pid is not None and self._pid_running(pid)

    def _wait_gone(self, pid: int) -> None:
        wait_until(lambda: not self._pid_running(pid), STOP_TIMEOUT_S * 2, f"kafka pid {pid} to exit")

    def stop(self) -> None:
        if self._running():
            subprocess.run([str(REPO / "bench" / "kafka" / "stop.sh"), str(self.data_dir)],
                           check=True, capture_output=True, timeout=STOP_TIMEOUT_S * 3)

    def kill9(self) -> None:
        pid = self._pid()
        assert pid is not None and self._running(), "kafka not running"
        os.kill(pid, signal.SIGKILL)
        self._wait_gone(pid)

    def alive(self) -> bool:
        return self._running()

    def log_tail(self, n_bytes: int = 20000) -> str:
        parts = []
        for p in (self.log_path, self.data_dir / "stderr.log"):
            if p.exists():
                parts.append(f"--- {p}\n" + p.read_bytes()[-n_bytes:].decode(errors="replace"))
        return "\n".join(parts) or "(no log)"

    def close(self) -> None:
        pid = self._pid()
        if pid is not None and self._running():
            os.kill(pid, signal.SIGKILL)
            self._wait_gone(pid)


class ExternalBroker:
    """A broker someone else runs (KEEL_TEST_BOOTSTRAP); cannot be restarted."""

    restartable = False
    admin = None

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        host, port = bootstrap.rsplit(":", 1)
        self.port = int(port)

    def _skip(self, *_a, **_k):
        pytest.skip("needs a broker the suite controls (KEEL_TEST_BOOTSTRAP is set)")

    start = stop = kill9 = restart = _skip

    def alive(self) -> bool:
        return port_accepts(self.port)

    def log_tail(self, n_bytes: int = 20000) -> str:
        return "(external broker: no log)"

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- fixtures

def _make_broker(tmp_path_factory, name: str, sets=None, **options):
    if EXTERNAL_BOOTSTRAP:
        if sets or options:
            pytest.skip("needs --set overrides on a broker the suite starts")
        return ExternalBroker(EXTERNAL_BOOTSTRAP)
    # pytest keeps the last few runs' tmp dirs, so broker logs and data of a
    # failed run can be inspected afterwards.
    base = tmp_path_factory.mktemp(f"keel-{name}")
    cls = KafkaLabBroker if IMPL == "kafka" else Broker
    b = cls(base / "data", base / "broker.log", sets=sets, **options)
    b.start()
    return b


# Brokers and S3 servers alive now, whose logs a failing test's report gets.
_live_brokers: list = []

# Brokers a test started itself (a cluster's members), closed when it ends
# whether or not it closed them: one left running would rejoin a later
# test's etcd that happens to get its old port.
_started_by_test: list = []


@pytest.fixture(autouse=True)
def _close_brokers_the_test_started():
    yield
    while _started_by_test:
        b = _started_by_test.pop()
        if b in _live_brokers:
            _live_brokers.remove(b)
        b.close()


def _register(b):
    _live_brokers.append(b)
    return b


@pytest.fixture
def broker(tmp_path_factory):
    """A fresh broker for this test alone (restart/kill9 allowed)."""
    b = _register(_make_broker(tmp_path_factory, "fn"))
    yield b
    _live_brokers.remove(b)
    b.close()


@pytest.fixture
def broker_factory(tmp_path_factory):
    """broker_factory(sets={...}, env={...}, nofile=N) -> a fresh broker
    started with --set overrides (and extra environment, a hard open-files
    limit)."""
    made = []

    def make(sets=None, **options):
        b = _register(_make_broker(tmp_path_factory, "fn", sets, **options))
        made.append(b)
        return b
    yield make
    for b in made:
        _live_brokers.remove(b)
        b.close()


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory):
    """One broker for a whole test module; tests must use unique topic names
    and must not restart it."""
    b = _register(_make_broker(tmp_path_factory, "mod"))
    yield b
    _live_brokers.remove(b)
    b.close()


class ServerProcess:
    """What the suite's helper servers (tests/s3server.py, tests/etcdserver.py)
    share: a process `proc` writing to `log_path`."""

    proc: subprocess.Popen | None = None
    log_path: Path

    def kill9(self) -> None:
        assert self.alive(), f"{self.log_name} not running"
        self.proc.kill()
        self.proc.wait(timeout=STOP_TIMEOUT_S)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n_bytes: int = 20000) -> str:
        try:
            return self.log_path.read_bytes()[-n_bytes:].decode(errors="replace")
        except FileNotFoundError:
            return "(no log)"

    def close(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait()


def _server(request, what: str, found: bool, hint: str, make):
    """A server process the suite drives (`make()` builds it), started for
    one test and closed after it; its log goes with a failing test's
    report. Without its binary the test is skipped, unless CI=true, where
    it fails (.ci/run installs it)."""
    if not found:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} not found (CI=true); install it with {hint}")
        pytest.skip(f"{what} not found; install it with {hint}")
    s = _register(make())

    def teardown():
        _live_brokers.remove(s)
        s.close()
    # A finalizer rather than a yield, so a server that fails to start is
    # still registered when the setup failure is reported, and its log shows.
    request.addfinalizer(teardown)
    s.start()
    return s


@pytest.fixture
def s3server(request, tmp_path_factory):
    """A fresh S3-compatible server (versitygw, posix backend) with one empty
    bucket, for this test alone (stop/start/kill9 allowed). See
    tests/s3server.py."""
    # Imported here: s3server imports helpers from this module.
    from s3server import INSTALL_HINT, S3Server, find_versitygw
    return _server(request, "versitygw", find_versitygw() is not None, INSTALL_HINT,
                   lambda: S3Server(tmp_path_factory.mktemp("s3")))


@pytest.fixture
def etcd(request, tmp_path_factory):
    """A fresh etcd (one member, loopback ports) for this test alone
    (stop/start allowed). See tests/etcdserver.py."""
    from etcdserver import INSTALL_HINT, EtcdServer, find_etcd
    return _server(request, "etcd", find_etcd() is not None, INSTALL_HINT,
                   lambda: EtcdServer(tmp_path_factory.mktemp("etcd")))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On failure, attach the log of every broker (and S3 server) alive during
    the test."""
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for b in list(_live_brokers):
            name = getattr(b, "log_name", "broker")
            where = getattr(b, "log_path", None) or b.bootstrap
            rep.sections.append((f"{name} log ({where})", b.log_tail()))
