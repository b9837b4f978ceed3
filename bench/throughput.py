#!/usr/bin/env python3
"""Produce and consume throughput of Keel and Apache Kafka, same clients, same run.

Starts each broker in turn on loopback (never both at once, so they do not
share the two cores), runs Kafka's ProducerPerformance (the Java client) and
a confluent-kafka assign() consumer and kcat (when installed) against it,
and prints a table with the
Keel/Kafka ratio. A benchmark, not a test: it prints numbers, asserts none.

With `--cluster`, a third broker joins the comparison: a Keel cluster of
three brokers on one etcd (Debian's etcd-server) and one object store
(versitygw, as the tests run it), where acks=all is acknowledged only once
the batches are in a WAL object in the object store and committed in etcd
(docs/cluster.md). All of it shares this machine's two cores with the
clients, so its ratio to one node is the cost of that durability here,
not a cluster's throughput on machines of its own. Use `--acks all` and
`--partitions 3` (one partition per broker).

With `--security ssl` (or `both`) each broker also has an SSL listener
(a PEM keystore made for the run, Kafka's `ssl.*` keys on both brokers)
and the clients use it; the table then compares each broker over TLS with
the other over TLS, and with itself over plaintext.

usage: bench/throughput.py [--records N] [--record-size B] [--acks A]
                           [--partitions P] [--compression C]
                           [--rounds R] [--json FILE]
                           [--security plaintext|ssl|both] [--cluster]
The keel binary defaults to target/release/keel (build it with
`cargo build --release -p keel-server`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"port {port} did not open within {timeout_s}s")


class Tls:
    """A CA and a PEM broker key made for the run (the tests' certificate
    maker), and the clients' settings that trust it. The key is not
    encrypted: Java 17 cannot decrypt PBES2 PKCS #8 keys, so Kafka could
    not read one."""

    def __init__(self, dir: Path):
        sys.path.insert(0, str(REPO / "tests"))
        from pki import Pki
        pki = Pki(dir)
        pki.leaf("broker", server=True)
        self.keystore = dir / "broker.pem"
        self.java_config = dir / "client.properties"
        self.java_config.write_text(f"security.protocol=SSL\nssl.truststore.type=PEM\n"
                                    f"ssl.truststore.location={pki.ca}\n")
        self.rdkafka = {"security.protocol": "ssl", "ssl.ca.location": pki.ca}

    def broker_keys(self) -> dict[str, str]:
        """Kafka's keys, which both brokers read."""
        return {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(self.keystore)}


def run_perf(bootstrap: str, topic: str, args, tls: Tls | None = None) -> dict:
    env = dict(os.environ, RECORDS=str(args.records), RECORD_SIZE=str(args.record_size),
               ACKS=args.acks, PARTITIONS=str(args.partitions), CONSUMER="assign",
               PRODUCER_PROPS=f"compression.type={args.compression}")
    if tls:
        env.update(CLIENT_CONFIG=str(tls.java_config), ASSIGN_CONFIG=json.dumps(tls.rdkafka))
    out = subprocess.run([str(HERE / "kafka" / "perf.sh"), bootstrap, topic], env=env,
                         capture_output=True, text=True, timeout=900)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise SystemExit(f"perf.sh failed against {bootstrap}:\n{text[-3000:]}")
    prod = re.findall(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
                      r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th", text)
    cons = re.findall(r"assign-consumer: (\d+), ([\d.]+), ([\d.]+), ([\d.]+), (\d+)", text)
    if not prod or not cons:
        raise SystemExit(f"could not parse perf output:\n{text[-3000:]}")
    p, c = prod[-1], cons[-1]
    kcat = kcat_consume(bootstrap, topic, args, tls)
    return {**kcat, "produce_records_per_s": float(p[1]), "produce_mb_per_s": float(p[2]),
            "produce_latency_ms_avg": float(p[3]), "produce_latency_ms_p99": float(p[7]),
            "consume_mb_per_s": float(c[3]), "consume_records_per_s": float(c[4])}


def kcat_consume(bootstrap: str, topic: str, args, tls: Tls | None) -> dict:
    """librdkafka at C speed: kcat reads every partition from the beginning
    to the end offsets (no consumer group) and discards the records."""
    if not shutil.which("kcat"):
        return {}
    extra = [a for k, v in (tls.rdkafka.items() if tls else []) for a in ("-X", f"{k}={v}")]
    start = time.monotonic()
    subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q", *extra],
                   stdout=subprocess.DEVNULL, check=True, timeout=600)
    secs = time.monotonic() - start
    mb = args.records * args.record_size / 1048576
    return {"kcat_consume_mb_per_s": mb / secs, "kcat_consume_records_per_s": args.records / secs}


def ssl_port_beside(*taken: int) -> int:
    port = free_port()
    while port in taken:
        port = free_port()
    return port


def with_kafka(args, fn, tls: Tls | None = None):
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="kafka-bench-"))
    env = dict(os.environ)
    bootstrap = f"127.0.0.1:{port}"
    if tls:
        # start.sh's controller listens on port + 1; later lines win.
        ssl_port = ssl_port_beside(port, port + 1)
        bootstrap = f"127.0.0.1:{ssl_port}"
        props = {
            "listeners": f"PLAINTEXT://127.0.0.1:{port},SSL://{bootstrap},CONTROLLER://127.0.0.1:{port + 1}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},SSL://{bootstrap}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,CONTROLLER:PLAINTEXT",
            **tls.broker_keys(),
        }
        env["KAFKA_EXTRA_PROPS"] = "\n".join(f"{k}={v}" for k, v in props.items())
    subprocess.run([str(HERE / "kafka" / "start.sh"), str(port), str(data)], check=True,
                   stdout=subprocess.DEVNULL, env=env)
    try:
        return fn(bootstrap)
    finally:
        subprocess.run([str(HERE / "kafka" / "stop.sh"), str(data)], stdout=subprocess.DEVNULL)
        shutil.rmtree(data, ignore_errors=True)


def with_keel(args, fn, tls: Tls | None = None):
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="keel-bench-"))
    listen, bootstrap, sets = f"127.0.0.1:{port}", f"127.0.0.1:{port}", []
    if tls:
        ssl_port = ssl_port_beside(port)
        bootstrap = f"127.0.0.1:{ssl_port}"
        listen = f"PLAINTEXT://127.0.0.1:{port},SSL://{bootstrap}"
        sets = [a for k, v in tls.broker_keys().items() for a in ("--set", f"{k}={v}")]
    # The admin endpoint is off: a broker already running here may hold its port.
    proc = subprocess.Popen([args.keel, "serve", "--listen", listen, "--data-dir", str(data),
                             "--set", "keel.admin.listen=", *sets],
                            stderr=subprocess.DEVNULL)
    try:
        wait_port(int(bootstrap.rsplit(":", 1)[1]))
        return fn(bootstrap)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)


def secured_inter_broker(base: Path) -> dict[str, str]:
    """Settings of an INTERNAL inter-broker listener, SASL_SSL with PLAIN
    (TLS 1.3 from a CA made here; the broker's own user in the JAAS
    entry), beside the clients' PLAINTEXT one."""
    sys.path.insert(0, str(REPO / "tests"))
    from pki import Pki  # noqa: E402
    pki = Pki(base)
    pki.leaf("broker", server=True)
    return {
        "inter.broker.listener.name": "INTERNAL",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:SASL_SSL",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.internal.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.internal.plain.sasl.jaas.config":
            'org.apache.kafka.common.security.plain.PlainLoginModule required '
            'username="broker" password="broker-secret" user_broker="broker-secret";',
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(base / "broker.pem"),
        "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca,
    }


def with_keel_cluster(args, fn, tls: Tls | None = None, secured: bool = False):
    """Three Keel brokers on one etcd and one versitygw (see the module
    docs); `secured`: they send each other requests on a SASL_SSL listener
    ([`secured_inter_broker`])."""
    if tls:
        raise SystemExit("--cluster runs plaintext only")
    sys.path.insert(0, str(REPO / "tests"))
    from cluster_failover import Etcd  # noqa: E402 (bench/, beside this file)
    from s3server import S3Server  # noqa: E402
    base = Path(tempfile.mkdtemp(prefix="keel-cluster-bench-"))
    etcd = Etcd(base)
    s3 = S3Server(base / "s3")
    s3.start()
    procs, ports = [], []
    inter_broker = secured_inter_broker(base) if secured else {}
    try:
        for node in (1, 2, 3):
            port = free_port()
            ports.append(port)
            sets = dict(inter_broker)
            if secured:
                internal = free_port()
                sets["listeners"] = f"PLAINTEXT://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal}"
                sets["advertised.listeners"] = sets["listeners"]
            sets |= {
                "node.id": str(node),
                "keel.admin.listen": "",
                "keel.cluster.etcd.endpoints": etcd.endpoint,
                "keel.tier.remote": f"s3://{s3.bucket}",
                "keel.tier.remote.endpoint": s3.endpoint,
                "keel.tier.remote.region": s3.region,
                "keel.tier.remote.access.key.id": s3.access_key,
                "keel.tier.remote.secret.access.key": s3.secret_key,
            }
            cmd = [args.keel, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", str(base / f"keel-{node}")]
            procs.append(subprocess.Popen(cmd + [a for k, v in sets.items() for a in ("--set", f"{k}={v}")],
                                          stderr=open(base / f"keel-{node}.log", "wb")))
        try:
            for port in ports:
                wait_port(port)
        except SystemExit:
            for node in (1, 2, 3):
                print(f"--- keel-{node}.log", (base / f"keel-{node}.log").read_text()[-1500:], file=sys.stderr)
            raise
        time.sleep(2)  # every broker registered and sees the others
        return fn(",".join(f"127.0.0.1:{p}" for p in ports))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
        s3.stop()
        etcd.close()
        shutil.rmtree(base, ignore_errors=True)


def table(best: dict, columns: list[tuple[str, str]], ratios: list[tuple[str, str, str]]) -> str:
    """Each metric's best value per column, then each ratio (a / b)."""
    metrics = list(best[columns[0][0]])
    head = f"{'metric':<28}" + "".join(f"{label:>22}" for _, label in columns) \
        + "".join(f"{label:>22}" for label, _, _ in ratios)
    lines = [head]
    for m in metrics:
        row = f"{m:<28}" + "".join(f"{best[key].get(m, float('nan')):>22.1f}" for key, _ in columns)
        for _, a, b in ratios:
            x, y = best[a].get(m), best[b].get(m)
            row += f"{(x / y if x is not None and y else float('nan')):>22.2f}"
        lines.append(row)
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--acks", default="1")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--compression", choices=["none", "gzip", "snappy", "lz4", "zstd"], default="none",
                    help="the producer's compression.type")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--security", choices=["plaintext", "ssl", "both"], default="plaintext")
    ap.add_argument("--cluster", action="store_true", help="also a 3-broker Keel cluster (etcd, versitygw)")
    ap.add_argument("--keel", default=str(REPO / "target" / "release" / "keel"))
    ap.add_argument("--json")
    args = ap.parse_args()
    modes = ["plaintext", "ssl"] if args.security == "both" else [args.security]
    tls = Tls(Path(tempfile.mkdtemp(prefix="bench-tls-"))) if "ssl" in modes else None
    results: dict[str, list] = {}
    for mode in modes:
        for r in range(args.rounds):
            runners = [("kafka", with_kafka), ("keel", with_keel)]
            if args.cluster:
                runners.append(("keelcluster", with_keel_cluster))
            for name, runner in runners:
                key = f"{name}-{mode}"
                res = runner(args, lambda bs: run_perf(bs, f"perf-{r}", args, tls if mode == "ssl" else None),
                             tls if mode == "ssl" else None)
                print(f"round {r + 1} {key}: {res}", flush=True)
                results.setdefault(key, []).append(res)
    best = {k: {m: max(x[m] for x in v) if "per_s" in m else min(x[m] for x in v) for m in v[0]}
            for k, v in results.items()}
    print(f"\n{args.records} records x {args.record_size} B, acks={args.acks}, "
          f"compression={args.compression}, {args.partitions} partition(s), best of {args.rounds} rounds")
    names = ("kafka", "keel", "keelcluster") if args.cluster else ("kafka", "keel")
    columns = [(f"{n}-{m}", f"{n} {m}") for m in modes for n in names]
    ratios = [(f"keel/kafka {m[:5]}", f"keel-{m}", f"kafka-{m}") for m in modes]
    if args.cluster:
        ratios += [("cluster/kafka", "keelcluster-plaintext", "kafka-plaintext"),
                   ("cluster/keel", "keelcluster-plaintext", "keel-plaintext")]
    if len(modes) == 2:
        ratios += [(f"{n} ssl/plain", f"{n}-ssl", f"{n}-plaintext") for n in ("kafka", "keel")]
    print(table(best, columns, ratios))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": results, "best": best}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
