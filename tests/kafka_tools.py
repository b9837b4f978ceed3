"""Apache Kafka's own tools and Kafka Streams (4.3.1), from the jars `bench/kafka/fetch.sh`
resolves into bench/lab/kafka-libs (or KEEL_KAFKA_LIBS). Without them, or
without `java`, a test that needs them is skipped, unless CI=true, where it
fails (.ci/run fetches them)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KAFKA_VERSION = "4.3.1"
LIBS = Path(os.environ.get("KEEL_KAFKA_LIBS", REPO / "bench" / "lab" / "kafka-libs"))
LOG4J = REPO / "bench" / "kafka" / "tools-log4j2.properties"


def classpath() -> str:
    missing = None
    if shutil.which("java") is None:
        missing = "`java` is not on PATH"
    elif not (LIBS / f".complete-{KAFKA_VERSION}-streams").exists():
        missing = f"Apache Kafka {KAFKA_VERSION}'s jars are not in {LIBS}; run bench/kafka/fetch.sh"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing} (CI=true)")
        pytest.skip(missing)
    return f"{LIBS}/*"


def run(main_class: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """Runs one of Kafka's tool classes; returns the finished process."""
    cmd = ["java", "-Xmx256m", "-cp", classpath(), f"-Dlog4j2.configurationFile={LOG4J}",
           main_class, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)


def dump_log_segments(*files: Path, deep: bool = True) -> str:
    """`kafka-dump-log.sh --files ...` (DumpLogSegments): its output, after
    checking it exited cleanly."""
    args = ["--files", ",".join(str(f) for f in files)]
    if deep:
        args.append("--deep-iteration")
    done = run("org.apache.kafka.tools.DumpLogSegments", *args)
    assert done.returncode == 0, f"DumpLogSegments failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return done.stdout
