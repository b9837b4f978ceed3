//! One transactional id's state machine, as Kafka's transaction
//! coordinator runs it (`TransactionMetadata`), with no I/O and no clock:
//! each operation takes `now_ms` and says what to persist.
//!
//! ```text
//! Empty ──AddPartitions──> Ongoing ──EndTxn──> PrepareCommit ──markers──> CompleteCommit
//!   ^                        │  │                                              │
//!   │                        │  └──EndTxn(abort) / timeout──> PrepareAbort ──> CompleteAbort
//!   └──InitProducerId (epoch + 1) <──────────────────────────────────────────────┘
//! ```
//!
//! A state is persisted to the transaction log before it takes effect;
//! while a write is in flight the id is `pending` and every other request
//! for it is answered CONCURRENT_TRANSACTIONS, as in Kafka.
//!
//! Transactions v2 (KIP-890 part 2, EndTxn v5+): every end bumps the
//! producer epoch, and the markers carry the bumped epoch, so a late write
//! of the ended transaction is fenced in every partition. The client gets
//! the new epoch in the EndTxn answer; when the epoch is exhausted the
//! transaction hands over to a new producer id (`next_producer_id`).
//!
//! KIP-360: the epoch before the last bump the client asked for or saw
//! (`last_producer_epoch`) is remembered, so that an InitProducerId naming
//! it is taken for a retry whose answer was lost and answered with the
//! current epoch, not fenced.

use std::collections::BTreeSet;

use keel_protocol::ResponseError;

/// Kafka's `TransactionState` ids, as the transaction log stores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i8)]
pub enum TxnStatus {
    Empty = 0,
    Ongoing = 1,
    PrepareCommit = 2,
    PrepareAbort = 3,
    CompleteCommit = 4,
    CompleteAbort = 5,
    Dead = 6,
    PrepareEpochFence = 7,
}

impl TxnStatus {
    pub fn from_id(id: i8) -> Option<TxnStatus> {
        use TxnStatus::*;
        [
            Empty,
            Ongoing,
            PrepareCommit,
            PrepareAbort,
            CompleteCommit,
            CompleteAbort,
            Dead,
            PrepareEpochFence,
        ]
        .into_iter()
        .find(|s| *s as i8 == id)
    }

    /// The status of a name [`TxnStatus::name`] gives.
    pub fn from_name(name: &str) -> Option<TxnStatus> {
        (0..=7).filter_map(TxnStatus::from_id).find(|s| s.name() == name)
    }

    /// The name DescribeTransactions and ListTransactions use.
    pub fn name(self) -> &'static str {
        match self {
            TxnStatus::Empty => "Empty",
            TxnStatus::Ongoing => "Ongoing",
            TxnStatus::PrepareCommit => "PrepareCommit",
            TxnStatus::PrepareAbort => "PrepareAbort",
            TxnStatus::CompleteCommit => "CompleteCommit",
            TxnStatus::CompleteAbort => "CompleteAbort",
            TxnStatus::Dead => "Dead",
            TxnStatus::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    fn is_prepare(self) -> bool {
        matches!(
            self,
            TxnStatus::PrepareCommit | TxnStatus::PrepareAbort | TxnStatus::PrepareEpochFence
        )
    }
}

/// What the transaction log holds for one transactional id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnState {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub status: TxnStatus,
    /// The partitions the open (or ending) transaction wrote to.
    pub partitions: BTreeSet<(String, i32)>,
    pub last_update_ms: i64,
    /// When the open transaction began (-1 when none is open).
    pub start_ms: i64,
    /// The producer id before the last hand-over to a new one (-1: none):
    /// a retried EndTxn of the old id is recognised by it.
    pub previous_producer_id: i64,
    /// The producer id an ending transaction hands over to because its
    /// epoch is exhausted (-1: none).
    pub next_producer_id: i64,
    /// The transaction version of the client's last request (Kafka's
    /// `ClientTransactionVersion`): 2 for transactions v2.
    pub client_version: i16,
    /// The epoch before the last bump a client may still hold (Kafka's
    /// `lastProducerEpoch`, -1: none): an InitProducerId expecting it is
    /// a retry. Kept in memory only, as in Kafka: the transaction log
    /// does not carry it, so a reloaded state has none.
    pub last_producer_epoch: i16,
}

impl TxnState {
    /// A new id's first state.
    pub fn new(producer_id: i64, timeout_ms: i32, now_ms: i64) -> TxnState {
        TxnState {
            producer_id,
            producer_epoch: 0,
            timeout_ms,
            status: TxnStatus::Empty,
            partitions: BTreeSet::new(),
            last_update_ms: now_ms,
            start_ms: -1,
            previous_producer_id: -1,
            next_producer_id: -1,
            client_version: 0,
            last_producer_epoch: NO_EPOCH,
        }
    }

    /// The previous producer id of the state after this one, whose
    /// producer id is `next_id`: this state's id if that changes.
    fn previous_id_after(&self, next_id: i64) -> i64 {
        if next_id == self.producer_id {
            self.previous_producer_id
        } else {
            self.producer_id
        }
    }

    /// The producer id and epoch the client goes on with after this state:
    /// the next id, at epoch 0, when the transaction hands over to one.
    pub fn handed_out(&self) -> (i64, i16) {
        if self.next_producer_id >= 0 {
            (self.next_producer_id, 0)
        } else {
            (self.producer_id, self.producer_epoch)
        }
    }
}

/// Transactions v2: the epoch is bumped at every end (KIP-890).
pub const TRANSACTION_VERSION_2: i16 = 2;

/// Kafka's `RecordBatch.NO_PRODUCER_EPOCH`.
pub const NO_EPOCH: i16 = -1;

/// A transactional id in the coordinator's memory.
#[derive(Debug, Clone)]
pub struct TxnEntry {
    pub state: TxnState,
    /// A new state is being written to the transaction log.
    pub pending: bool,
}

/// The highest epoch a producer id is used with: the epoch after it does
/// not fit Kafka's check (`Short.MaxValue - 1`), so a new id is handed out.
const MAX_EPOCH: i16 = i16::MAX - 1;

/// What InitProducerId does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitDecision {
    /// A fresh producer id is needed: allocate one and decide again.
    NeedProducerId,
    /// Persist this state and answer with its id and epoch.
    Persist(TxnState),
    /// The open transaction is aborted first, under a bumped epoch (which
    /// fences its producer): persist this PrepareAbort, write the markers,
    /// and answer CONCURRENT_TRANSACTIONS so the client retries.
    AbortOngoing(TxnState),
}

/// InitProducerId for `entry` (None: the id is new), as Kafka 4.3's
/// coordinator decides it. `expected` is the producer id and epoch the
/// client has (KIP-360), if it sent them: its current epoch is bumped, the
/// epoch before the last bump is a retry answered with the current one,
/// any other is fenced. `server_version` is the `transaction.version` the
/// broker finalized, which says how an open transaction is fenced.
pub fn init(
    entry: Option<&TxnEntry>,
    timeout_ms: i32,
    expected: Option<(i64, i16)>,
    fresh_producer_id: Option<i64>,
    server_version: i16,
    now_ms: i64,
) -> Result<InitDecision, ResponseError> {
    let Some(entry) = entry else {
        let Some(producer_id) = fresh_producer_id else {
            return Ok(InitDecision::NeedProducerId);
        };
        return Ok(InitDecision::Persist(TxnState::new(
            producer_id,
            timeout_ms,
            now_ms,
        )));
    };
    if entry.pending {
        return Err(ResponseError::ConcurrentTransactions);
    }
    let s = &entry.state;
    if let Some((id, epoch)) = expected {
        // The id the client holds, or the one an exhausted epoch handed
        // over from (a retry of the call that handed over); its epoch is
        // checked below, when there is one to bump.
        let own_id = id == s.producer_id || (id == s.previous_producer_id && epoch >= MAX_EPOCH);
        if !own_id {
            return Err(ResponseError::ProducerFenced);
        }
    }
    match s.status {
        TxnStatus::PrepareCommit | TxnStatus::PrepareAbort | TxnStatus::PrepareEpochFence => {
            Err(ResponseError::ConcurrentTransactions)
        }
        TxnStatus::Ongoing => Ok(InitDecision::AbortOngoing(fenced_abort(
            s,
            server_version,
            now_ms,
        ))),
        TxnStatus::Empty | TxnStatus::CompleteCommit | TxnStatus::CompleteAbort | TxnStatus::Dead => {
            let expected_epoch = expected.map(|(_, epoch)| epoch);
            if s.producer_epoch >= MAX_EPOCH && expected_epoch.is_none_or(|e| e == s.producer_epoch) {
                let Some(id) = fresh_producer_id else {
                    return Ok(InitDecision::NeedProducerId);
                };
                return Ok(InitDecision::Persist(TxnState {
                    previous_producer_id: s.producer_id,
                    client_version: s.client_version,
                    last_producer_epoch: expected_epoch.map_or(NO_EPOCH, |_| s.producer_epoch),
                    ..TxnState::new(id, timeout_ms, now_ms)
                }));
            }
            // Below MAX_EPOCH here, unless the client names another epoch.
            let (producer_epoch, last_producer_epoch) = match expected_epoch {
                // A new instance of the producer: the epoch fences the old.
                None => (s.producer_epoch + 1, NO_EPOCH),
                Some(e) if e == s.producer_epoch => (e + 1, e),
                // Its last call bumped the epoch, and it did not hear.
                Some(e) if e == s.last_producer_epoch => (s.producer_epoch, e),
                Some(_) => return Err(ResponseError::ProducerFenced),
            };
            Ok(InitDecision::Persist(TxnState {
                producer_epoch,
                previous_producer_id: s.previous_producer_id,
                client_version: s.client_version,
                last_producer_epoch,
                ..TxnState::new(s.producer_id, timeout_ms, now_ms)
            }))
        }
    }
}

/// The abort of `s`'s open transaction by the coordinator (a timeout, or
/// a new instance of the producer), under an epoch one higher, which
/// fences its producer, as Kafka 4.3 does. Under transactions v2
/// (`server_version`, the level the broker finalized, whatever the
/// client's) the abort is an end like the client's own, and the epoch
/// below is its last: the client's own abort at it then passes for a
/// retry of this one, and its InitProducerId naming it gets the fenced
/// epoch back (KIP-360). Never past `i16::MAX`, the highest epoch a
/// marker may carry.
fn fenced_abort(s: &TxnState, server_version: i16, now_ms: i64) -> TxnState {
    TxnState {
        producer_epoch: s.producer_epoch.saturating_add(1),
        last_producer_epoch: if server_version >= TRANSACTION_VERSION_2 {
            s.producer_epoch
        } else {
            NO_EPOCH
        },
        status: TxnStatus::PrepareAbort,
        last_update_ms: now_ms,
        ..s.clone()
    }
}

/// Checks that a request comes from the producer that owns the id now.
/// `old_epoch_error` is what an older epoch gets (Kafka answers
/// INVALID_PRODUCER_EPOCH to versions before PRODUCER_FENCED existed).
pub fn check_producer(
    entry: Option<&TxnEntry>,
    producer_id: i64,
    epoch: i16,
    fenced: ResponseError,
) -> Result<&TxnEntry, ResponseError> {
    let entry = entry.ok_or(ResponseError::InvalidProducerIdMapping)?;
    let s = &entry.state;
    if s.producer_id != producer_id {
        // The client already has the id its ending transaction hands over
        // to; it is the id's own once the markers are written.
        if s.next_producer_id == producer_id && epoch == 0 && s.status.is_prepare() {
            return Err(ResponseError::ConcurrentTransactions);
        }
        return Err(ResponseError::InvalidProducerIdMapping);
    }
    if entry.state.producer_epoch != epoch {
        return Err(fenced);
    }
    Ok(entry)
}

/// AddPartitionsToTxn, or the implicit add of transactions v2
/// (`client_version`): the state to persist, or `None` when every
/// partition is already in the open transaction.
pub fn add_partitions(
    entry: &TxnEntry,
    partitions: &[(String, i32)],
    client_version: i16,
    now_ms: i64,
) -> Result<Option<TxnState>, ResponseError> {
    let s = &entry.state;
    if entry.pending || s.status.is_prepare() {
        return Err(ResponseError::ConcurrentTransactions);
    }
    if s.status == TxnStatus::Dead {
        return Err(ResponseError::InvalidTxnState);
    }
    let ongoing = s.status == TxnStatus::Ongoing;
    if ongoing && partitions.iter().all(|p| s.partitions.contains(p)) {
        return Ok(None);
    }
    let mut next = s.clone();
    if !ongoing {
        next.partitions.clear();
        next.start_ms = now_ms;
    }
    next.status = TxnStatus::Ongoing;
    next.partitions.extend(partitions.iter().cloned());
    next.last_update_ms = now_ms;
    next.client_version = client_version;
    Ok(Some(next))
}

/// What EndTxn does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndDecision {
    /// The transaction already ended this way: a retry, answered at once.
    Done,
    /// Persist this Prepare state, answer, then write the markers.
    Prepare(TxnState),
    /// The epoch is exhausted (transactions v2): allocate the producer id
    /// to hand over to, and decide again.
    NeedProducerId,
}

/// EndTxn (commit or abort) for the owning producer's `entry`.
pub fn end(entry: &TxnEntry, commit: bool, now_ms: i64) -> Result<EndDecision, ResponseError> {
    let s = &entry.state;
    if entry.pending {
        return Err(ResponseError::ConcurrentTransactions);
    }
    match (s.status, commit) {
        (TxnStatus::Ongoing, _) => Ok(EndDecision::Prepare(TxnState {
            status: if commit {
                TxnStatus::PrepareCommit
            } else {
                TxnStatus::PrepareAbort
            },
            last_update_ms: now_ms,
            ..s.clone()
        })),
        (TxnStatus::PrepareCommit, true) | (TxnStatus::PrepareAbort, false) => {
            Err(ResponseError::ConcurrentTransactions)
        }
        (TxnStatus::CompleteCommit, true) | (TxnStatus::CompleteAbort, false) => Ok(EndDecision::Done),
        (TxnStatus::PrepareEpochFence, _) => Err(ResponseError::ProducerFenced),
        _ => Err(ResponseError::InvalidTxnState),
    }
}

/// EndTxn v5+ (transactions v2) for `producer_id` at `epoch`, as Kafka
/// decides it. The end bumps the epoch. A retry is the epoch below the
/// bumped one, or the previous id at the last epoch after a hand-over; a
/// retried end that is done is [`EndDecision::Done`]. An abort with no
/// open transaction bumps the epoch too (a client's way to reset it).
pub fn end_v2(
    entry: Option<&TxnEntry>,
    producer_id: i64,
    epoch: i16,
    commit: bool,
    fresh_producer_id: Option<i64>,
    now_ms: i64,
) -> Result<EndDecision, ResponseError> {
    use TxnStatus::*;
    let entry = entry.ok_or(ResponseError::InvalidProducerIdMapping)?;
    let s = &entry.state;
    let retry_on_bump = i32::from(s.producer_epoch) == i32::from(epoch) + 1;
    let retry_on_hand_over =
        s.previous_producer_id == producer_id && epoch == MAX_EPOCH && s.producer_epoch == 0;
    if s.producer_id != producer_id && !retry_on_hand_over {
        return Err(ResponseError::InvalidProducerIdMapping);
    }
    let valid_epoch = match s.status {
        Ongoing | Empty | Dead | PrepareEpochFence => epoch == s.producer_epoch,
        PrepareCommit | PrepareAbort => retry_on_bump,
        CompleteCommit | CompleteAbort => retry_on_bump || retry_on_hand_over || epoch == s.producer_epoch,
    };
    if !valid_epoch {
        return Err(ResponseError::ProducerFenced);
    }
    if entry.pending {
        return Err(ResponseError::ConcurrentTransactions);
    }
    let retry = retry_on_bump || retry_on_hand_over;
    let prepare = |commit: bool, nothing_added: bool| -> Result<EndDecision, ResponseError> {
        // An epoch at i16::MAX was never handed out: only a forged request
        // names it.
        let producer_epoch = s
            .producer_epoch
            .checked_add(1)
            .ok_or(ResponseError::ProducerFenced)?;
        let next_producer_id = if s.producer_epoch >= MAX_EPOCH {
            match fresh_producer_id {
                Some(id) => id,
                None => return Ok(EndDecision::NeedProducerId),
            }
        } else {
            -1
        };
        Ok(EndDecision::Prepare(TxnState {
            producer_epoch,
            last_producer_epoch: s.producer_epoch,
            status: if commit { PrepareCommit } else { PrepareAbort },
            last_update_ms: now_ms,
            start_ms: if nothing_added { now_ms } else { s.start_ms },
            next_producer_id,
            client_version: TRANSACTION_VERSION_2,
            ..s.clone()
        }))
    };
    match (s.status, commit) {
        (Ongoing, _) => prepare(commit, false),
        (CompleteCommit, true) | (CompleteAbort, false) if retry => Ok(EndDecision::Done),
        (CompleteCommit | CompleteAbort | Empty, false) if !retry => prepare(false, true),
        (PrepareCommit, true) | (PrepareAbort, false) => Err(ResponseError::ConcurrentTransactions),
        _ => Err(ResponseError::InvalidTxnState),
    }
}

/// The state after every marker of a Prepare state is written. A
/// transaction that hands over to a new producer id completes under it.
pub fn complete(prepared: &TxnState, now_ms: i64) -> TxnState {
    let (producer_id, producer_epoch) = prepared.handed_out();
    TxnState {
        producer_id,
        producer_epoch,
        status: if prepared.status == TxnStatus::PrepareCommit {
            TxnStatus::CompleteCommit
        } else {
            TxnStatus::CompleteAbort
        },
        partitions: BTreeSet::new(),
        last_update_ms: now_ms,
        start_ms: -1,
        previous_producer_id: prepared.previous_id_after(producer_id),
        next_producer_id: -1,
        ..prepared.clone()
    }
}

/// The abort of an open transaction past its timeout, under a bumped
/// epoch (Kafka fences the producer that let it time out), if it is.
pub fn timed_out(entry: &TxnEntry, server_version: i16, now_ms: i64) -> Option<TxnState> {
    let s = &entry.state;
    let expired = s.status == TxnStatus::Ongoing
        && !entry.pending
        && now_ms > s.start_ms.saturating_add(i64::from(s.timeout_ms));
    expired.then(|| fenced_abort(s, server_version, now_ms))
}

/// Whether an idle id has outlived `transactional.id.expiration.ms`.
pub fn expired(entry: &TxnEntry, now_ms: i64, expiration_ms: i64) -> bool {
    let s = &entry.state;
    !entry.pending
        && matches!(
            s.status,
            TxnStatus::Empty | TxnStatus::CompleteCommit | TxnStatus::CompleteAbort
        )
        && now_ms.saturating_sub(s.last_update_ms) > expiration_ms
}

/// ListTransactions' filters, as Kafka applies them: each one given must
/// match.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// The states asked for (names Kafka does not know add none, so a
    /// filter of only unknown names matches nothing).
    pub states: Option<Vec<TxnStatus>>,
    pub producer_ids: Vec<i64>,
    /// Only transactions open for longer than this (negative: any).
    pub min_duration_ms: i64,
}

impl ListFilter {
    pub fn matches(&self, s: &TxnState, now_ms: i64) -> bool {
        let state_ok = self
            .states
            .as_ref()
            .is_none_or(|states| states.contains(&s.status));
        let producer_ok = self.producer_ids.is_empty() || self.producer_ids.contains(&s.producer_id);
        let duration_ok =
            self.min_duration_ms < 0 || (s.start_ms >= 0 && now_ms - s.start_ms > self.min_duration_ms);
        state_ok && producer_ok && duration_ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(state: TxnState) -> TxnEntry {
        TxnEntry {
            state,
            pending: false,
        }
    }

    fn persisted(d: Result<InitDecision, ResponseError>) -> TxnState {
        match d {
            Ok(InitDecision::Persist(s)) => s,
            other => panic!("expected a state to persist, got {other:?}"),
        }
    }

    #[test]
    fn a_transaction_runs_its_course() {
        assert_eq!(
            init(None, 1000, None, None, 2, 0),
            Ok(InitDecision::NeedProducerId)
        );
        let s = persisted(init(None, 1000, None, Some(7), 2, 0));
        assert_eq!(
            (s.producer_id, s.producer_epoch, s.status),
            (7, 0, TxnStatus::Empty)
        );
        let e = entry(s);
        let p = vec![("t".to_string(), 0), ("t".to_string(), 1)];
        let ongoing = add_partitions(&e, &p, 0, 10).unwrap().unwrap();
        assert_eq!(ongoing.status, TxnStatus::Ongoing);
        assert_eq!(ongoing.start_ms, 10);
        let e = entry(ongoing);
        assert_eq!(add_partitions(&e, &p[..1], 0, 11), Ok(None), "already in");
        let EndDecision::Prepare(prepared) = end(&e, true, 12).unwrap() else {
            panic!("an open transaction prepares");
        };
        assert_eq!(prepared.status, TxnStatus::PrepareCommit);
        let e = entry(prepared.clone());
        assert_eq!(end(&e, true, 13), Err(ResponseError::ConcurrentTransactions));
        assert_eq!(end(&e, false, 13), Err(ResponseError::InvalidTxnState));
        assert_eq!(
            add_partitions(&e, &p, 0, 13),
            Err(ResponseError::ConcurrentTransactions)
        );
        let done = complete(&prepared, 14);
        assert_eq!(done.status, TxnStatus::CompleteCommit);
        assert!(done.partitions.is_empty());
        let e = entry(done);
        assert_eq!(end(&e, true, 15), Ok(EndDecision::Done), "a retried commit");
        assert_eq!(end(&e, false, 15), Err(ResponseError::InvalidTxnState));
        let next = persisted(init(Some(&e), 1000, None, None, 2, 16));
        assert_eq!((next.producer_id, next.producer_epoch), (7, 1));
    }

    #[test]
    fn zombies_are_fenced_and_open_transactions_aborted() {
        let e = entry(persisted(init(None, 1000, None, Some(3), 2, 0)));
        let e = entry(add_partitions(&e, &[("t".into(), 0)], 0, 1).unwrap().unwrap());
        // A new producer instance with the same id: the open transaction
        // is aborted under a bumped epoch first.
        let InitDecision::AbortOngoing(fence) = init(Some(&e), 1000, None, None, 2, 2).unwrap() else {
            panic!("an open transaction is aborted first");
        };
        assert_eq!((fence.status, fence.producer_epoch), (TxnStatus::PrepareAbort, 1));
        let e = entry(complete(&fence, 3));
        let next = persisted(init(Some(&e), 1000, None, None, 2, 4));
        assert_eq!(next.producer_epoch, 2);
        let e = entry(next);
        // The old instance is fenced everywhere.
        assert_eq!(
            check_producer(Some(&e), 3, 0, ResponseError::ProducerFenced).err(),
            Some(ResponseError::ProducerFenced)
        );
        assert_eq!(
            check_producer(Some(&e), 4, 2, ResponseError::ProducerFenced).err(),
            Some(ResponseError::InvalidProducerIdMapping)
        );
        // KIP-360: only the current epoch may ask for a bump.
        assert_eq!(
            init(Some(&e), 1000, Some((3, 1)), None, 2, 5),
            Err(ResponseError::ProducerFenced)
        );
        assert!(init(Some(&e), 1000, Some((3, 2)), None, 2, 5).is_ok());
    }

    #[test]
    fn timeouts_and_epoch_exhaustion() {
        let e = entry(persisted(init(None, 100, None, Some(1), 2, 0)));
        let e = entry(add_partitions(&e, &[("t".into(), 0)], 0, 1_000).unwrap().unwrap());
        assert_eq!(timed_out(&e, 2, 1_100), None);
        let abort = timed_out(&e, 2, 1_101).unwrap();
        assert_eq!((abort.status, abort.producer_epoch), (TxnStatus::PrepareAbort, 1));
        let mut old = e.state.clone();
        old.status = TxnStatus::CompleteAbort;
        old.producer_epoch = MAX_EPOCH;
        let e = entry(old);
        assert_eq!(
            init(Some(&e), 100, None, None, 2, 0),
            Ok(InitDecision::NeedProducerId)
        );
        let fresh = persisted(init(Some(&e), 100, None, Some(2), 2, 0));
        assert_eq!((fresh.producer_id, fresh.producer_epoch), (2, 0));
        assert!(expired(&e, 10_000, 100));
        assert!(!expired(&e, 10_000, 100_000));
    }

    fn prepared(d: Result<EndDecision, ResponseError>) -> TxnState {
        match d {
            Ok(EndDecision::Prepare(s)) => s,
            other => panic!("expected a Prepare state, got {other:?}"),
        }
    }

    /// Kafka's table of EndTxn v5 answers (TransactionCoordinator): each
    /// end bumps the epoch; the epoch below is a retry.
    #[test]
    fn transactions_v2_bump_the_epoch_at_every_end() {
        let e = entry(persisted(init(None, 1000, None, Some(7), 2, 0)));
        let p = [("t".to_string(), 0)];
        let open = add_partitions(&e, &p, TRANSACTION_VERSION_2, 1).unwrap().unwrap();
        assert_eq!(open.client_version, TRANSACTION_VERSION_2);
        let e = entry(open);
        assert_eq!(
            end_v2(Some(&e), 7, 1, true, None, 2),
            Err(ResponseError::ProducerFenced),
            "no epoch above the current one"
        );
        assert_eq!(
            end_v2(Some(&e), 8, 0, true, None, 2),
            Err(ResponseError::InvalidProducerIdMapping)
        );
        let commit = prepared(end_v2(Some(&e), 7, 0, true, None, 2));
        assert_eq!(
            (commit.status, commit.producer_epoch),
            (TxnStatus::PrepareCommit, 1)
        );
        assert_eq!(
            commit.handed_out(),
            (7, 1),
            "the client goes on at the bumped epoch"
        );
        let e = entry(commit.clone());
        assert_eq!(
            end_v2(Some(&e), 7, 0, true, None, 3),
            Err(ResponseError::ConcurrentTransactions),
            "a retry while the markers are written"
        );
        assert_eq!(
            add_partitions(&e, &p, TRANSACTION_VERSION_2, 3),
            Err(ResponseError::ConcurrentTransactions),
            "the next transaction waits for the markers"
        );
        let done = complete(&commit, 4);
        assert_eq!((done.producer_id, done.producer_epoch), (7, 1));
        let e = entry(done);
        // Retry (epoch 0) and current (epoch 1), commit and abort.
        assert_eq!(end_v2(Some(&e), 7, 0, true, None, 5), Ok(EndDecision::Done));
        assert_eq!(
            end_v2(Some(&e), 7, 0, false, None, 5),
            Err(ResponseError::InvalidTxnState)
        );
        assert_eq!(
            end_v2(Some(&e), 7, 1, true, None, 5),
            Err(ResponseError::InvalidTxnState)
        );
        let reset = prepared(end_v2(Some(&e), 7, 1, false, None, 5));
        assert_eq!((reset.status, reset.producer_epoch), (TxnStatus::PrepareAbort, 2));
        assert!(
            reset.partitions.is_empty(),
            "an abort with nothing open has no markers"
        );
        let e = entry(complete(&reset, 6));
        assert_eq!(end_v2(Some(&e), 7, 1, false, None, 7), Ok(EndDecision::Done));
        assert_eq!(
            end_v2(Some(&e), 7, 0, false, None, 7),
            Err(ResponseError::ProducerFenced),
            "two epochs below is a zombie"
        );
        // A fresh id: an abort bumps, a commit has nothing to commit.
        let fresh = entry(persisted(init(None, 1000, None, Some(9), 2, 0)));
        assert_eq!(
            end_v2(Some(&fresh), 9, 0, true, None, 1),
            Err(ResponseError::InvalidTxnState)
        );
        assert_eq!(
            prepared(end_v2(Some(&fresh), 9, 0, false, None, 1)).producer_epoch,
            1
        );
    }

    #[test]
    fn an_exhausted_epoch_hands_over_to_a_new_producer_id() {
        let mut s = persisted(init(None, 1000, None, Some(7), 2, 0));
        s.producer_epoch = MAX_EPOCH;
        let e = entry(s);
        let e = entry(
            add_partitions(&e, &[("t".into(), 0)], TRANSACTION_VERSION_2, 1)
                .unwrap()
                .unwrap(),
        );
        assert_eq!(
            end_v2(Some(&e), 7, MAX_EPOCH, true, None, 2),
            Ok(EndDecision::NeedProducerId)
        );
        let commit = prepared(end_v2(Some(&e), 7, MAX_EPOCH, true, Some(8), 2));
        // The markers carry the last epoch; the client goes on with the new id.
        assert_eq!((commit.producer_id, commit.producer_epoch), (7, i16::MAX));
        assert_eq!(commit.handed_out(), (8, 0));
        let e = entry(commit.clone());
        assert_eq!(
            check_producer(Some(&e), 8, 0, ResponseError::ProducerFenced).err(),
            Some(ResponseError::ConcurrentTransactions),
            "the new id waits for the markers"
        );
        let done = complete(&commit, 3);
        assert_eq!(
            (
                done.producer_id,
                done.producer_epoch,
                done.previous_producer_id,
                done.next_producer_id
            ),
            (8, 0, 7, -1)
        );
        let e = entry(done);
        assert_eq!(
            end_v2(Some(&e), 7, MAX_EPOCH, true, None, 4),
            Ok(EndDecision::Done),
            "a retry under the old id"
        );
        assert!(check_producer(Some(&e), 8, 0, ResponseError::ProducerFenced).is_ok());
        // A forged request at the epoch no client holds cannot overflow it.
        let mut forged = e.state.clone();
        forged.producer_epoch = i16::MAX;
        forged.status = TxnStatus::CompleteAbort;
        assert_eq!(
            end_v2(Some(&entry(forged)), 8, i16::MAX, false, None, 5),
            Err(ResponseError::ProducerFenced)
        );
    }

    /// A transaction past its timeout is aborted one epoch up, as Kafka
    /// 4.3 does; under transactions v2 the epoch below stays the last, so
    /// the producer's own abort passes for a retry of this one, its commit
    /// does not, and an InitProducerId naming it gets the new epoch
    /// (KIP-360). Under the classic protocol there is no last epoch.
    #[test]
    fn a_producer_past_its_timeout_is_fenced_one_epoch_up() {
        let e = entry(persisted(init(None, 100, None, Some(1), 2, 0)));
        let e = entry(
            add_partitions(&e, &[("t".into(), 0)], TRANSACTION_VERSION_2, 1_000)
                .unwrap()
                .unwrap(),
        );
        let abort = timed_out(&e, TRANSACTION_VERSION_2, 1_101).unwrap();
        assert_eq!((abort.producer_epoch, abort.last_producer_epoch), (1, 0));
        let done = entry(complete(&abort, 1_102));
        assert_eq!(
            end_v2(Some(&done), 1, 0, true, None, 1_103),
            Err(ResponseError::InvalidTxnState),
            "its commit"
        );
        assert_eq!(
            end_v2(Some(&done), 1, 0, false, None, 1_103),
            Ok(EndDecision::Done),
            "its abort"
        );
        let again = persisted(init(Some(&done), 100, Some((1, 0)), None, 2, 1_104));
        assert_eq!((again.producer_epoch, again.last_producer_epoch), (1, 0));
        let classic = timed_out(&e, 1, 1_101).unwrap();
        assert_eq!(
            (classic.producer_epoch, classic.last_producer_epoch),
            (1, NO_EPOCH)
        );
        assert_eq!(
            init(
                Some(&entry(complete(&classic, 1_102))),
                100,
                Some((1, 0)),
                None,
                1,
                1_104
            ),
            Err(ResponseError::ProducerFenced)
        );
    }

    /// KIP-360: an InitProducerId naming the epoch the client has bumps
    /// it; the same call again (its answer was lost) gets the bumped epoch
    /// back instead of a second bump or a fence; older epochs are fenced,
    /// and a new instance (no epoch named) forgets the last one.
    #[test]
    fn a_retried_init_producer_id_gets_the_epoch_it_bumped_to() {
        let e = entry(persisted(init(None, 1000, None, Some(7), 2, 0)));
        let e = entry(
            add_partitions(&e, &[("t".into(), 0)], TRANSACTION_VERSION_2, 1)
                .unwrap()
                .unwrap(),
        );
        let commit = prepared(end_v2(Some(&e), 7, 0, true, None, 2));
        assert_eq!(commit.last_producer_epoch, 0, "the epoch before the end's bump");
        let e = entry(complete(&commit, 3));
        assert_eq!(
            persisted(init(Some(&e), 1000, Some((7, 0)), None, 2, 4)).producer_epoch,
            1,
            "the client asks again for the epoch the end gave it"
        );
        let bumped = persisted(init(Some(&e), 1000, Some((7, 1)), None, 2, 4));
        assert_eq!((bumped.producer_epoch, bumped.last_producer_epoch), (2, 1));
        let e = entry(bumped);
        let retried = persisted(init(Some(&e), 1000, Some((7, 1)), None, 2, 5));
        assert_eq!((retried.producer_epoch, retried.last_producer_epoch), (2, 1));
        assert_eq!(
            init(Some(&e), 1000, Some((7, 0)), None, 2, 5),
            Err(ResponseError::ProducerFenced)
        );
        assert_eq!(
            init(Some(&e), 1000, Some((8, 2)), None, 2, 5),
            Err(ResponseError::ProducerFenced),
            "another producer id"
        );
        let fresh = persisted(init(Some(&e), 1000, None, None, 2, 6));
        assert_eq!((fresh.producer_epoch, fresh.last_producer_epoch), (3, NO_EPOCH));
        assert_eq!(
            init(Some(&entry(fresh)), 1000, Some((7, 2)), None, 2, 7),
            Err(ResponseError::ProducerFenced),
            "the instance a new one fenced"
        );
    }

    /// A client that re-initializes its producer id while its transaction
    /// is open (franz-go does after a produce error) gets the transaction
    /// aborted and CONCURRENT_TRANSACTIONS; the same call again, once the
    /// abort is done, is answered with the epoch the abort fenced with.
    #[test]
    fn a_reinit_during_a_transaction_aborts_it_and_the_retry_goes_on() {
        let e = entry(persisted(init(None, 1000, None, Some(7), 2, 0)));
        let e = entry(
            add_partitions(&e, &[("t".into(), 0)], TRANSACTION_VERSION_2, 1)
                .unwrap()
                .unwrap(),
        );
        let Ok(InitDecision::AbortOngoing(fence)) = init(Some(&e), 1000, Some((7, 0)), None, 2, 2) else {
            panic!("the open transaction is aborted first");
        };
        assert_eq!((fence.status, fence.producer_epoch), (TxnStatus::PrepareAbort, 1));
        assert_eq!(
            init(Some(&entry(fence.clone())), 1000, Some((7, 0)), None, 2, 3),
            Err(ResponseError::ConcurrentTransactions),
            "while the markers are written"
        );
        let done = entry(complete(&fence, 4));
        let next = persisted(init(Some(&done), 1000, Some((7, 0)), None, 2, 5));
        assert_eq!(
            (next.producer_id, next.producer_epoch, next.status),
            (7, 1, TxnStatus::Empty)
        );
    }

    #[test]
    fn list_filters_combine_as_kafkas_do() {
        for id in 0..=7 {
            let s = TxnStatus::from_id(id).unwrap();
            assert_eq!(TxnStatus::from_name(s.name()), Some(s));
        }
        let open = add_partitions(
            &entry(persisted(init(None, 100, None, Some(4), 2, 0))),
            &[("t".into(), 0)],
            0,
            1_000,
        )
        .unwrap()
        .unwrap();
        let any = ListFilter {
            min_duration_ms: -1,
            ..ListFilter::default()
        };
        assert!(any.matches(&open, 1_000));
        let names = |n: &[&str]| Some(n.iter().filter_map(|s| TxnStatus::from_name(s)).collect());
        let f = |states, producer_ids: Vec<i64>, min_duration_ms| ListFilter {
            states,
            producer_ids,
            min_duration_ms,
        };
        assert!(f(names(&["Ongoing", "Empty"]), vec![], -1).matches(&open, 1_000));
        assert!(!f(names(&["CompleteCommit"]), vec![], -1).matches(&open, 1_000));
        assert!(!f(names(&["NoSuchState"]), vec![], -1).matches(&open, 1_000));
        assert!(f(None, vec![3, 4], -1).matches(&open, 1_000));
        assert!(!f(None, vec![3], -1).matches(&open, 1_000));
        assert!(!f(None, vec![], 500).matches(&open, 1_500), "open exactly 500 ms");
        assert!(f(None, vec![], 500).matches(&open, 1_501));
        let idle = persisted(init(None, 100, None, Some(5), 2, 0));
        assert!(
            !f(None, vec![], 0).matches(&idle, 1_000_000),
            "no transaction is open"
        );
    }
}
