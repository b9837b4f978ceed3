//! The cluster's topics and who leads their partitions, in the
//! coordination store: one key per topic, `<prefix>/topics/<name>`, holding
//! its id, configs and, per partition, the leader, its leader epoch and the
//! brokers holding the partition's records (JSON, see docs/cluster.md).
//!
//! Any broker creates, grows, reconfigures or deletes a topic with a
//! compare-and-swap on that key; the controller alone changes leaders, with
//! a compare on its own election too, so a deposed controller's decision
//! never lands. What a change decides is computed here without I/O:
//! [`place`] puts new partitions on the least loaded live brokers,
//! [`elect`] is the controller's rule for one topic, and [`balance`] its
//! periodic spreading of leaders over the live brokers.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::membership::Settings;
use crate::store::{Compare, CoordStore, Op, StoreError};

/// The leader of a partition that has none.
pub const NO_LEADER: i32 = -1;

/// One partition's leadership.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    /// The leading broker, [`NO_LEADER`] while none does.
    pub leader: i32,
    /// Rises with every change of leader (KIP-320).
    pub leader_epoch: i32,
    /// The brokers holding the partition's records: only these may lead it.
    pub replicas: Vec<i32>,
}

/// A topic as the cluster knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterTopic {
    pub version: u32,
    pub name: String,
    pub topic_id: Uuid,
    pub configs: BTreeMap<String, String>,
    pub partitions: Vec<PartitionState>,
}

impl ClusterTopic {
    pub fn partition_count(&self) -> i32 {
        i32::try_from(self.partitions.len()).unwrap_or(i32::MAX)
    }
}

/// A topic with the store's revision of its key (what a compare-and-swap
/// of it names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTopic {
    pub topic: ClusterTopic,
    pub revision: i64,
}

/// The store key of the topic `name`.
pub fn topic_key(settings: &Settings, name: &str) -> String {
    settings.key(&format!("topics/{name}"))
}

/// The topic name a key under `<prefix>/topics/` names.
pub(crate) fn name_of<'a>(settings: &Settings, key: &'a str) -> Option<&'a str> {
    key.strip_prefix(&settings.key("topics/"))
}

/// Leaders for `count` new partitions: each on the live broker leading the
/// fewest partitions so far (`load`, counted over every topic), the lowest
/// node id among equals. Empty if no broker is live.
pub fn place(count: usize, live: &BTreeSet<i32>, load: &BTreeMap<i32, usize>) -> Vec<PartitionState> {
    let mut load: BTreeMap<i32, usize> = live
        .iter()
        .map(|n| (*n, load.get(n).copied().unwrap_or(0)))
        .collect();
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let Some((&node, _)) = load.iter().min_by_key(|(node, led)| (**led, **node)) else {
            return Vec::new();
        };
        *load.entry(node).or_default() += 1;
        out.push(PartitionState {
            leader: node,
            leader_epoch: 0,
            replicas: vec![node],
        });
    }
    out
}

/// Kafka's internal topics whose partitions place the group coordinators
/// (`__consumer_offsets`) and the transaction coordinators
/// (`__transaction_state`). In a cluster they are kept with the other
/// topics and led like them. `__consumer_offsets` holds the groups'
/// records and `__transaction_state` the transactional ids' states, so a
/// group or a transaction fails over with its partition.
pub const GROUPS_TOPIC: &str = "__consumer_offsets";
pub const TRANSACTIONS_TOPIC: &str = "__transaction_state";

/// Whether `name` is one of the coordinators' internal topics.
pub fn is_internal(name: &str) -> bool {
    name == GROUPS_TOPIC || name == TRANSACTIONS_TOPIC
}

/// How many partitions each broker leads or would lead (its first
/// replica), over `topics`.
pub fn load<'a>(topics: impl IntoIterator<Item = &'a ClusterTopic>) -> BTreeMap<i32, usize> {
    let mut load = BTreeMap::new();
    for t in topics {
        for p in &t.partitions {
            if let Some(first) = p.replicas.first() {
                *load.entry(*first).or_default() += 1;
            }
        }
    }
    load
}

/// The controller's rule for one topic, given the live brokers and how
/// many partitions each leads (`load`, kept up to date as leaders move):
/// a partition whose leader is not live is led by its first live replica,
/// else by the live broker leading the fewest partitions, which becomes
/// its replica (any broker can rebuild a partition's log from the object
/// store). Each change is a new leader epoch. With no broker live, it has
/// no leader until one is. `None` if nothing changes.
pub fn elect(
    topic: &ClusterTopic,
    live: &BTreeSet<i32>,
    load: &mut BTreeMap<i32, usize>,
) -> Option<ClusterTopic> {
    let mut changed = topic.clone();
    let mut any = false;
    for p in &mut changed.partitions {
        if p.leader != NO_LEADER && live.contains(&p.leader) {
            continue;
        }
        let least_loaded = || {
            live.iter()
                .min_by_key(|n| (load.get(n).copied().unwrap_or(0), **n))
                .copied()
        };
        let next = match p.replicas.iter().find(|r| live.contains(r)) {
            Some(r) => *r,
            None => least_loaded().unwrap_or(NO_LEADER),
        };
        if next == p.leader {
            continue;
        }
        if next != NO_LEADER && !p.replicas.contains(&next) {
            for r in &p.replicas {
                if let Some(n) = load.get_mut(r) {
                    *n = n.saturating_sub(1);
                }
            }
            p.replicas = vec![next];
            *load.entry(next).or_default() += 1;
        }
        p.leader = next;
        p.leader_epoch = p.leader_epoch.saturating_add(1);
        any = true;
    }
    any.then_some(changed)
}

/// The controller's leader balance (Kafka's `auto.leader.rebalance.enable`),
/// over partitions that each have one replica, so that a broker that
/// joins or comes back takes its share of leaders: first each topic's
/// partitions, then all of them, are spread over the live brokers until
/// no broker leads two more than another, each move going from the
/// broker leading the most to the one leading the fewest (of the topic,
/// then in all; ties to the most and least loaded in all, then the lower
/// id). A move in the second round takes a partition of a topic the first
/// broker leads more of than the second, so that no topic loses its
/// spread. Partitions in `pinned` (their records are not all in the
/// object store: no other broker could rebuild them) and partitions led
/// by no live broker stay. A moved partition's replica becomes its new
/// leader, in a new leader epoch. The changed topics, in `topics`' order.
pub fn balance(
    topics: &[ClusterTopic],
    live: &BTreeSet<i32>,
    pinned: &BTreeSet<(Uuid, i32)>,
) -> Vec<ClusterTopic> {
    if live.len() < 2 {
        return Vec::new();
    }
    let mut next: Vec<ClusterTopic> = topics.to_vec();
    // Partitions each live broker leads, in all and per topic.
    let mut total: BTreeMap<i32, usize> = live.iter().map(|n| (*n, 0)).collect();
    let mut per_topic: Vec<BTreeMap<i32, usize>> = Vec::with_capacity(next.len());
    for t in &next {
        let mut counts: BTreeMap<i32, usize> = live.iter().map(|n| (*n, 0)).collect();
        for p in &t.partitions {
            if let Some(n) = counts.get_mut(&p.leader) {
                *n += 1;
                *total.get_mut(&p.leader).expect("live") += 1;
            }
        }
        per_topic.push(counts);
    }
    let movable = |t: &ClusterTopic, i: usize, from: i32| {
        t.partitions[i].leader == from
            && !pinned.contains(&(t.topic_id, i32::try_from(i).unwrap_or(i32::MAX)))
    };
    let mut changed = vec![false; next.len()];
    let mut move_one = |next: &mut [ClusterTopic],
                        per_topic: &mut [BTreeMap<i32, usize>],
                        total: &mut BTreeMap<i32, usize>,
                        (t, i): (usize, usize),
                        (from, to): (i32, i32)| {
        let p = &mut next[t].partitions[i];
        p.leader = to;
        p.leader_epoch = p.leader_epoch.saturating_add(1);
        p.replicas = vec![to];
        for counts in [&mut per_topic[t], total] {
            *counts.get_mut(&from).expect("live") -= 1;
            *counts.get_mut(&to).expect("live") += 1;
        }
        changed[t] = true;
    };
    // Each topic.
    for t in 0..next.len() {
        loop {
            let counts = &per_topic[t];
            let by = |n: &i32| (counts[n], total[n]);
            let from = *live
                .iter()
                .max_by_key(|n| (by(n), std::cmp::Reverse(**n)))
                .expect("live");
            let to = *live.iter().min_by_key(|n| (by(n), **n)).expect("live");
            if counts[&from] < counts[&to] + 2 {
                break;
            }
            let Some(i) = (0..next[t].partitions.len()).find(|i| movable(&next[t], *i, from)) else {
                break;
            };
            move_one(&mut next, &mut per_topic, &mut total, (t, i), (from, to));
        }
    }
    // All of them.
    loop {
        let from = *live
            .iter()
            .max_by_key(|n| (total[*n], std::cmp::Reverse(**n)))
            .expect("live");
        let to = *live.iter().min_by_key(|n| (total[*n], **n)).expect("live");
        if total[&from] < total[&to] + 2 {
            break;
        }
        // A partition of the topic `from` leads most more of than `to`.
        let mut skewed: Vec<usize> = (0..next.len())
            .filter(|t| per_topic[*t][&from] > per_topic[*t][&to])
            .collect();
        skewed.sort_by_key(|t| (std::cmp::Reverse(per_topic[*t][&from] - per_topic[*t][&to]), *t));
        let choice = skewed.into_iter().find_map(|t| {
            (0..next[t].partitions.len())
                .find(|i| movable(&next[t], *i, from))
                .map(|i| (t, i))
        });
        let Some(at) = choice else {
            break;
        };
        move_one(&mut next, &mut per_topic, &mut total, at, (from, to));
    }
    next.into_iter()
        .zip(changed)
        .filter_map(|(t, c)| c.then_some(t))
        .collect()
}

/// Creates `topic` unless a topic of its name exists. The store's revision
/// of the change, `None` if the name is taken.
pub async fn create(
    store: &dyn CoordStore,
    settings: &Settings,
    topic: &ClusterTopic,
) -> Result<Option<i64>, StoreError> {
    let key = topic_key(settings, &topic.name);
    store
        .txn(vec![Compare::Absent(key.clone())], vec![put(key, topic)])
        .await
}

/// Replaces a topic last changed at `revision` with `topic`, if it has not
/// changed since and every compare in `also` holds. The change's revision,
/// `None` if a compare failed.
pub async fn replace(
    store: &dyn CoordStore,
    settings: &Settings,
    topic: &ClusterTopic,
    revision: i64,
    also: Vec<Compare>,
) -> Result<Option<i64>, StoreError> {
    let key = topic_key(settings, &topic.name);
    let mut when = vec![Compare::ModRevision(key.clone(), revision)];
    when.extend(also);
    store.txn(when, vec![put(key, topic)]).await
}

/// Deletes the topic `name` last changed at `revision`, if it has not
/// changed since. The change's revision, `None` if it had.
pub async fn delete(
    store: &dyn CoordStore,
    settings: &Settings,
    name: &str,
    revision: i64,
) -> Result<Option<i64>, StoreError> {
    let key = topic_key(settings, name);
    store
        .txn(
            vec![Compare::ModRevision(key.clone(), revision)],
            vec![Op::Delete(key)],
        )
        .await
}

fn put(key: String, topic: &ClusterTopic) -> Op {
    Op::Put {
        key,
        value: serde_json::to_vec(topic).expect("a topic serializes"),
        lease: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(parts: &[(i32, i32, &[i32])]) -> ClusterTopic {
        ClusterTopic {
            version: 1,
            name: "t".into(),
            topic_id: Uuid::new_v4(),
            configs: BTreeMap::new(),
            partitions: parts
                .iter()
                .map(|(leader, epoch, replicas)| PartitionState {
                    leader: *leader,
                    leader_epoch: *epoch,
                    replicas: replicas.to_vec(),
                })
                .collect(),
        }
    }

    #[test]
    fn new_partitions_go_to_the_least_loaded_live_brokers() {
        let live: BTreeSet<i32> = [1, 2, 3].into();
        let leaders = |p: Vec<PartitionState>| p.iter().map(|p| p.leader).collect::<Vec<_>>();
        assert_eq!(leaders(place(4, &live, &BTreeMap::new())), [1, 2, 3, 1]);
        // Broker 1 already leads two, broker 4 (not live) is never chosen.
        let load = BTreeMap::from([(1, 2), (2, 1), (4, 0)]);
        assert_eq!(leaders(place(3, &live, &load)), [3, 2, 3]);
        assert!(place(2, &BTreeSet::new(), &BTreeMap::new()).is_empty());
        let placed = place(1, &live, &BTreeMap::new());
        assert_eq!(placed[0].replicas, [1]);
        assert_eq!(placed[0].leader_epoch, 0);
    }

    #[test]
    fn the_load_counts_first_replicas_whatever_leads_now() {
        let t = topic(&[(1, 0, &[1]), (NO_LEADER, 3, &[2]), (2, 0, &[2])]);
        assert_eq!(load([&t]), BTreeMap::from([(1, 1), (2, 2)]));
    }

    #[test]
    fn a_dead_leaders_partitions_go_to_the_least_loaded_live_brokers() {
        let t = topic(&[(1, 0, &[1]), (2, 4, &[2]), (1, 2, &[1])]);
        let all: BTreeSet<i32> = [1, 2, 3].into();
        let mut led = load([&t]);
        assert_eq!(elect(&t, &all, &mut led), None);
        let without_1: BTreeSet<i32> = [2, 3].into();
        let moved = elect(&t, &without_1, &mut led).expect("broker 1's partitions move");
        // Broker 3 leads nothing, broker 2 one: 3 takes the first, then 2
        // and 3 are even and the lower id takes the second.
        assert_eq!(
            (moved.partitions[0].leader, moved.partitions[0].leader_epoch),
            (3, 1)
        );
        assert_eq!(moved.partitions[0].replicas, [3]);
        assert_eq!(
            (moved.partitions[2].leader, moved.partitions[2].leader_epoch),
            (2, 3)
        );
        assert_eq!(moved.partitions[1], t.partitions[1]);
        assert_eq!(led, BTreeMap::from([(1, 0), (2, 2), (3, 1)]));
        // Broker 1 coming back changes nothing: its partitions moved.
        assert_eq!(elect(&moved, &all, &mut led), None);
        // With no broker live a partition has no leader, until one is.
        let none = elect(&moved, &BTreeSet::new(), &mut led).unwrap();
        assert!(none.partitions.iter().all(|p| p.leader == NO_LEADER));
        let back = elect(&none, &[2].into(), &mut led).unwrap();
        assert_eq!(
            (back.partitions[1].leader, back.partitions[1].leader_epoch),
            (2, 6)
        );
    }

    #[test]
    fn the_coordinators_partitions_fail_over() {
        for name in [GROUPS_TOPIC, TRANSACTIONS_TOPIC] {
            let mut t = topic(&[(1, 0, &[1])]);
            t.name = name.into();
            let mut led = load([&t]);
            let moved = elect(&t, &[2].into(), &mut led).expect("its leader is gone");
            assert_eq!(
                (moved.partitions[0].leader, moved.partitions[0].leader_epoch),
                (2, 1),
                "{name}"
            );
        }
    }

    /// Leaders of `topics`' partitions after `changed` replaced some.
    fn leaders_after(topics: &[ClusterTopic], changed: &[ClusterTopic]) -> Vec<Vec<i32>> {
        topics
            .iter()
            .map(|t| {
                let t = changed.iter().find(|c| c.topic_id == t.topic_id).unwrap_or(t);
                t.partitions.iter().map(|p| p.leader).collect()
            })
            .collect()
    }

    fn led_by(leaders: &[Vec<i32>], node: i32) -> usize {
        leaders.iter().flatten().filter(|l| **l == node).count()
    }

    #[test]
    fn a_broker_back_takes_its_share_of_every_topic() {
        let live: BTreeSet<i32> = [1, 2, 3].into();
        // Broker 3 came back after its partitions went to 1 and 2.
        let a = topic(&[
            (1, 1, &[1]),
            (2, 0, &[2]),
            (1, 2, &[1]),
            (2, 1, &[2]),
            (1, 0, &[1]),
            (2, 3, &[2]),
        ]);
        let b = topic(&[(1, 0, &[1]), (1, 4, &[1]), (2, 0, &[2])]);
        let topics = [a, b];
        let changed = balance(&topics, &live, &BTreeSet::new());
        let leaders = leaders_after(&topics, &changed);
        for (t, l) in topics.iter().zip(&leaders) {
            let counts: Vec<usize> = (1..=3).map(|n| l.iter().filter(|x| **x == n).count()).collect();
            assert!(
                counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1,
                "{} {l:?}",
                t.name
            );
        }
        assert_eq!([1, 2, 3].map(|n| led_by(&leaders, n)), [3, 3, 3]);
        // Each moved partition is in a new epoch, its replica its leader.
        for (before, after) in topics.iter().zip(&leaders) {
            let after_t = changed.iter().find(|c| c.topic_id == before.topic_id).unwrap();
            for (i, p) in before.partitions.iter().enumerate() {
                let q = &after_t.partitions[i];
                if p.leader == after[i] {
                    assert_eq!(p, q);
                } else {
                    assert_eq!(
                        (q.leader_epoch, q.replicas.clone()),
                        (p.leader_epoch + 1, vec![after[i]])
                    );
                }
            }
        }
        // Balanced: nothing more moves.
        let again: Vec<ClusterTopic> = topics
            .iter()
            .map(|t| {
                changed
                    .iter()
                    .find(|c| c.topic_id == t.topic_id)
                    .unwrap_or(t)
                    .clone()
            })
            .collect();
        assert!(balance(&again, &live, &BTreeSet::new()).is_empty());
    }

    #[test]
    fn single_partition_topics_spread_in_all() {
        let live: BTreeSet<i32> = [1, 2, 3].into();
        let topics: Vec<ClusterTopic> = (0..7).map(|_| topic(&[(1, 0, &[1])])).collect();
        let changed = balance(&topics, &live, &BTreeSet::new());
        let leaders = leaders_after(&topics, &changed);
        assert_eq!([1, 2, 3].map(|n| led_by(&leaders, n)), [3, 2, 2]);
    }

    #[test]
    fn pinned_partitions_and_partitions_of_dead_brokers_stay() {
        let live: BTreeSet<i32> = [1, 2].into();
        let t = topic(&[
            (1, 0, &[1]),
            (1, 0, &[1]),
            (1, 0, &[1]),
            (1, 0, &[1]),
            (3, 0, &[3]),
            (NO_LEADER, 2, &[]),
        ]);
        let pinned: BTreeSet<(Uuid, i32)> = [(t.topic_id, 0), (t.topic_id, 1)].into();
        let changed = balance(std::slice::from_ref(&t), &live, &pinned);
        let leaders = leaders_after(std::slice::from_ref(&t), &changed);
        assert_eq!(leaders, vec![vec![1, 1, 2, 2, 3, NO_LEADER]]);
        // Everything pinned: nothing moves; one live broker: nothing to do.
        let all: BTreeSet<(Uuid, i32)> = (0..6).map(|i| (t.topic_id, i)).collect();
        assert!(balance(std::slice::from_ref(&t), &live, &all).is_empty());
        assert!(balance(std::slice::from_ref(&t), &[1].into(), &BTreeSet::new()).is_empty());
    }

    #[test]
    fn topics_round_trip_through_json() {
        let t = topic(&[(3, 7, &[3])]);
        let json = serde_json::to_vec(&t).unwrap();
        let back: ClusterTopic = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, t);
        let settings = Settings {
            prefix: "/keel".into(),
            session_timeout: std::time::Duration::from_secs(6),
            leader_balance: None,
        };
        let key = topic_key(&settings, "orders");
        assert_eq!(key, "/keel/topics/orders");
        assert_eq!(name_of(&settings, &key), Some("orders"));
    }
}
