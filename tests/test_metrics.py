"""Keel explains itself: `/metrics` in Prometheus' format (parsed by the
Prometheus project's own Python parser), the slow-request log, the Grafana
dashboard's metrics, and a real Prometheus server scraping a running Keel."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from conftest import IMPL, REPO, free_port, terminate, unique, wait_until
from kclient import CLIENT_TIMEOUT_S, DeliveryLog, consume_range, create_topic, produce_all

pytestmark = pytest.mark.skipif(IMPL != "keel", reason="Keel's own metrics")

DASHBOARD = REPO / "docs" / "grafana" / "keel-dashboard.json"
SLOW_LOG = "keel::slow_request: "


def scrape(b) -> dict:
    """/metrics, parsed: family name -> family (with its samples)."""
    with urllib.request.urlopen(f"http://{b.admin}/metrics", timeout=CLIENT_TIMEOUT_S) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text"), r.headers
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(families: dict, name: str, **labels) -> float:
    """The value of the sample `name` whose labels include `labels`."""
    family = name
    for suffix in ("_total", "_count", "_sum", "_bucket"):
        if name.endswith(suffix) and name.removesuffix(suffix) in families:
            family = name.removesuffix(suffix)
    matches = [s.value for s in families[family].samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matches) == 1, f"{name}{labels}: {matches}"
    return matches[0]


def failpoint(b, rule: str) -> None:
    query = urllib.parse.quote_plus(rule)
    req = urllib.request.Request(f"http://{b.admin}/failpoints/add?{query}", method="POST")
    with urllib.request.urlopen(req, timeout=CLIENT_TIMEOUT_S) as r:
        assert r.status == 200


def slow_requests(b) -> list[dict]:
    return [json.loads(line.split(SLOW_LOG, 1)[1])
            for line in b.log_path.read_text(errors="replace").splitlines() if SLOW_LOG in line]


def test_requests_explain_their_stages_and_a_slow_write_is_logged_with_its_file_and_position(broker_factory):
    """Every request feeds per-API, per-stage histograms. A produce held up
    by a 1 s write (injected through the storage seam) is logged as one
    JSON line: who sent it, the stage that took the time, and the segment
    file and byte position it was written at."""
    b = broker_factory({"keel.request.slow.ms": "500"}, env={"KEEL_FAILPOINTS": "1"})
    topic = unique("metrics")
    create_topic(b.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": b.bootstrap, "client.id": "metrics-writer", "acks": "all",
                         "linger.ms": 0})
    produce_all(producer, ({"value": b"v%03d" % i} for i in range(20)), DeliveryLog(), topic)
    consume_range(b.bootstrap, topic, [0], 20)

    segment = b.data_dir / f"{topic}-0" / "00000000000000000000.log"
    size_before = segment.stat().st_size
    failpoint(b, f"write delay=1000 path={topic}-0/ times=1")
    produce_all(producer, [{"value": b"slow"}], DeliveryLog(), topic)

    logged = wait_until(lambda: [r for r in slow_requests(b) if r["api"] == "Produce"], 10,
                        "the slow produce to be logged")
    [slow] = logged
    assert slow["client_id"] == "metrics-writer"
    assert slow["client_address"].startswith("127.0.0.1:")
    assert slow["stages_ms"]["write"] >= 900, slow
    assert slow["total_ms"] >= slow["stages_ms"]["write"], slow
    [p] = slow["partitions"]
    assert (p["topic"], p["partition"], p["source"]) == (topic, 0, "append"), slow
    assert (p["file"], p["position"]) == (str(segment), size_before), slow
    assert p["bytes"] == segment.stat().st_size - size_before, slow
    # Only requests over the threshold are logged (a fetch's long poll does
    # not count towards it).
    for r in slow_requests(b):
        assert r["total_ms"] - r["stages_ms"].get("wait", 0) >= 500, r

    m = scrape(b)
    # librdkafka may batch the first 20 records into few requests: at
    # least one, and the slow one.
    produces = sample(m, "keel_requests_total", api="Produce")
    assert produces >= 2
    assert sample(m, "keel_request_stage_seconds_count", api="Produce", stage="write") == produces
    assert sample(m, "keel_request_stage_seconds_sum", api="Produce", stage="write") >= 0.9
    # The slow write is in a bucket above 0.8 s.
    assert produces - sample(m, "keel_request_stage_seconds_bucket", api="Produce", stage="write",
                             le="0.8192") >= 1
    for stage in ("receive", "connection", "decode", "validate", "queue", "lock", "encode", "send", "total"):
        assert sample(m, "keel_request_stage_seconds_count", api="Produce", stage=stage) == produces, stage
    # The wait in the socket's receive queue, from the kernel's receive
    # timestamps: plaintext reads are stamped once the kernel has turned
    # stamping on, right after the first connection asked.
    assert 1 <= sample(m, "keel_request_stage_seconds_count", api="Produce", stage="socket") <= produces
    assert sample(m, "keel_request_stage_seconds_count", api="Fetch", stage="read_cache") >= 1
    assert sample(m, "keel_bytes_in_total") == segment.stat().st_size
    assert sample(m, "keel_bytes_out_total", source="read_cache") >= size_before
    assert sample(m, "keel_slow_requests_total") >= 1
    assert sample(m, "keel_log_end_offset", topic=topic, partition="0") == 21
    assert sample(m, "keel_log_size_bytes", topic=topic, partition="0") == segment.stat().st_size
    assert sample(m, "keel_connections") >= 1
    assert sample(m, "keel_tail_cache_hit_bytes_total") >= size_before
    producer.flush(CLIENT_TIMEOUT_S)


def dashboard_queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for panel in dash["panels"] for t in panel["targets"]]


def dashboard_metrics() -> set[str]:
    names = set()
    for expr in dashboard_queries():
        for name in re.findall(r"\bkeel_[a-z0-9_]+", expr):
            names.add(re.sub(r"_(total|bucket|count|sum)$", "", name))
    return names


def test_every_metric_the_grafana_dashboard_names_is_served(broker_factory):
    b = broker_factory()
    topic = unique("dash")
    create_topic(b.bootstrap, topic, 1)
    produce_all(Producer({"bootstrap.servers": b.bootstrap}), [{"value": b"x"}], DeliveryLog(), topic)
    served = set(scrape(b))
    wanted = dashboard_metrics()
    assert len(wanted) >= 20, wanted
    assert wanted <= served, f"the dashboard names metrics /metrics does not serve: {sorted(wanted - served)}"


def prometheus_binary() -> str | None:
    return os.environ.get("KEEL_PROMETHEUS") or shutil.which("prometheus")


def prometheus_query(port: int, query: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=CLIENT_TIMEOUT_S) as r:
        answer = json.load(r)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_a_prometheus_server_scrapes_keel_and_the_dashboards_queries_return_data(broker_factory, tmp_path):
    binary = prometheus_binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus not installed (.ci/run installs Debian's package)")
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    b = broker_factory()
    topic = unique("prom")
    create_topic(b.bootstrap, topic, 1)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: keel\n    static_configs:\n"
        f"      - targets: ['{b.admin}']\n")
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def target_up():
            return prometheus_query(port, 'up{job="keel"} == 1')
        wait_until(target_up, 60, "Prometheus to scrape Keel")
        producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 0})
        deadline = time.monotonic() + 60
        answered: dict[str, list] = {}
        # Produce while Prometheus scrapes, until the dashboard's produce
        # panel has rates to show (a rate needs two scrapes).
        queries = dashboard_queries()
        produce_p99 = next(q for q in queries if 'api="Produce"' in q)
        while time.monotonic() < deadline:
            produce_all(producer, ({"value": b"p%d" % i} for i in range(50)), DeliveryLog(), topic)
            consume_range(b.bootstrap, topic, [0], 50, start_offset=sample_end(b, topic) - 50)
            answered = {q: prometheus_query(port, q) for q in queries}
            if answered[produce_p99] and prometheus_query(port, "keel_bytes_in_total > 0"):
                break
            time.sleep(1)
        assert answered[produce_p99], (tmp_path / "prometheus.log").read_text()[-3000:]
        stages = {r["metric"]["stage"] for r in answered[produce_p99]}
        assert {"write", "queue", "total"} <= stages, stages
        with_data = [q for q, result in answered.items() if result]
        assert len(with_data) >= len(queries) // 2, {q: bool(r) for q, r in answered.items()}
    finally:
        terminate(proc, "prometheus")
        log.close()


def sample_end(b, topic: str) -> int:
    return int(sample(scrape(b), "keel_log_end_offset", topic=topic, partition="0"))
