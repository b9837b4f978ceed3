//! Where each partition's log is committed, in the coordination store.
//!
//! A partition's leader writes its acknowledged batches into WAL objects
//! in the object store (many partitions' batches in one object), then
//! commits each object here in one transaction: the object's index (which
//! partition's offsets sit at which bytes) and every partition's new
//! committed end offset, its high watermark. Two keys, outside the
//! prefix the brokers' views follow (commits are many; no view needs
//! them):
//!
//! ```text
//! <prefix>.logs/<topic id>/<partition>      the partition's commit: leader, leader epoch, end offset
//! <prefix>.wal/<node.id>/<object seq>       a committed WAL object's index
//! <prefix>.segments/<topic id>/<p>/<base>   a sealed segment the leader copied to the object store
//! <prefix>.claims/<topic id>/<p>            the partition's claim: leader, leader epoch
//! <prefix>.starts/<topic id>/<p>            the partition's log start, as its leader last recorded it
//! ```
//!
//! A claim writes the commit key and the claim key in one transaction;
//! commits then change only the commit key, so the leader's records of
//! segments and log starts compare the claim key, which moves only when
//! another claim fences them.
//!
//! Together they say where every committed record is: in a sealed
//! segment in the object store, or past the last one, in WAL objects. A
//! broker taking a partition over rebuilds its log from them
//! ([`partition_log`]).
//!
//! Fencing. A leader claims a partition's key for its leader epoch before
//! it takes a write ([`claim`]), with a compare on its own registration
//! (its session). Every commit compares each partition's key against the
//! revision this leader last wrote and the registration again, so a
//! broker whose session ended (a zombie) or whose partition was claimed by
//! a newer leader commits nothing: its writes are never acknowledged.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::membership::Settings;
use crate::store::{Compare, CoordStore, KeyValue, Op, StoreError};

/// Partitions committed in one transaction: two operations each (a compare
/// and a put) plus the session compare and the index put stay within
/// etcd's default `--max-txn-ops` (128).
const PARTS_PER_TXN: usize = 60;

/// A partition's commit: who leads it, in which epoch, and the end of its
/// committed log (its high watermark).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogCommit {
    pub version: u32,
    pub leader: i32,
    pub leader_epoch: i32,
    pub end_offset: i64,
    /// The partition's log start offset as its leader last knew it.
    #[serde(default)]
    pub log_start: i64,
    /// The broker whose term committed the newest records (or whose
    /// directory brought the partition in): its own log holds every
    /// committed record, unless it lost its disk. -1 in a commit written
    /// before this field: the leader then.
    #[serde(default = "unknown_writer")]
    pub writer: i32,
}

fn unknown_writer() -> i32 {
    -1
}

impl LogCommit {
    /// The broker whose log holds every committed record.
    pub fn writer(&self) -> i32 {
        match self.writer {
            -1 => self.leader,
            w => w,
        }
    }
}

/// A sealed segment its leader copied to the object store, in Kafka's
/// format (`<object>.log`, `.index`, `.timeindex`, and `.txnindex` when
/// `aborted` is not empty), as any later leader adopts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteSegment {
    pub version: u32,
    pub base_offset: i64,
    /// One past its last offset.
    pub next_offset: i64,
    pub size_bytes: u64,
    pub max_timestamp_ms: i64,
    pub offset_of_max_timestamp: i64,
    pub object: String,
    /// Its aborted transactions: producer id, first offset, last offset
    /// (the ABORT marker's), last stable offset.
    #[serde(default)]
    pub aborted: Vec<[i64; 4]>,
}

/// One partition's batches in a WAL object: offsets `base_offset ..
/// end_offset` at bytes `position .. position + length`, whole batches in
/// Kafka's format, stamped with `leader_epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalRange {
    pub topic_id: Uuid,
    pub partition: i32,
    pub leader_epoch: i32,
    pub base_offset: i64,
    pub end_offset: i64,
    pub position: u64,
    pub length: u64,
}

/// A committed WAL object (or one part of it, when its partitions span
/// several transactions): its name in the object store and its ranges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalIndex {
    pub version: u32,
    pub object: String,
    pub ranges: Vec<WalRange>,
    /// How many parts (transactions) the object is committed in; 0 in an
    /// index written before this field (never collected).
    #[serde(default)]
    pub parts: usize,
}

/// The broker committing: its node id and the epoch of its session (the
/// revision of its registration), which every commit compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    pub node_id: i32,
    pub epoch: i64,
}

/// A claimed partition: where its committed log ends, and the revision
/// of its key that the next commit compares against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimed {
    pub end_offset: i64,
    pub revision: i64,
    /// The log start offset: the commit's, or the one its last leader
    /// recorded, whichever is further.
    pub log_start: i64,
    /// The broker that claimed the partition before (this one, for a
    /// partition never claimed).
    pub previous: i32,
    /// The broker whose log holds every committed record ([`LogCommit::writer`]).
    pub writer: i32,
}

/// What a commit of one WAL object decided for each of its partitions,
/// in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartOutcome {
    /// Committed; the key's new revision.
    Committed(i64),
    /// Another leader (or this one in another epoch) holds the partition:
    /// nothing was committed for it.
    Fenced,
}

/// The key of a partition's commit.
pub fn log_key(settings: &Settings, topic_id: Uuid, partition: i32) -> String {
    format!("{}.logs/{}/{partition}", settings.prefix, topic_id.simple())
}

/// The key of a committed WAL object's index (part `part` of it); `id`
/// names the object among its broker's, across restarts.
pub fn wal_key(settings: &Settings, node_id: i32, id: &str, part: usize) -> String {
    format!("{}.wal/{node_id}/{id}.{part}", settings.prefix)
}

/// The key of a partition's claim.
pub fn claim_key(settings: &Settings, topic_id: Uuid, partition: i32) -> String {
    format!("{}.claims/{}/{partition}", settings.prefix, topic_id.simple())
}

/// The key of a partition's recorded log start.
pub fn start_key(settings: &Settings, topic_id: Uuid, partition: i32) -> String {
    format!("{}.starts/{}/{partition}", settings.prefix, topic_id.simple())
}

/// A partition's claim, as its claim key holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogClaim {
    pub version: u32,
    pub leader: i32,
    pub leader_epoch: i32,
}

/// A partition's log start, as its leader recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogStart {
    pub version: u32,
    pub log_start: i64,
}

/// The prefix of every committed WAL object's index.
pub fn wal_prefix(settings: &Settings) -> String {
    format!("{}.wal/", settings.prefix)
}

/// The prefix of a partition's segment keys.
pub fn segments_prefix(settings: &Settings, topic_id: Uuid, partition: i32) -> String {
    format!("{}.segments/{}/{partition}/", settings.prefix, topic_id.simple())
}

fn segment_key(settings: &Settings, topic_id: Uuid, partition: i32, base_offset: i64) -> String {
    format!(
        "{}{base_offset:020}",
        segments_prefix(settings, topic_id, partition)
    )
}

fn registration(settings: &Settings, session: Session) -> Compare {
    Compare::ModRevision(
        settings.key(&format!("brokers/{}", session.node_id)),
        session.epoch,
    )
}

fn decode(kv: &KeyValue) -> Option<LogCommit> {
    serde_json::from_slice(&kv.value).ok()
}

/// Claims a partition for `session`'s broker in `leader_epoch`: its key
/// then names this broker and epoch at a new revision, so commits of any
/// earlier term fail, this broker's own included (a claim always writes).
/// `None` if a newer epoch holds it or this session has ended. A
/// partition never committed before starts committed at the end of the
/// claiming broker's log, `local` (its start and end offsets), with this
/// broker as its writer; [`seed`] writes that for a topic a directory
/// brings into the cluster, so only its broker's log counts.
///
/// The claimed partition's records are then those committed: the caller
/// cuts its local log to the committed end if it is the writer, and
/// rebuilds it from the object store ([`partition_log`]) if not.
pub async fn claim(
    store: &dyn CoordStore,
    settings: &Settings,
    session: Session,
    (topic_id, partition): (Uuid, i32),
    leader_epoch: i32,
    local: (i64, i64),
) -> Result<Option<Claimed>, StoreError> {
    let (local_start, local_end) = local;
    let key = log_key(settings, topic_id, partition);
    loop {
        let current = store.get(&key).await?;
        let commit = current.as_ref().map(|kv| (decode(kv), kv.mod_revision));
        let (end_offset, log_start, writer, previous) = match &commit {
            None => (local_end, local_start, session.node_id, session.node_id),
            Some((None, _)) => {
                return Err(StoreError::Refused(format!(
                    "{key} does not hold a commit Keel can read"
                )))
            }
            Some((Some(c), _)) if c.leader_epoch > leader_epoch => return Ok(None),
            Some((Some(c), _)) => (c.end_offset, c.log_start, c.writer(), c.leader),
        };
        let when = match &commit {
            None => Compare::Absent(key.clone()),
            Some((_, revision)) => Compare::ModRevision(key.clone(), *revision),
        };
        let value = LogCommit {
            version: 1,
            leader: session.node_id,
            leader_epoch,
            end_offset,
            log_start,
            writer,
        };
        let put = Op::Put {
            key: key.clone(),
            value: serde_json::to_vec(&value).expect("a commit serializes"),
            lease: None,
        };
        let claim = LogClaim {
            version: 1,
            leader: session.node_id,
            leader_epoch,
        };
        let put_claim = Op::Put {
            key: claim_key(settings, topic_id, partition),
            value: serde_json::to_vec(&claim).expect("a claim serializes"),
            lease: None,
        };
        if let Some(revision) = store
            .txn(vec![registration(settings, session), when], vec![put, put_claim])
            .await?
        {
            let recorded = recorded_start(store, settings, (topic_id, partition)).await?;
            return Ok(Some(Claimed {
                end_offset,
                revision,
                log_start: log_start.max(recorded),
                writer,
                previous,
            }));
        }
        if !session_holds(store, settings, session).await? {
            return Ok(None);
        }
        // The key changed meanwhile: read it again.
    }
}

async fn session_holds(
    store: &dyn CoordStore,
    settings: &Settings,
    session: Session,
) -> Result<bool, StoreError> {
    let key = settings.key(&format!("brokers/{}", session.node_id));
    Ok(store
        .get(&key)
        .await?
        .is_some_and(|kv| kv.mod_revision == session.epoch))
}

/// One partition's part of a commit: its range in the object, and the
/// revision of its key this leader last wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPart {
    pub range: WalRange,
    pub revision: i64,
    /// The partition's log start offset now.
    pub log_start: i64,
}

/// Commits the WAL object `object` (`id` among this broker's): for each
/// part, its partition's end offset moves to the part's end, if the
/// partition's key is still at the part's revision and `session` holds.
/// Partitions go in transactions of [`PARTS_PER_TXN`], each with its
/// share of the index. `Ok(None)` if the session has ended (nothing more
/// is committed); an error if the store did not answer (the caller
/// retries the same object: a part that did land is recognised by its
/// index key).
pub async fn commit(
    store: &dyn CoordStore,
    settings: &Settings,
    session: Session,
    (object, id): (&str, &str),
    parts: &[CommitPart],
) -> Result<Option<Vec<PartOutcome>>, StoreError> {
    let mut outcomes = Vec::with_capacity(parts.len());
    let count = parts.len().div_ceil(PARTS_PER_TXN);
    for (n, chunk) in parts.chunks(PARTS_PER_TXN).enumerate() {
        match commit_chunk(store, settings, session, (object, id, (n, count)), chunk).await? {
            Some(decided) => outcomes.extend(decided),
            None => return Ok(None),
        }
    }
    Ok(Some(outcomes))
}

async fn commit_chunk(
    store: &dyn CoordStore,
    settings: &Settings,
    session: Session,
    (object, id, (part, parts)): (&str, &str, (usize, usize)),
    chunk: &[CommitPart],
) -> Result<Option<Vec<PartOutcome>>, StoreError> {
    let index_key = wal_key(settings, session.node_id, id, part);
    let mut live: Vec<usize> = (0..chunk.len()).collect();
    let mut outcomes = vec![PartOutcome::Fenced; chunk.len()];
    loop {
        let mut when = vec![
            registration(settings, session),
            Compare::Absent(index_key.clone()),
        ];
        let mut ops = Vec::with_capacity(live.len() + 1);
        for &i in &live {
            let r = &chunk[i].range;
            let key = log_key(settings, r.topic_id, r.partition);
            when.push(Compare::ModRevision(key.clone(), chunk[i].revision));
            let value = LogCommit {
                version: 1,
                leader: session.node_id,
                leader_epoch: r.leader_epoch,
                end_offset: r.end_offset,
                log_start: chunk[i].log_start,
                writer: session.node_id,
            };
            ops.push(Op::Put {
                key,
                value: serde_json::to_vec(&value).expect("a commit serializes"),
                lease: None,
            });
        }
        let index = WalIndex {
            version: 1,
            object: object.to_string(),
            ranges: live.iter().map(|&i| chunk[i].range.clone()).collect(),
            parts,
        };
        ops.push(Op::Put {
            key: index_key.clone(),
            value: serde_json::to_vec(&index).expect("an index serializes"),
            lease: None,
        });
        if let Some(revision) = store.txn(when, ops).await? {
            for &i in &live {
                outcomes[i] = PartOutcome::Committed(revision);
            }
            return Ok(Some(outcomes));
        }
        // A compare failed: this part landed already (an earlier answer
        // was lost), the session ended, or some partitions moved on.
        if let Some(kv) = store.get(&index_key).await? {
            return Ok(Some(landed(&kv, chunk)));
        }
        if !session_holds(store, settings, session).await? {
            return Ok(None);
        }
        if live.is_empty() {
            // Every partition of this part was fenced, and its index (no
            // ranges) is written: garbage collection counts the object's
            // parts by their keys.
            return Ok(Some(outcomes));
        }
        let mut still = Vec::with_capacity(live.len());
        for &i in &live {
            let r = &chunk[i].range;
            let current = store.get(&log_key(settings, r.topic_id, r.partition)).await?;
            if current.is_some_and(|kv| kv.mod_revision == chunk[i].revision) {
                still.push(i);
            }
        }
        live = still;
    }
}

/// The outcomes of a part whose transaction landed: the partitions its
/// index names were committed at its revision, the others were not.
fn landed(index: &KeyValue, chunk: &[CommitPart]) -> Vec<PartOutcome> {
    let ranges = serde_json::from_slice::<WalIndex>(&index.value)
        .map(|i| i.ranges)
        .unwrap_or_default();
    chunk
        .iter()
        .map(|p| match ranges.contains(&p.range) {
            true => PartOutcome::Committed(index.mod_revision),
            false => PartOutcome::Fenced,
        })
        .collect()
}

/// Writes a partition's first commit for a topic a directory brings into
/// the cluster: committed to the end of `session`'s log (`local`: its
/// start and end), which is the writer. Nothing if the partition has a
/// commit already. So a broker claiming it before the directory's broker
/// does cannot take it with an empty log.
pub async fn seed(
    store: &dyn CoordStore,
    settings: &Settings,
    session: Session,
    (topic_id, partition): (Uuid, i32),
    local: (i64, i64),
) -> Result<(), StoreError> {
    let key = log_key(settings, topic_id, partition);
    let value = LogCommit {
        version: 1,
        leader: session.node_id,
        leader_epoch: 0,
        end_offset: local.1,
        log_start: local.0,
        writer: session.node_id,
    };
    let put = Op::Put {
        key: key.clone(),
        value: serde_json::to_vec(&value).expect("a commit serializes"),
        lease: None,
    };
    store
        .txn(
            vec![registration(settings, session), Compare::Absent(key)],
            vec![put],
        )
        .await?;
    Ok(())
}

/// What [`publish_segment`] did with a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// Recorded (now, or by an earlier call whose answer was lost).
    Recorded,
    /// Not recorded, and never will be: what is recorded already holds
    /// more of the log from its base offset (a longer copy), or a recorded
    /// copy overlaps it not on its boundaries (one from below it, or from
    /// inside it past its end), or the record at its base offset is one
    /// this broker cannot read. Recording it could leave a gap; the
    /// recorded copies stay the log's.
    Superseded,
    /// This broker's claim or session has ended: the next leader's copies
    /// count, and this one is an orphan for its mover to sweep.
    Fenced,
}

/// How many records of covered copies one transaction of
/// [`publish_segment`] deletes (etcd takes at most 128 operations, and as
/// many compares, in one transaction).
const REPLACED_AT_ONCE: usize = 100;

/// Records a sealed segment the leader copied to the object store, if
/// `session` holds and the partition's claim is still the one made at
/// `revision`. A deposed leader's copy is never recorded.
///
/// A copy replaces the recorded ones it covers: the one at its base
/// offset (a cleaned segment keeps the first replaced segment's base
/// offset) in the transaction that records it, and those starting inside
/// it (a cleaned group of several) in that one and, beyond
/// [`REPLACED_AT_ONCE`], the next ones. A record a longer one covers is
/// never used ([`chain`]), so the records left between two transactions,
/// or by a leader that stopped between them (the next call for the copy
/// deletes them), change nothing a rebuild sees. Once this returns
/// `Recorded`, the replaced copies are recorded nowhere, and their leader
/// may delete them ([`forget_segment`]). A copy shorter than the one
/// recorded at its base, or overlapping a recorded one not on its
/// boundaries, is [`Published::Superseded`]: recording it could leave a
/// gap.
pub async fn publish_segment(
    store: &dyn CoordStore,
    settings: &Settings,
    session: Session,
    (topic_id, partition): (Uuid, i32),
    revision: i64,
    segment: &RemoteSegment,
) -> Result<Published, StoreError> {
    let claim = claim_key(settings, topic_id, partition);
    let key = segment_key(settings, topic_id, partition, segment.base_offset);
    let (base, next) = (segment.base_offset, segment.next_offset);
    let mut continuing = false;
    loop {
        let recorded = store
            .range(&segments_prefix(settings, topic_id, partition))
            .await?;
        let mut when = vec![
            registration(settings, session),
            Compare::ModRevision(claim.clone(), revision),
        ];
        let mut ops = Vec::new();
        let mut at_base = None;
        let mut covered = 0;
        for kv in &recorded.kvs {
            let old = serde_json::from_slice::<RemoteSegment>(&kv.value);
            if kv.key == key {
                // What this broker cannot read (another version's), it
                // does not replace.
                let Ok(old) = old else {
                    return Ok(Published::Superseded);
                };
                if old.object != segment.object && old.next_offset > next {
                    return Ok(Published::Superseded);
                }
                at_base = Some((kv, old.object == segment.object));
                continue;
            }
            let Ok(old) = old else {
                continue;
            };
            let overlaps = old.base_offset < next && old.next_offset > base;
            let inside = old.base_offset > base && old.next_offset <= next;
            if overlaps && !inside {
                return Ok(Published::Superseded);
            }
            if inside {
                covered += 1;
                if covered <= REPLACED_AT_ONCE {
                    when.push(Compare::ModRevision(kv.key.clone(), kv.mod_revision));
                    ops.push(Op::Delete(kv.key.clone()));
                }
            }
        }
        match at_base {
            // Recorded by the first transaction, and forgotten since (the
            // log start passed it): nothing is left to replace.
            None if continuing => return Ok(Published::Recorded),
            Some((_, true)) if ops.is_empty() => return Ok(Published::Recorded),
            Some((kv, true)) => when.push(Compare::ModRevision(kv.key.clone(), kv.mod_revision)),
            Some((kv, false)) => {
                when.push(Compare::ModRevision(kv.key.clone(), kv.mod_revision));
                ops.push(put_segment(key.clone(), segment));
            }
            None => {
                when.push(Compare::Absent(key.clone()));
                ops.push(put_segment(key.clone(), segment));
            }
        }
        if store.txn(when, ops).await?.is_some() {
            if covered <= REPLACED_AT_ONCE {
                return Ok(Published::Recorded);
            }
            continuing = true;
            continue; // more covered records to delete
        }
        // A copy was recorded or forgotten meanwhile (by this leader: a
        // changed claim or an ended session is final): look again.
        let claimed = store
            .get(&claim)
            .await?
            .is_some_and(|kv| kv.mod_revision == revision);
        if !claimed || !session_holds(store, settings, session).await? {
            return Ok(Published::Fenced);
        }
    }
}

fn put_segment(key: String, segment: &RemoteSegment) -> Op {
    Op::Put {
        key,
        value: serde_json::to_vec(segment).expect("a segment serializes"),
        lease: None,
    }
}

/// Whether a copy about to be deleted may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forget {
    /// Recorded nowhere (now): delete it.
    Gone,
    /// Recorded, and holding records at or past the log start (a copy the
    /// cleaner or a tier change replaced): a rebuild may need it, keep it.
    Needed,
    /// This broker's claim or session has ended: leave it to the leader.
    Fenced,
}

/// Forgets a segment copy the leader is about to delete (retention,
/// DeleteRecords), under the same conditions as [`publish_segment`], and
/// records the log start (`log_start`, past the copy) in the same
/// transaction, so the recorded segments never seem to leave a gap below
/// it. A recorded copy not wholly below `log_start` is not forgotten.
pub async fn forget_segment(
    store: &dyn CoordStore,
    settings: &Settings,
    session: Session,
    (topic_id, partition): (Uuid, i32),
    revision: i64,
    (base_offset, object, log_start): (i64, &str, i64),
) -> Result<Forget, StoreError> {
    let key = segment_key(settings, topic_id, partition, base_offset);
    let Some(kv) = store.get(&key).await? else {
        return Ok(Forget::Gone);
    };
    let Some(recorded) = serde_json::from_slice::<RemoteSegment>(&kv.value)
        .ok()
        .filter(|s| s.object == object)
    else {
        return Ok(Forget::Gone);
    };
    if recorded.next_offset > log_start {
        return Ok(Forget::Needed);
    }
    let (start_when, start_put) = start_update(store, settings, (topic_id, partition), log_start).await?;
    let when = vec![
        registration(settings, session),
        Compare::ModRevision(claim_key(settings, topic_id, partition), revision),
        Compare::ModRevision(key.clone(), kv.mod_revision),
        start_when,
    ];
    let mut ops = vec![Op::Delete(key)];
    ops.extend(start_put);
    Ok(match store.txn(when, ops).await? {
        Some(_) => Forget::Gone,
        None => Forget::Fenced,
    })
}

/// Records the partition's log start, if it is past the one recorded,
/// under the same conditions as [`publish_segment`]: whether it holds
/// now. A new leader rebuilding the log starts it there at least.
pub async fn record_log_start(
    store: &dyn CoordStore,
    settings: &Settings,
    session: Session,
    (topic_id, partition): (Uuid, i32),
    revision: i64,
    log_start: i64,
) -> Result<bool, StoreError> {
    loop {
        let (start_when, start_put) = start_update(store, settings, (topic_id, partition), log_start).await?;
        let Some(put) = start_put else {
            return Ok(true);
        };
        let claim = claim_key(settings, topic_id, partition);
        let when = vec![
            registration(settings, session),
            Compare::ModRevision(claim.clone(), revision),
            start_when,
        ];
        if store.txn(when, vec![put]).await?.is_some() {
            return Ok(true);
        }
        // Another record of this leader's moved the start meanwhile; a
        // changed claim or an ended session is final.
        let claimed = store
            .get(&claim)
            .await?
            .is_some_and(|kv| kv.mod_revision == revision);
        if !claimed || !session_holds(store, settings, session).await? {
            return Ok(false);
        }
    }
}

/// The compare on a partition's start key as it is now, and the put that
/// moves it to `log_start` (none if it is there already or past it).
async fn start_update(
    store: &dyn CoordStore,
    settings: &Settings,
    (topic_id, partition): (Uuid, i32),
    log_start: i64,
) -> Result<(Compare, Option<Op>), StoreError> {
    let key = start_key(settings, topic_id, partition);
    let current = store.get(&key).await?;
    let recorded = current
        .as_ref()
        .and_then(|kv| serde_json::from_slice::<LogStart>(&kv.value).ok())
        .map_or(-1, |s| s.log_start);
    let when = match &current {
        Some(kv) => Compare::ModRevision(key.clone(), kv.mod_revision),
        None => Compare::Absent(key.clone()),
    };
    let put = (log_start > recorded).then(|| Op::Put {
        key,
        value: serde_json::to_vec(&LogStart {
            version: 1,
            log_start,
        })
        .expect("a log start serializes"),
        lease: None,
    });
    Ok((when, put))
}

/// The log start a partition's leader last recorded, -1 if none.
async fn recorded_start(
    store: &dyn CoordStore,
    settings: &Settings,
    (topic_id, partition): (Uuid, i32),
) -> Result<i64, StoreError> {
    Ok(store
        .get(&start_key(settings, topic_id, partition))
        .await?
        .and_then(|kv| serde_json::from_slice::<LogStart>(&kv.value).ok())
        .map_or(-1, |s| s.log_start))
}

/// Where a claimed partition's committed records are, for a leader that
/// rebuilds its log from the object store: sealed segments from the log
/// start, then WAL ranges to the committed end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSources {
    pub log_start: i64,
    /// Sealed segments, each starting where the one before ends.
    pub segments: Vec<RemoteSegment>,
    /// Where the segments end (the log start if there are none) and the
    /// WAL takes over.
    pub wal_from: i64,
    /// WAL ranges holding `wal_from .. end`, in order, with their objects'
    /// names; the first may begin before `wal_from` (its batches below it
    /// are skipped).
    pub wal: Vec<(String, WalRange)>,
    pub end: i64,
}

/// Reads where `claimed`'s records are ([`sources`]). The outer error is
/// the store's; the inner one says which records the object store lacks.
pub async fn partition_log(
    store: &dyn CoordStore,
    settings: &Settings,
    partition: (Uuid, i32),
    claimed: &Claimed,
) -> Result<Result<LogSources, String>, StoreError> {
    let wal = wal_ranges(store, settings).await?;
    let (segments, ranges) = stored_sources(store, settings, partition, &wal).await?;
    let log_start = claimed
        .log_start
        .max(recorded_start(store, settings, partition).await?);
    Ok(sources(log_start, claimed.end_offset, segments, ranges))
}

/// Every committed WAL range, with its object's name.
async fn wal_ranges(
    store: &dyn CoordStore,
    settings: &Settings,
) -> Result<Vec<(String, WalRange)>, StoreError> {
    let indexes = store.range(&wal_prefix(settings)).await?;
    let mut ranges = Vec::new();
    for kv in &indexes.kvs {
        let Ok(index) = serde_json::from_slice::<WalIndex>(&kv.value) else {
            continue;
        };
        ranges.extend(index.ranges.into_iter().map(|r| (index.object.clone(), r)));
    }
    Ok(ranges)
}

/// The objects every WAL index key names; `None` if a key does not read
/// as an index (another version's?): then which objects are named is not
/// known.
pub async fn wal_objects(
    store: &dyn CoordStore,
    settings: &Settings,
) -> Result<Option<std::collections::BTreeSet<String>>, StoreError> {
    let indexes = store.range(&wal_prefix(settings)).await?;
    Ok(indexes
        .kvs
        .iter()
        .map(|kv| {
            serde_json::from_slice::<WalIndex>(&kv.value)
                .ok()
                .map(|index| index.object)
        })
        .collect())
}

/// A partition's recorded segments, and its ranges among `wal`.
async fn stored_sources(
    store: &dyn CoordStore,
    settings: &Settings,
    (topic_id, partition): (Uuid, i32),
    wal: &[(String, WalRange)],
) -> Result<(Vec<RemoteSegment>, Vec<(String, WalRange)>), StoreError> {
    let listed = store
        .range(&segments_prefix(settings, topic_id, partition))
        .await?;
    let segments = listed
        .kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
        .collect();
    let ranges = wal
        .iter()
        .filter(|(_, r)| r.topic_id == topic_id && r.partition == partition)
        .cloned()
        .collect();
    Ok((segments, ranges))
}

/// For each of `partitions`, whether another broker could rebuild its log
/// from the object store now ([`sources`] for its last commit), or why
/// not. A partition never committed holds nothing to rebuild.
pub async fn rebuildable(
    store: &dyn CoordStore,
    settings: &Settings,
    partitions: &[(Uuid, i32)],
) -> Result<Vec<Result<(), String>>, StoreError> {
    // The commits first: a WAL index read after a commit holds every
    // range it committed (both are written in one transaction).
    let mut commits = Vec::with_capacity(partitions.len());
    for &(topic_id, index) in partitions {
        let commit = match store.get(&log_key(settings, topic_id, index)).await? {
            None => None,
            Some(kv) => Some(serde_json::from_slice::<LogCommit>(&kv.value).map_err(|_| ())),
        };
        commits.push(commit);
    }
    let wal = wal_ranges(store, settings).await?;
    let mut out = Vec::with_capacity(partitions.len());
    for (&(topic_id, index), commit) in partitions.iter().zip(commits) {
        let commit = match commit {
            None => {
                out.push(Ok(()));
                continue;
            }
            Some(Err(())) => {
                out.push(Err("its commit is unreadable".to_string()));
                continue;
            }
            Some(Ok(c)) => c,
        };
        let (segments, ranges) = stored_sources(store, settings, (topic_id, index), &wal).await?;
        let log_start = commit
            .log_start
            .max(recorded_start(store, settings, (topic_id, index)).await?);
        out.push(sources(log_start, commit.end_offset, segments, ranges).map(|_| ()));
    }
    Ok(out)
}

/// Chooses the sources of a log that starts at `log_start` (as its last
/// commit knew it) and is committed to `end`: the segments that follow
/// one another from the first, then the WAL ranges from where they end.
/// Refused if some committed record is in neither: a gap between
/// segments or ranges, or records below the WAL that no segment holds (a
/// topic a directory brought in, whose older segments are not all
/// copied yet).
pub fn sources(
    log_start: i64,
    end: i64,
    segments: Vec<RemoteSegment>,
    mut ranges: Vec<(String, WalRange)>,
) -> Result<LogSources, String> {
    let chain = chain(log_start, segments);
    if chain.last().is_some_and(|l| l.next_offset > end) {
        return Err(format!(
            "a segment in the object store ends past the committed offset {end}"
        ));
    }
    // The recorded log start moves with every copy forgotten, so the
    // first segment starts at or below it: records between are in none.
    if let Some(first) = chain.first().filter(|f| f.base_offset > log_start) {
        return Err(format!(
            "records {log_start}..{} are in no segment in the object store (not copied there)",
            first.base_offset
        ));
    }
    let start = chain.first().map_or(log_start, |s| s.base_offset.max(log_start));
    let wal_from = chain.last().map_or(log_start, |s| s.next_offset);
    ranges.retain(|(_, r)| r.end_offset > wal_from && r.base_offset < r.end_offset);
    ranges.sort_by_key(|(_, r)| r.base_offset);
    // Without segments, the WAL must hold the log from its start: a
    // directory's records from before it joined are in no WAL object.
    if let Some((_, first)) = ranges.first().filter(|_| chain.is_empty()) {
        if first.base_offset > log_start {
            return Err(format!(
                "records {log_start}..{} are on their first broker's disk only (not yet copied to the object store)",
                first.base_offset
            ));
        }
    }
    let mut at = wal_from;
    let mut wal = Vec::new();
    for (object, r) in ranges {
        if at >= end {
            break;
        }
        if r.base_offset > at {
            break;
        }
        if r.end_offset <= at {
            continue;
        }
        if !wal.is_empty() && r.base_offset != at {
            return Err(format!("WAL ranges overlap at offset {}", r.base_offset));
        }
        at = r.end_offset;
        wal.push((object, r));
    }
    if at < end {
        return Err(format!(
            "records {at}..{end} are in no segment and no WAL object in the object store"
        ));
    }
    if at > end {
        return Err(format!("the WAL holds records past the committed offset {end}"));
    }
    Ok(LogSources {
        log_start: start,
        segments: chain,
        wal_from,
        wal,
        end,
    })
}

/// What the coordination store records that nothing needs any more.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Garbage {
    /// WAL objects every range of which is below its partition's sealed
    /// segments or log start, or of a deleted topic: the object's name,
    /// its ranges' bytes, and its index keys.
    pub wal: Vec<(String, u64, Vec<String>)>,
    /// Segment copies of deleted topics: the copy and its key.
    pub segments: Vec<(RemoteSegment, String)>,
    /// Commit, claim and log start keys of deleted topics.
    pub commits: Vec<String>,
}

/// Finds [`Garbage`]. `removed`: the ids of topics the caller saw
/// deleted (topic ids are never reused, so none of them comes back; a
/// topic it never saw is never taken for deleted). `settled`: WAL objects
/// written so long ago that no more of their parts can be committed (a
/// broker gives up an object's commit minutes after its write): such an
/// object with parts never committed is garbage once the parts that were
/// are.
pub async fn garbage(
    store: &dyn CoordStore,
    settings: &Settings,
    removed: &std::collections::HashSet<Uuid>,
    settled: &std::collections::HashSet<String>,
) -> Result<Garbage, StoreError> {
    use std::collections::BTreeMap;
    let commits = store.range(&format!("{}.logs/", settings.prefix)).await?;
    let claims = store.range(&format!("{}.claims/", settings.prefix)).await?;
    let recorded_starts = store.range(&format!("{}.starts/", settings.prefix)).await?;
    let segments = store.range(&format!("{}.segments/", settings.prefix)).await?;
    let indexes = store.range(&wal_prefix(settings)).await?;
    let deleted = |id: &Uuid, _: &KeyValue| removed.contains(id);
    let mut out = Garbage::default();
    // Each partition's log start, and its recorded segments.
    let mut starts: BTreeMap<(Uuid, i32), i64> = BTreeMap::new();
    for kv in &commits.kvs {
        let Some((id, p)) = partition_of(&kv.key) else {
            continue;
        };
        if deleted(&id, kv) {
            out.commits.push(kv.key.clone());
        } else if let Some(c) = decode(kv) {
            starts.insert((id, p), c.log_start);
        }
    }
    for kv in &claims.kvs {
        if partition_of(&kv.key).is_some_and(|(id, _)| deleted(&id, kv)) {
            out.commits.push(kv.key.clone());
        }
    }
    for kv in &recorded_starts.kvs {
        let Some((id, p)) = partition_of(&kv.key) else {
            continue;
        };
        if deleted(&id, kv) {
            out.commits.push(kv.key.clone());
        } else if let Ok(s) = serde_json::from_slice::<LogStart>(&kv.value) {
            let start = starts.entry((id, p)).or_insert(s.log_start);
            *start = (*start).max(s.log_start);
        }
    }
    let mut recorded: BTreeMap<(Uuid, i32), Vec<RemoteSegment>> = BTreeMap::new();
    for kv in &segments.kvs {
        let Some((id, p)) = partition_of(&kv.key) else {
            continue;
        };
        let Ok(segment) = serde_json::from_slice::<RemoteSegment>(&kv.value) else {
            continue;
        };
        if deleted(&id, kv) {
            out.segments.push((segment, kv.key.clone()));
        } else {
            recorded.entry((id, p)).or_default().push(segment);
        }
    }
    // Below this offset a partition's records are in sealed segments (or
    // gone): the WAL ranges there are covered.
    // As a rebuild sees it (`sources`): segments that do not reach down
    // to the log start cover nothing.
    let mut covered_at: BTreeMap<(Uuid, i32), i64> = BTreeMap::new();
    let mut covered = |id: Uuid, p: i32| -> i64 {
        *covered_at.entry((id, p)).or_insert_with(|| {
            let start = starts.get(&(id, p)).copied().unwrap_or(0);
            let segs = recorded.get(&(id, p)).cloned().unwrap_or_default();
            let chain = chain(start, segs);
            match (chain.first(), chain.last()) {
                (Some(first), Some(last)) if first.base_offset <= start => last.next_offset.max(start),
                _ => start,
            }
        })
    };
    let mut objects: BTreeMap<String, (usize, Vec<String>, u64, bool)> = BTreeMap::new();
    // An index key this broker cannot read (another version's) may be a
    // part of any object: then no object counts as settled.
    let mut unreadable = false;
    for kv in &indexes.kvs {
        let Ok(index) = serde_json::from_slice::<WalIndex>(&kv.value) else {
            unreadable = true;
            continue;
        };
        let entry = objects
            .entry(index.object.clone())
            .or_insert((index.parts, Vec::new(), 0, true));
        entry.1.push(kv.key.clone());
        for r in &index.ranges {
            entry.2 += r.length;
            let gone = removed.contains(&r.topic_id);
            if !gone && r.end_offset > covered(r.topic_id, r.partition) {
                entry.3 = false;
            }
        }
    }
    for (object, (parts, keys, bytes, all_covered)) in objects {
        // Every part committed (one still committing may name live
        // records), or none can be any more.
        let complete = (parts > 0 && keys.len() == parts) || (!unreadable && settled.contains(&object));
        if all_covered && complete {
            out.wal.push((object, bytes, keys));
        }
    }
    Ok(out)
}

/// The segments of a log starting at `log_start` that follow one
/// another from the first: those past a gap are not used.
fn chain(log_start: i64, mut segments: Vec<RemoteSegment>) -> Vec<RemoteSegment> {
    segments.retain(|s| s.next_offset > log_start && s.base_offset < s.next_offset);
    segments.sort_by_key(|s| s.base_offset);
    let mut chain: Vec<RemoteSegment> = Vec::new();
    for s in segments {
        match chain.last() {
            None => chain.push(s),
            Some(last) if s.base_offset == last.next_offset => chain.push(s),
            Some(last) if s.next_offset <= last.next_offset => {} // covered already
            Some(_) => break,                                     // a gap, or an overlap not on a boundary
        }
    }
    chain
}

/// The partition a `.logs/` or `.segments/` key names.
fn partition_of(key: &str) -> Option<(Uuid, i32)> {
    let mut parts = key.rsplit('/');
    let last = parts.next()?;
    let (id, p) = match last.parse::<i32>() {
        // `.logs/<id>/<p>`
        Ok(p) if !key.contains(".segments/") => (parts.next()?, p),
        // `.segments/<id>/<p>/<base>`
        _ => {
            let p = parts.next()?.parse().ok()?;
            (parts.next()?, p)
        }
    };
    Some((Uuid::parse_str(id).ok()?, p))
}

/// Deletes `keys`, many to a transaction.
pub async fn delete_keys(store: &dyn CoordStore, keys: &[String]) -> Result<(), StoreError> {
    for chunk in keys.chunks(100) {
        let ops = chunk.iter().map(|k| Op::Delete(k.clone())).collect();
        store.txn(Vec::new(), ops).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::LocalStore;
    use std::time::Duration;

    fn settings() -> Settings {
        Settings {
            prefix: "/k".into(),
            session_timeout: Duration::from_secs(6),
            leader_balance: None,
        }
    }

    /// Broker 1, registered, and a new topic's partition 0 it claimed in
    /// epoch 0.
    async fn claimed_by_one(store: &LocalStore, s: &Settings) -> (Uuid, Session, Claimed) {
        let topic = Uuid::new_v4();
        let one = register(store, 1).await;
        let claimed = claim(store, s, one, (topic, 0), 0, (0, 0))
            .await
            .unwrap()
            .unwrap();
        (topic, one, claimed)
    }

    async fn register(store: &LocalStore, node_id: i32) -> Session {
        let put = Op::Put {
            key: format!("/k/brokers/{node_id}"),
            value: b"{}".to_vec(),
            lease: None,
        };
        let epoch = store.txn(vec![], vec![put]).await.unwrap().unwrap();
        Session { node_id, epoch }
    }

    fn part(topic_id: Uuid, base: i64, end: i64, epoch: i32, revision: i64) -> CommitPart {
        CommitPart {
            range: WalRange {
                topic_id,
                partition: 0,
                leader_epoch: epoch,
                base_offset: base,
                end_offset: end,
                position: 0,
                length: 10,
            },
            revision,
            log_start: 0,
        }
    }

    #[tokio::test]
    async fn a_newer_leader_fences_the_old_ones_commits() {
        let (store, s) = (LocalStore::new(), settings());
        let (topic, one, claimed) = claimed_by_one(&store, &s).await;
        assert_eq!(claimed.end_offset, 0);
        let decided = commit(
            &store,
            &s,
            one,
            ("o1", "1"),
            &[part(topic, 0, 5, 0, claimed.revision)],
        )
        .await
        .unwrap()
        .unwrap();
        let PartOutcome::Committed(rev) = decided[0] else {
            panic!("{decided:?}")
        };
        // Broker 2 takes the partition over in epoch 1 and sees offset 5.
        let two = register(&store, 2).await;
        // Its log ends short of the commit: broker 1 wrote the records,
        // so broker 2 is told to rebuild its log from the object store.
        let taken = claim(&store, &s, two, (topic, 0), 1, (0, 4))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((taken.end_offset, taken.writer), (5, 1));
        // Broker 1's next commit is refused; an older epoch cannot claim.
        let stale = commit(&store, &s, one, ("o2", "2"), &[part(topic, 5, 9, 0, rev)])
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stale, vec![PartOutcome::Fenced]);
        assert_eq!(claim(&store, &s, one, (topic, 0), 0, (0, 0)).await.unwrap(), None);
        let kv = store.get(&log_key(&s, topic, 0)).await.unwrap().unwrap();
        assert_eq!(decode(&kv).unwrap().end_offset, 5);
    }

    #[tokio::test]
    async fn an_ended_session_commits_nothing_and_a_landed_commit_is_recognised() {
        let (store, s) = (LocalStore::new(), settings());
        let topic = Uuid::new_v4();
        let one = register(&store, 1).await;
        let claimed = claim(&store, &s, one, (topic, 0), 3, (0, 0))
            .await
            .unwrap()
            .unwrap();
        let p = part(topic, 0, 4, 3, claimed.revision);
        let first = commit(&store, &s, one, ("o1", "7"), std::slice::from_ref(&p))
            .await
            .unwrap();
        // The same object again (its answer was lost): recognised, not fenced.
        let again = commit(&store, &s, one, ("o1", "7"), std::slice::from_ref(&p))
            .await
            .unwrap();
        assert_eq!(first, again);
        // The registration goes (the lease expired): nothing more lands.
        store
            .txn(vec![], vec![Op::Delete("/k/brokers/1".into())])
            .await
            .unwrap();
        let PartOutcome::Committed(rev) = first.unwrap()[0] else {
            panic!()
        };
        let late = commit(&store, &s, one, ("o2", "8"), &[part(topic, 4, 6, 3, rev)])
            .await
            .unwrap();
        assert_eq!(late, None);
        assert_eq!(claim(&store, &s, one, (topic, 0), 4, (0, 0)).await.unwrap(), None);
    }

    #[tokio::test]
    async fn many_partitions_commit_in_several_transactions() {
        let (store, s) = (LocalStore::new(), settings());
        let one = register(&store, 1).await;
        let mut parts = Vec::new();
        for _ in 0..150 {
            let topic = Uuid::new_v4();
            let claimed = claim(&store, &s, one, (topic, 0), 0, (0, 0))
                .await
                .unwrap()
                .unwrap();
            parts.push(part(topic, 0, 1, 0, claimed.revision));
        }
        // One partition was claimed by another leader meanwhile.
        let two = register(&store, 2).await;
        claim(&store, &s, two, (parts[70].range.topic_id, 0), 1, (0, 0))
            .await
            .unwrap()
            .unwrap();
        let decided = commit(&store, &s, one, ("o", "1"), &parts)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(decided.len(), 150);
        assert_eq!(decided[70], PartOutcome::Fenced);
        let committed = decided
            .iter()
            .filter(|d| matches!(d, PartOutcome::Committed(_)))
            .count();
        assert_eq!(committed, 149);
        let indexes = store.range("/k.wal/1/").await.unwrap();
        assert_eq!(indexes.kvs.len(), 3);
    }

    fn segment(base: i64, next: i64) -> RemoteSegment {
        RemoteSegment {
            version: 1,
            base_offset: base,
            next_offset: next,
            size_bytes: 1,
            max_timestamp_ms: -1,
            offset_of_max_timestamp: -1,
            object: format!("s{base}"),
            aborted: Vec::new(),
        }
    }

    fn range(base: i64, end: i64) -> (String, WalRange) {
        let mut p = part(Uuid::nil(), base, end, 0, 0);
        p.range.position = base as u64;
        (format!("w{base}"), p.range)
    }

    #[test]
    fn sources_take_segments_then_the_wal_past_them() {
        let segments = vec![segment(10, 20), segment(0, 10), segment(20, 35)];
        let ranges = vec![range(30, 40), range(0, 30), range(40, 41)];
        let got = sources(0, 41, segments, ranges).unwrap();
        assert_eq!(got.log_start, 0);
        assert_eq!(got.wal_from, 35);
        let bases: Vec<i64> = got.segments.iter().map(|s| s.base_offset).collect();
        assert_eq!(bases, [0, 10, 20]);
        let wal: Vec<i64> = got.wal.iter().map(|(_, r)| r.base_offset).collect();
        assert_eq!(wal, [30, 40]);
        // Segments past a gap are not used; the WAL covers from the gap.
        let got = sources(
            0,
            41,
            vec![segment(0, 10), segment(20, 35)],
            vec![range(0, 30), range(30, 41)],
        )
        .unwrap();
        assert_eq!((got.segments.len(), got.wal_from), (1, 10));
        // Retention passed the first segment; DeleteRecords is inside the next.
        let got = sources(12, 41, vec![segment(0, 10), segment(10, 20)], vec![range(15, 41)]).unwrap();
        assert_eq!((got.log_start, got.wal_from), (12, 20));
        // Nothing at all: an empty log at its start.
        let got = sources(7, 7, vec![], vec![]).unwrap();
        assert_eq!((got.log_start, got.wal_from, got.wal.len()), (7, 7, 0));
    }

    #[test]
    fn sources_refuse_records_the_object_store_lacks() {
        // A gap in the WAL.
        assert!(sources(0, 40, vec![], vec![range(0, 10), range(20, 40)]).is_err());
        // The WAL ends short of the commit.
        assert!(sources(0, 40, vec![segment(0, 10)], vec![range(10, 30)]).is_err());
        // A directory's records from before it joined are not copied yet.
        let why = sources(0, 40, vec![], vec![range(25, 40)]).unwrap_err();
        assert!(why.contains("0..25"), "{why}");
        // Nor are those below the first segment copied.
        let why = sources(0, 40, vec![segment(10, 25)], vec![range(25, 40)]).unwrap_err();
        assert!(why.contains("0..10"), "{why}");
        // Segments end where the WAL starts: nothing is missing.
        assert!(sources(0, 40, vec![segment(0, 25)], vec![range(25, 40)]).is_ok());
    }

    #[tokio::test]
    async fn segments_are_published_and_forgotten_by_the_claiming_leader_only() {
        let (store, s) = (LocalStore::new(), settings());
        let (topic, one, claimed) = claimed_by_one(&store, &s).await;
        let seg = segment(0, 10);
        assert_eq!(
            publish_segment(&store, &s, one, (topic, 0), claimed.revision, &seg)
                .await
                .unwrap(),
            Published::Recorded
        );
        let two = register(&store, 2).await;
        let taken = claim(&store, &s, two, (topic, 0), 1, (0, 0))
            .await
            .unwrap()
            .unwrap();
        // Broker 1 is deposed: it may neither record nor forget a copy.
        assert_eq!(
            publish_segment(&store, &s, one, (topic, 0), claimed.revision, &segment(10, 20))
                .await
                .unwrap(),
            Published::Fenced
        );
        let forget = |who, revision, seg| forget_segment(&store, &s, who, (topic, 0), revision, seg);
        assert_eq!(
            forget(one, claimed.revision, (0, "s0", 10)).await.unwrap(),
            Forget::Fenced
        );
        let listed = store.range(&segments_prefix(&s, topic, 0)).await.unwrap();
        assert_eq!(listed.kvs.len(), 1);
        // Broker 2 forgets it (another object's name forgets nothing).
        assert_eq!(
            forget(two, taken.revision, (0, "other", 10)).await.unwrap(),
            Forget::Gone
        );
        assert_eq!(
            store
                .range(&segments_prefix(&s, topic, 0))
                .await
                .unwrap()
                .kvs
                .len(),
            1
        );
        // Not while its records are at or past the log start.
        assert_eq!(
            forget(two, taken.revision, (0, "s0", 9)).await.unwrap(),
            Forget::Needed
        );
        assert_eq!(
            forget(two, taken.revision, (0, "s0", 10)).await.unwrap(),
            Forget::Gone
        );
        assert!(store
            .range(&segments_prefix(&s, topic, 0))
            .await
            .unwrap()
            .kvs
            .is_empty());
    }

    #[tokio::test]
    async fn a_cleaned_copy_replaces_the_recorded_copies_it_covers() {
        let (store, s) = (LocalStore::new(), settings());
        let (topic, one, claimed) = claimed_by_one(&store, &s).await;
        macro_rules! publish {
            ($seg:expr) => {
                publish_segment(&store, &s, one, (topic, 0), claimed.revision, &$seg)
                    .await
                    .unwrap()
            };
        }
        for (base, next) in [(0, 10), (10, 20), (20, 30), (30, 40)] {
            assert_eq!(publish!(segment(base, next)), Published::Recorded);
        }
        let recorded = || async {
            let listed = store.range(&segments_prefix(&s, topic, 0)).await.unwrap();
            listed
                .kvs
                .iter()
                .map(|kv| {
                    let seg: RemoteSegment = serde_json::from_slice(&kv.value).unwrap();
                    (seg.base_offset, seg.next_offset, seg.object)
                })
                .collect::<Vec<_>>()
        };
        // The cleaner wrote 0..10, 10..20 and 20..30 again as one segment.
        let cleaned = RemoteSegment {
            object: "cleaned".into(),
            ..segment(0, 30)
        };
        assert_eq!(publish!(cleaned), Published::Recorded);
        assert_eq!(
            recorded().await,
            [(0, 30, "cleaned".to_string()), (30, 40, "s30".to_string())]
        );
        // Its answer was lost and it is offered again: nothing changes.
        assert_eq!(publish!(cleaned), Published::Recorded);
        // The replaced copies are recorded nowhere: the mover may delete them.
        for (base, object) in [(0, "s0"), (10, "s10"), (20, "s20")] {
            let forgotten = forget_segment(&store, &s, one, (topic, 0), claimed.revision, (base, object, 0));
            assert_eq!(forgotten.await.unwrap(), Forget::Gone);
        }
        // A copy shorter than the recorded one at its base, or one a
        // recorded copy reaches past from inside it, would leave a gap.
        assert_eq!(publish!(segment(0, 10)), Published::Superseded);
        assert_eq!(publish!(segment(20, 35)), Published::Superseded);
        // So would one overlapping a recorded copy from below.
        assert_eq!(publish!(segment(35, 50)), Published::Superseded);
        assert_eq!(
            recorded().await,
            [(0, 30, "cleaned".to_string()), (30, 40, "s30".to_string())]
        );
        // A cleaned group of more copies than a transaction can delete
        // records: 130 one-offset copies from 40, then one copy of them all.
        for base in 40..170 {
            assert_eq!(publish!(segment(base, base + 1)), Published::Recorded);
        }
        let merged = RemoteSegment {
            object: "merged".into(),
            ..segment(40, 170)
        };
        assert_eq!(publish!(merged), Published::Recorded);
        assert_eq!(
            recorded().await,
            [
                (0, 30, "cleaned".to_string()),
                (30, 40, "s30".to_string()),
                (40, 170, "merged".to_string())
            ]
        );
        // A leader that stopped between the transactions: the records
        // left are covered, and the next call for the copy deletes them.
        for base in [41, 99] {
            let put = Op::Put {
                key: segment_key(&s, topic, 0, base),
                value: serde_json::to_vec(&segment(base, base + 1)).unwrap(),
                lease: None,
            };
            store.txn(Vec::new(), vec![put]).await.unwrap().unwrap();
        }
        let partition = (topic, 0);
        let sources = |recorded: Vec<RemoteSegment>| sources(0, 170, recorded, Vec::new());
        let listed = store
            .range(&segments_prefix(&s, partition.0, partition.1))
            .await
            .unwrap();
        let all: Vec<RemoteSegment> = listed
            .kvs
            .iter()
            .map(|kv| serde_json::from_slice(&kv.value).unwrap())
            .collect();
        assert_eq!(sources(all).unwrap().segments.len(), 3);
        assert_eq!(publish!(merged), Published::Recorded);
        assert_eq!(recorded().await.len(), 3);
    }

    #[tokio::test]
    async fn a_seeded_partition_keeps_its_directorys_broker_as_writer() {
        let (store, s) = (LocalStore::new(), settings());
        let topic = Uuid::new_v4();
        let one = register(&store, 1).await;
        seed(&store, &s, one, (topic, 0), (3, 50)).await.unwrap();
        let two = register(&store, 2).await;
        let taken = claim(&store, &s, two, (topic, 0), 1, (0, 0))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((taken.end_offset, taken.log_start, taken.writer), (50, 3, 1));
        // Seeding again changes nothing.
        seed(&store, &s, one, (topic, 0), (0, 0)).await.unwrap();
        let kv = store.get(&log_key(&s, topic, 0)).await.unwrap().unwrap();
        assert_eq!(decode(&kv).unwrap().leader, 2);
    }

    async fn put(store: &LocalStore, key: String, value: Vec<u8>) -> i64 {
        let op = Op::Put {
            key,
            value,
            lease: None,
        };
        store.txn(vec![], vec![op]).await.unwrap().unwrap()
    }

    async fn index(store: &LocalStore, s: &Settings, name: &str, parts: usize, ranges: Vec<WalRange>) {
        for part in 0..parts.max(1) {
            let index = WalIndex {
                version: 1,
                object: name.into(),
                ranges: ranges.clone(),
                parts,
            };
            put(
                store,
                wal_key(s, 1, name, part),
                serde_json::to_vec(&index).unwrap(),
            )
            .await;
        }
    }

    fn on(topic: Uuid, base: i64, end: i64) -> WalRange {
        let mut r = part(topic, base, end, 0, 0).range;
        r.length = (end - base) as u64;
        r
    }

    #[tokio::test]
    async fn the_named_wal_objects_are_unknown_while_a_key_does_not_read() {
        let (store, s) = (LocalStore::new(), settings());
        index(&store, &s, "w1", 2, vec![on(Uuid::new_v4(), 0, 5)]).await;
        index(&store, &s, "w2", 1, vec![]).await;
        let named = wal_objects(&store, &s).await.unwrap().unwrap();
        assert_eq!(named.into_iter().collect::<Vec<_>>(), ["w1", "w2"]);
        put(&store, wal_key(&s, 2, "w3", 0), b"{\"version\": 9}".to_vec()).await;
        assert_eq!(wal_objects(&store, &s).await.unwrap(), None);
    }

    #[tokio::test]
    async fn garbage_is_the_wal_below_sealed_segments_and_what_deleted_topics_left() {
        let (store, s) = (LocalStore::new(), settings());
        let (kept, gone) = (Uuid::new_v4(), Uuid::new_v4());
        let one = register(&store, 1).await;
        let claimed = claim(&store, &s, one, (kept, 0), 0, (0, 0))
            .await
            .unwrap()
            .unwrap();
        publish_segment(&store, &s, one, (kept, 0), claimed.revision, &segment(0, 10))
            .await
            .unwrap();
        claim(&store, &s, one, (gone, 0), 0, (0, 0))
            .await
            .unwrap()
            .unwrap();
        let gone_segment = RemoteSegment {
            object: "g0".into(),
            ..segment(0, 4)
        };
        let gone_key = segment_key(&s, gone, 0, 0);
        put(
            &store,
            gone_key.clone(),
            serde_json::to_vec(&gone_segment).unwrap(),
        )
        .await;
        index(&store, &s, "covered", 1, vec![on(kept, 0, 10)]).await;
        index(&store, &s, "live", 1, vec![on(kept, 10, 20)]).await;
        index(&store, &s, "mixed", 1, vec![on(kept, 5, 10), on(gone, 0, 6)]).await;
        // Part 1 of 2 only: the other part may still be committing.
        index(&store, &s, "partial", 0, vec![on(kept, 0, 3)]).await;
        let key = wal_key(&s, 1, "partial", 0);
        let half = WalIndex {
            version: 1,
            object: "partial".into(),
            ranges: vec![on(kept, 0, 3)],
            parts: 2,
        };
        put(&store, key, serde_json::to_vec(&half).unwrap()).await;

        let removed: std::collections::HashSet<Uuid> = [gone].into();
        let g = garbage(&store, &s, &removed, &Default::default()).await.unwrap();
        let objects: Vec<(&str, u64)> = g.wal.iter().map(|(o, b, _)| (o.as_str(), *b)).collect();
        assert_eq!(objects, [("covered", 10), ("mixed", 11)]);
        // Written long ago, the part never committed never will be; an
        // old object holding records past the segments still stays.
        let settled = ["partial".to_string(), "live".to_string()].into();
        let g = garbage(&store, &s, &removed, &settled).await.unwrap();
        let objects: Vec<&str> = g.wal.iter().map(|(o, ..)| o.as_str()).collect();
        assert_eq!(objects, ["covered", "mixed", "partial"]);
        // Not while an index key does not read: it may be the other part.
        let other = wal_key(&s, 2, "future", 0);
        put(&store, other.clone(), b"{\"version\": 9}".to_vec()).await;
        let g = garbage(&store, &s, &removed, &settled).await.unwrap();
        let objects: Vec<&str> = g.wal.iter().map(|(o, ..)| o.as_str()).collect();
        assert_eq!(objects, ["covered", "mixed"]);
        delete_keys(&store, &[other]).await.unwrap();
        assert_eq!(g.segments, vec![(gone_segment, gone_key)]);
        assert_eq!(g.commits, vec![log_key(&s, gone, 0), claim_key(&s, gone, 0)]);
        // A topic not seen deleted is not taken for deleted.
        let g = garbage(&store, &s, &Default::default(), &Default::default())
            .await
            .unwrap();
        assert!(g.segments.is_empty() && g.commits.is_empty());
        assert_eq!(
            g.wal.iter().map(|(o, ..)| o.as_str()).collect::<Vec<_>>(),
            ["covered"]
        );
        // Deleting the keys leaves the live ones.
        delete_keys(&store, &g.wal[0].2).await.unwrap();
        assert_eq!(store.range("/k.wal/").await.unwrap().kvs.len(), 3);
    }

    #[test]
    fn keys_name_their_partitions() {
        let s = settings();
        let id = Uuid::new_v4();
        assert_eq!(partition_of(&log_key(&s, id, 7)), Some((id, 7)));
        assert_eq!(partition_of(&segment_key(&s, id, 3, 120)), Some((id, 3)));
    }
}
