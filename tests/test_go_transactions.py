"""Transactions with franz-go, a client nobody here wrote: its
GroupTransactSession (tests/go/txnsession) runs a consume-transform-produce
loop under transactions v2 while three group members join and leave, into
an output topic created just before with eight partitions, and checks that
the output holds every input record exactly once.

The first produce of each transaction names all eight partitions in one
request. Keel used to add each of them to the transaction on its own, at
the same time: all but one were refused (CONCURRENT_TRANSACTIONS, answered
as NOT_ENOUGH_REPLICAS), and franz-go retries those only after a metadata
refresh, at most one every five seconds, so a transaction's first produce
took half a minute, outlived its transaction timeout, was aborted by the
coordinator under a fencing epoch, and its retry got PRODUCER_FENCED.

Without `go` the test is skipped, unless CI=true, where it fails."""
from __future__ import annotations

import subprocess

import pytest

from conftest import REPO, go_build, unique

SRC = REPO / "tests" / "go" / "txnsession"


@pytest.fixture(scope="module")
def txnsession(tmp_path_factory):
    return go_build(tmp_path_factory, SRC, "txnsession")


def test_group_transact_session_across_rebalances(txnsession, broker_factory):
    # Members join at once instead of after Kafka's 3 s initial delay, so
    # the group rebalances while transactions run.
    broker = broker_factory(sets={"group.initial.rebalance.delay.ms": "0"})
    name = unique("txs")
    run = subprocess.run(
        [str(txnsession), "--bootstrap", broker.bootstrap,
         "--input", f"{name}-in", "--output", f"{name}-out", "--group", name,
         "--txn-prefix", name, "--output-partitions", "8", "--members", "3",
         "--records", "1500", "--rejoins", "1", "--txn-timeout", "10s",
         "--end-timeout", "50s", "--deadline", "60s"],
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr[-30000:]}"
    assert "exactly once" in run.stdout, run.stdout
