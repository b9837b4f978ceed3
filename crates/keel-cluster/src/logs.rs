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
//! <prefix>.logs/<topic id>/<partition>   the partition's commit: leader, leader epoch, end offset
//! <prefix>.wal/<node.id>/<object seq>    a committed WAL object's index
//! ```
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
/// `None` if a newer epoch holds it, this session has ended, or the
/// committed log ends past `local_end`, where the claiming broker's log
/// ends (it does not hold every committed record, so it must not fence
/// the leader that does). A partition never committed before (a topic a
/// directory brought into the cluster) starts committed at `local_end`.
pub async fn claim(
    store: &dyn CoordStore,
    settings: &Settings,
    session: Session,
    (topic_id, partition): (Uuid, i32),
    leader_epoch: i32,
    local_end: i64,
) -> Result<Option<Claimed>, StoreError> {
    let key = log_key(settings, topic_id, partition);
    loop {
        let current = store.get(&key).await?;
        let commit = current.as_ref().map(|kv| (decode(kv), kv.mod_revision));
        let end_offset = match &commit {
            None => local_end,
            Some((None, _)) => {
                return Err(StoreError::Refused(format!(
                    "{key} does not hold a commit Keel can read"
                )))
            }
            Some((Some(c), _)) if c.leader_epoch > leader_epoch || c.end_offset > local_end => {
                return Ok(None)
            }
            Some((Some(c), _)) => c.end_offset,
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
        };
        let put = Op::Put {
            key: key.clone(),
            value: serde_json::to_vec(&value).expect("a commit serializes"),
            lease: None,
        };
        if let Some(revision) = store
            .txn(vec![registration(settings, session), when], vec![put])
            .await?
        {
            return Ok(Some(Claimed { end_offset, revision }));
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
    for (n, chunk) in parts.chunks(PARTS_PER_TXN).enumerate() {
        match commit_chunk(store, settings, session, (object, id, n), chunk).await? {
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
    (object, id, part): (&str, &str, usize),
    chunk: &[CommitPart],
) -> Result<Option<Vec<PartOutcome>>, StoreError> {
    let index_key = wal_key(settings, session.node_id, id, part);
    let mut live: Vec<usize> = (0..chunk.len()).collect();
    let mut outcomes = vec![PartOutcome::Fenced; chunk.len()];
    while !live.is_empty() {
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
    Ok(Some(outcomes))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::LocalStore;
    use std::time::Duration;

    fn settings() -> Settings {
        Settings {
            prefix: "/k".into(),
            session_timeout: Duration::from_secs(6),
        }
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
        }
    }

    #[tokio::test]
    async fn a_newer_leader_fences_the_old_ones_commits() {
        let (store, s) = (LocalStore::new(), settings());
        let topic = Uuid::new_v4();
        let one = register(&store, 1).await;
        let claimed = claim(&store, &s, one, (topic, 0), 0, 0).await.unwrap().unwrap();
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
        // A broker whose log ends short of the commit may not take it.
        assert_eq!(claim(&store, &s, two, (topic, 0), 1, 4).await.unwrap(), None);
        let taken = claim(&store, &s, two, (topic, 0), 1, 5).await.unwrap().unwrap();
        assert_eq!(taken.end_offset, 5);
        // Broker 1's next commit is refused; an older epoch cannot claim.
        let stale = commit(&store, &s, one, ("o2", "2"), &[part(topic, 5, 9, 0, rev)])
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stale, vec![PartOutcome::Fenced]);
        assert_eq!(claim(&store, &s, one, (topic, 0), 0, 0).await.unwrap(), None);
        let kv = store.get(&log_key(&s, topic, 0)).await.unwrap().unwrap();
        assert_eq!(decode(&kv).unwrap().end_offset, 5);
    }

    #[tokio::test]
    async fn an_ended_session_commits_nothing_and_a_landed_commit_is_recognised() {
        let (store, s) = (LocalStore::new(), settings());
        let topic = Uuid::new_v4();
        let one = register(&store, 1).await;
        let claimed = claim(&store, &s, one, (topic, 0), 3, 0).await.unwrap().unwrap();
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
        assert_eq!(claim(&store, &s, one, (topic, 0), 4, 0).await.unwrap(), None);
    }

    #[tokio::test]
    async fn many_partitions_commit_in_several_transactions() {
        let (store, s) = (LocalStore::new(), settings());
        let one = register(&store, 1).await;
        let mut parts = Vec::new();
        for _ in 0..150 {
            let topic = Uuid::new_v4();
            let claimed = claim(&store, &s, one, (topic, 0), 0, 0).await.unwrap().unwrap();
            parts.push(part(topic, 0, 1, 0, claimed.revision));
        }
        // One partition was claimed by another leader meanwhile.
        let two = register(&store, 2).await;
        claim(&store, &s, two, (parts[70].range.topic_id, 0), 1, 0)
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
}
