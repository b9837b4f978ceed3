use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};

use super::*;

struct ManualClock(AtomicI64);

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

fn config() -> TxnConfig {
    TxnConfig {
        max_timeout_ms: 900_000,
        id_expiration_ms: 1_000_000,
        log_segment_bytes: 1 << 20,
    }
}

fn open(dir: &Path, clock: &Arc<ManualClock>) -> TxnCoordinator {
    let clock: Arc<dyn Clock> = clock.clone();
    TxnCoordinator::open_with(keel_log::DiskStorage::shared(), dir, config(), clock).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

#[test]
fn states_are_persisted_and_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock(AtomicI64::new(1_000)));
    let rt = runtime();
    let fenced = ResponseError::ProducerFenced;
    let p = vec![("t".to_string(), 0)];
    let prepared = {
        let c = open(dir.path(), &clock);
        assert_eq!(
            rt.block_on(c.init_producer_id("tx", 0, None, None, 2)),
            Err(ResponseError::InvalidTransactionTimeout)
        );
        assert_eq!(
            rt.block_on(c.init_producer_id("tx", 60_000, None, None, 2)),
            Ok(InitOutcome::NeedProducerId)
        );
        assert_eq!(
            rt.block_on(c.init_producer_id("tx", 60_000, None, Some(11), 2)),
            Ok(InitOutcome::Ready(11, 0))
        );
        rt.block_on(c.add_partitions("tx", 11, 0, &p, 0, fenced)).unwrap();
        assert_eq!(c.verify("tx", 11, 0, &p[0]), Ok(()));
        assert_eq!(
            c.verify("tx", 11, 0, &("t".into(), 1)),
            Err(ResponseError::InvalidTxnState)
        );
        let Ok(EndOutcome::Prepared(prepared)) =
            rt.block_on(c.end_txn("tx", (11, 0), true, false, None, fenced))
        else {
            panic!("an open transaction prepares");
        };
        assert_eq!(prepared.status, TxnStatus::PrepareCommit);
        c.close();
        prepared
    };
    // The markers were not written: the reopened coordinator says so.
    let c = open(dir.path(), &clock);
    assert_eq!(c.unfinished(), vec![("tx".to_string(), prepared.clone())]);
    rt.block_on(c.complete("tx", &prepared)).unwrap();
    assert!(c.unfinished().is_empty());
    assert_eq!(
        rt.block_on(c.end_txn("tx", (11, 0), true, false, None, fenced)),
        Ok(EndOutcome::Done(11, 0)),
        "a retried commit"
    );
    assert_eq!(
        rt.block_on(c.init_producer_id("tx", 60_000, None, None, 2)),
        Ok(InitOutcome::Ready(11, 1))
    );
    c.close();
    let c = open(dir.path(), &clock);
    let all = c.describe_all();
    assert_eq!(all.len(), 1);
    assert_eq!(
        (all[0].state.producer_epoch, all[0].state.status),
        (1, TxnStatus::Empty)
    );
    c.close();
}

#[test]
fn open_transactions_past_their_timeout_are_aborted_and_idle_ids_expire() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock(AtomicI64::new(0)));
    let rt = runtime();
    let c = open(dir.path(), &clock);
    rt.block_on(c.init_producer_id("tx", 1_000, None, Some(5), 2))
        .unwrap();
    rt.block_on(c.add_partitions("tx", 5, 0, &[("t".into(), 0)], 0, ResponseError::ProducerFenced))
        .unwrap();
    clock.0.store(1_000, Ordering::SeqCst);
    assert!(rt.block_on(c.abort_timed_out(2)).is_empty());
    clock.0.store(1_001, Ordering::SeqCst);
    let aborted = rt.block_on(c.abort_timed_out(2));
    assert_eq!(aborted.len(), 1);
    assert_eq!(aborted[0].1.producer_epoch, 1, "the producer is fenced");
    // The fenced producer's EndTxn is refused.
    assert_eq!(
        rt.block_on(c.end_txn("tx", (5, 0), true, false, None, ResponseError::ProducerFenced)),
        Err(ResponseError::ProducerFenced)
    );
    rt.block_on(c.complete("tx", &aborted[0].1)).unwrap();
    clock.0.store(10_000_000, Ordering::SeqCst);
    rt.block_on(c.expire_ids());
    assert!(c.describe_all().is_empty());
    c.close();
}

/// Transactions v2 across restarts: the new producer id an exhausted
/// epoch hands over to is in the log with the Prepare state, so a restart
/// before the markers completes under the id the client already has.
#[test]
fn a_hand_over_to_a_new_producer_id_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock(AtomicI64::new(1_000)));
    let rt = runtime();
    let fenced = ResponseError::ProducerFenced;
    let p = vec![("t".to_string(), 0)];
    let c = open(dir.path(), &clock);
    rt.block_on(c.init_producer_id("tx", 60_000, None, Some(20), 2))
        .unwrap();
    for epoch in 0..3 {
        rt.block_on(c.add_partitions("tx", 20, epoch, &p, state::TRANSACTION_VERSION_2, fenced))
            .unwrap();
        let Ok(EndOutcome::Prepared(prepared)) =
            rt.block_on(c.end_txn("tx", (20, epoch), true, true, None, fenced))
        else {
            panic!("an open transaction prepares");
        };
        assert_eq!(prepared.handed_out(), (20, epoch + 1));
        rt.block_on(c.complete("tx", &prepared)).unwrap();
    }
    c.close();
    // Fast-forward to the last epoch a client may hold.
    let mut last = open(dir.path(), &clock).describe("tx").unwrap();
    assert_eq!(
        (last.producer_epoch, last.client_version),
        (3, state::TRANSACTION_VERSION_2)
    );
    last.producer_epoch = i16::MAX - 1;
    {
        let c = open(dir.path(), &clock);
        rt.block_on(c.persist("tx", last)).unwrap();
        c.close();
    }
    let c = open(dir.path(), &clock);
    rt.block_on(c.add_partitions("tx", 20, i16::MAX - 1, &p, state::TRANSACTION_VERSION_2, fenced))
        .unwrap();
    let end = |fresh| rt.block_on(c.end_txn("tx", (20, i16::MAX - 1), true, true, fresh, fenced));
    assert_eq!(end(None), Ok(EndOutcome::NeedProducerId));
    let Ok(EndOutcome::Prepared(prepared)) = end(Some(21)) else {
        panic!("the exhausted epoch prepares under a new id");
    };
    assert_eq!(
        (prepared.producer_epoch, prepared.handed_out()),
        (i16::MAX, (21, 0))
    );
    c.close();
    let c = open(dir.path(), &clock);
    // The log does not keep the last epoch (Kafka's does not either).
    let reloaded = TxnState {
        last_producer_epoch: state::NO_EPOCH,
        ..prepared
    };
    assert_eq!(c.unfinished(), vec![("tx".to_string(), reloaded.clone())]);
    rt.block_on(c.complete("tx", &reloaded)).unwrap();
    assert_eq!(
        rt.block_on(c.end_txn("tx", (20, i16::MAX - 1), true, true, None, fenced)),
        Ok(EndOutcome::Done(21, 0)),
        "a retry under the old id"
    );
    c.close();
    let c = open(dir.path(), &clock);
    let s = c.describe("tx").unwrap();
    assert_eq!(
        (s.producer_id, s.producer_epoch, s.previous_producer_id, s.status),
        (21, 0, 20, TxnStatus::CompleteCommit)
    );
    rt.block_on(c.add_partitions("tx", 21, 0, &p, state::TRANSACTION_VERSION_2, fenced))
        .unwrap();
    c.close();
}

/// The implicit add of a produce waits while its transaction is busy
/// instead of answering CONCURRENT_TRANSACTIONS at once: two adds at the
/// same time (each a state to write) both go through, and the next
/// transaction's add waits for the last one's markers, up to its bound.
#[test]
fn a_produce_add_waits_for_its_transaction_to_be_free() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock(AtomicI64::new(1_000)));
    let rt = runtime();
    let c = open(dir.path(), &clock);
    rt.block_on(c.init_producer_id("tx", 60_000, None, Some(7), 2))
        .unwrap();
    let wait = Duration::from_secs(5);
    let (p0, p1) = ([("t".to_string(), 0)], [("t".to_string(), 1)]);
    let (a, b) = rt.block_on(async {
        tokio::join!(
            c.add_for_produce("tx", (7, 0), &p0, wait),
            c.add_for_produce("tx", (7, 0), &p1, wait),
        )
    });
    assert_eq!((a, b), (Ok(()), Ok(())));
    assert_eq!(c.describe("tx").unwrap().partitions.len(), 2);
    let Ok(EndOutcome::Prepared(prepared)) =
        rt.block_on(c.end_txn("tx", (7, 0), true, true, None, ResponseError::ProducerFenced))
    else {
        panic!("an open transaction prepares");
    };
    // The markers are not written yet: the next transaction's add waits
    // for no longer than it may.
    let next = [("t".to_string(), 2)];
    assert_eq!(
        rt.block_on(c.add_for_produce("tx", (7, 1), &next, Duration::from_millis(20))),
        Err(ResponseError::ConcurrentTransactions)
    );
    // They are written while it waits.
    let (added, completed) = rt.block_on(async {
        tokio::join!(c.add_for_produce("tx", (7, 1), &next, wait), async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            c.complete("tx", &prepared).await
        })
    });
    assert_eq!((added, completed), (Ok(()), Ok(())));
    let s = c.describe("tx").unwrap();
    assert_eq!((s.status, s.producer_epoch), (TxnStatus::Ongoing, 1));
    assert_eq!(
        rt.block_on(c.add_for_produce("tx", (7, 0), &next, wait)),
        Err(ResponseError::ProducerFenced),
        "the ended transaction's epoch"
    );
    c.close();
}

/// A cluster's transaction log in miniature: each id's records go to its
/// partition's log (of 4), and only the partitions this coordinator leads
/// take writes.
struct PartitionsSink {
    logs: Arc<Mutex<BTreeMap<i32, Vec<u8>>>>,
    led: Arc<Mutex<std::collections::BTreeSet<i32>>>,
}

fn partition_of(id: &str) -> i32 {
    i32::from(id.as_bytes().first().copied().unwrap_or(0)) % 4
}

fn owns(index: i32) -> Owns {
    Arc::new(move |id: &str| partition_of(id) == index)
}

impl crate::metalog::Sink<TxnTable> for PartitionsSink {
    fn append(
        &mut self,
        entries: &[crate::metalog::Entry<TxnRecord>],
        table: &Mutex<TxnTable>,
    ) -> Vec<crate::metalog::Outcome<TxnTable>> {
        use crate::partitioned::Partitioned;
        let (split, touched) = TxnTable::split(entries, &table.lock(), &partition_of);
        let led = self.led.lock().clone();
        for (p, part) in split.iter().filter(|(p, _)| led.contains(p)) {
            let bytes = crate::metalog::encode_entries::<TxnTable>(part, 0).unwrap();
            self.logs.lock().entry(*p).or_default().extend(bytes);
        }
        touched
            .into_iter()
            .map(|ps| match ps.iter().find(|p| !led.contains(p)) {
                Some(p) => {
                    crate::metalog::Outcome::Failed(crate::metalog::StoreError(format!("{p} not led")))
                }
                None => crate::metalog::Outcome::Written,
            })
            .collect()
    }

    fn tend(&mut self, _table: &Mutex<TxnTable>, _wrote: bool) {}

    fn close(&mut self) {}
}

#[test]
fn a_partition_of_the_transaction_log_moves_to_another_coordinator_with_its_ids() {
    let rt = runtime();
    let clock: Arc<dyn Clock> = Arc::new(ManualClock(AtomicI64::new(1_000)));
    let logs = Arc::new(Mutex::new(BTreeMap::new()));
    let coordinator = |led: &[i32]| {
        let led = Arc::new(Mutex::new(led.iter().copied().collect()));
        let sink = PartitionsSink {
            logs: Arc::clone(&logs),
            led: Arc::clone(&led),
        };
        let holds = Arc::clone(&led);
        let holds: Owns = Arc::new(move |id: &str| holds.lock().contains(&partition_of(id)));
        let c = TxnCoordinator::open_sink(Box::new(sink), holds, config(), Arc::clone(&clock)).unwrap();
        (c, led)
    };
    let (a, a_led) = coordinator(&[0, 1, 2, 3]);
    let p = vec![("t".to_string(), 0)];
    // "a" (97 % 4 == 1) is open, "b" (98 % 4 == 2) prepared, "f"
    // (102 % 4 == 2) is in the same partition, "c" (99 % 4 == 3) another.
    for (id, pid) in [("a", 1), ("b", 2), ("f", 3), ("c", 4)] {
        assert_eq!(
            rt.block_on(a.init_producer_id(id, 60_000, None, Some(pid), 2)),
            Ok(InitOutcome::Ready(pid, 0))
        );
        rt.block_on(a.add_partitions(id, pid, 0, &p, 0, ResponseError::ProducerFenced))
            .unwrap();
    }
    let Ok(EndOutcome::Prepared(prepared)) =
        rt.block_on(a.end_txn("b", (2, 0), true, false, None, ResponseError::ProducerFenced))
    else {
        panic!("b is not prepared");
    };

    // Partition 2 moves to `b_side`: it reads the partition's log.
    a_led.lock().remove(&2);
    rt.block_on(a.unload(owns(2)));
    assert_eq!((a.describe("b"), a.describe("f")), (None, None));
    assert!(a.describe("a").is_some() && a.describe("c").is_some());
    // It no longer knows them: their requests (and a new id's of their
    // partition, "j", 106 % 4 == 2) are another coordinator's, and leave
    // nothing behind.
    assert_eq!(
        rt.block_on(a.add_partitions("f", 3, 0, &[("t".into(), 1)], 0, ResponseError::ProducerFenced)),
        Err(ResponseError::NotCoordinator)
    );
    assert_eq!(
        rt.block_on(a.init_producer_id("j", 60_000, None, Some(9), 2)),
        Err(ResponseError::NotCoordinator)
    );
    assert_eq!(a.describe("j"), None);
    let (b_side, _) = coordinator(&[2]);
    let mut table = TxnTable::default();
    let log = logs.lock().get(&2).cloned().unwrap();
    crate::partitioned::apply_batches(&mut table, Bytes::from(log), 0).unwrap();
    let unfinished = rt.block_on(b_side.load(table, owns(2)));
    // The prepared transaction's markers are the new coordinator's to write.
    assert_eq!(unfinished, vec![("b".to_string(), prepared.clone())]);
    assert_eq!(b_side.describe("b"), Some(prepared.clone()));
    let f = b_side.describe("f").expect("f moved");
    assert_eq!(
        (f.producer_id, f.status, f.partitions.len()),
        (3, TxnStatus::Ongoing, 1)
    );
    assert_eq!(b_side.describe("a"), None);
    // It goes on from there: completes b, and b's producer comes back at
    // its next epoch with its producer id.
    rt.block_on(b_side.complete("b", &prepared)).unwrap();
    assert_eq!(b_side.describe("b").unwrap().status, TxnStatus::CompleteCommit);
    assert_eq!(
        rt.block_on(b_side.init_producer_id("b", 60_000, None, None, 2)),
        Ok(InitOutcome::Ready(2, 1))
    );
    assert!(b_side.unfinished().is_empty());
}
