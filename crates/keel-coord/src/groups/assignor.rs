//! Kafka's server-side assignors for consumer groups (KIP-848), chosen
//! with `group.remote.assignor` on the client or the broker's
//! `group.consumer.assignors`: `uniform` spreads every subscribed partition
//! evenly and keeps each where it was when it can; `range` gives each
//! member a contiguous range of every topic it subscribes to. Pure
//! functions of the members' subscriptions and the last target.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use uuid::Uuid;

use super::consumer::{Assignment, Member, Topics};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignor {
    Uniform,
    Range,
}

impl Assignor {
    pub fn name(self) -> &'static str {
        match self {
            Assignor::Uniform => "uniform",
            Assignor::Range => "range",
        }
    }

    pub fn parse(name: &str) -> Option<Assignor> {
        match name {
            "uniform" => Some(Assignor::Uniform),
            "range" => Some(Assignor::Range),
            _ => None,
        }
    }

    /// Every member's target, from the topics each subscribes to and the
    /// last target (which `uniform` keeps where it can).
    pub fn assign(
        self,
        subscriptions: &BTreeMap<String, Topics>,
        previous: &BTreeMap<String, Assignment>,
    ) -> BTreeMap<String, Assignment> {
        match self {
            Assignor::Uniform => uniform(subscriptions, previous),
            Assignor::Range => range(subscriptions),
        }
    }
}

/// The existing topics a member subscribes to: by name, and those whose
/// whole name its pattern matches (internal `__` topics excepted, as in
/// Kafka). A pattern that does not compile matches nothing.
pub fn member_topics(m: &Member, topics: &Topics) -> Topics {
    let mut out: Topics = m
        .subscribed_names
        .iter()
        .filter_map(|name| topics.get(name).map(|info| (name.clone(), *info)))
        .collect();
    if let Some(re) = &m.subscribed_pattern {
        for (name, info) in topics {
            if !name.starts_with("__") && re.is_match(name) {
                out.insert(name.clone(), *info);
            }
        }
    }
    out
}

/// Partitions of `topics` by (topic name, partition), with the topic id.
fn partitions_of(topics: &Topics) -> Vec<(String, Uuid, i32)> {
    topics
        .iter()
        .flat_map(|(name, info)| (0..info.partitions.max(0)).map(move |p| (name.clone(), info.id, p)))
        .collect()
}

fn give(target: &mut BTreeMap<String, Assignment>, member: &str, topic: Uuid, partition: i32) {
    target
        .entry(member.to_string())
        .or_default()
        .entry(topic)
        .or_default()
        .insert(partition);
}

fn count(a: Option<&Assignment>) -> usize {
    a.map_or(0, |a| a.values().map(BTreeSet::len).sum())
}

/// Balanced and sticky: each member keeps what it had, up to its share
/// (`total / members`, one more for `total % members` of them, given first
/// to those that had most); the rest goes, partition by partition (those
/// fewest members subscribe to first), to the subscribed member holding
/// fewest.
fn uniform(
    subscriptions: &BTreeMap<String, Topics>,
    previous: &BTreeMap<String, Assignment>,
) -> BTreeMap<String, Assignment> {
    let mut target: BTreeMap<String, Assignment> = subscriptions
        .keys()
        .map(|m| (m.clone(), Assignment::new()))
        .collect();
    if subscriptions.is_empty() {
        return target;
    }
    let mut all: Topics = Topics::new();
    for topics in subscriptions.values() {
        all.extend(topics.iter().map(|(n, i)| (n.clone(), *i)));
    }
    let partitions = partitions_of(&all);
    let floor = partitions.len() / subscriptions.len();
    let mut extras = partitions.len() % subscriptions.len();
    let mut taken: HashSet<(Uuid, i32)> = HashSet::new();
    let mut order: Vec<&String> = subscriptions.keys().collect();
    order.sort_by_key(|id| (std::cmp::Reverse(count(previous.get(*id))), (*id).clone()));
    for id in order {
        let subscribed: HashSet<(Uuid, i32)> = partitions_of(&subscriptions[id])
            .into_iter()
            .map(|(_, t, p)| (t, p))
            .collect();
        let keep: Vec<(Uuid, i32)> = previous
            .get(id)
            .into_iter()
            .flat_map(|a| a.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p))))
            .filter(|tp| subscribed.contains(tp) && !taken.contains(tp))
            .collect();
        let cap = floor + usize::from(extras > 0);
        let n = keep.len().min(cap);
        if n > floor {
            extras -= 1;
        }
        for &(t, p) in &keep[..n] {
            taken.insert((t, p));
            give(&mut target, id, t, p);
        }
    }
    // Partitions fewest members can take go first, so that a member with
    // the widest subscription is not filled with partitions others could
    // have taken.
    let takers = |name: &str| subscriptions.values().filter(|t| t.contains_key(name)).count();
    let mut rest: Vec<(String, Uuid, i32)> = partitions
        .into_iter()
        .filter(|(_, t, p)| !taken.contains(&(*t, *p)))
        .collect();
    rest.sort_by_key(|(name, _, p)| (takers(name), name.clone(), *p));
    for (name, t, p) in rest {
        let fewest = subscriptions
            .iter()
            .filter(|(_, topics)| topics.contains_key(&name))
            .map(|(id, _)| id)
            .min_by_key(|id| (count(target.get(*id)), (*id).clone()));
        if let Some(id) = fewest {
            give(&mut target, id, t, p);
        }
    }
    target
}

/// Per topic, its subscribers in member id order each take a contiguous
/// range; the first `partitions % subscribers` one more.
fn range(subscriptions: &BTreeMap<String, Topics>) -> BTreeMap<String, Assignment> {
    let mut target: BTreeMap<String, Assignment> = subscriptions
        .keys()
        .map(|m| (m.clone(), Assignment::new()))
        .collect();
    let mut all: Topics = Topics::new();
    for topics in subscriptions.values() {
        all.extend(topics.iter().map(|(n, i)| (n.clone(), *i)));
    }
    for (name, info) in &all {
        let members: Vec<&String> = subscriptions
            .iter()
            .filter(|(_, topics)| topics.contains_key(name))
            .map(|(id, _)| id)
            .collect();
        let n = usize::try_from(info.partitions.max(0)).unwrap_or(0);
        let (per, extra) = (n / members.len(), n % members.len());
        let mut next = 0;
        for (i, id) in members.into_iter().enumerate() {
            let len = per + usize::from(i < extra);
            for p in next..next + len {
                give(&mut target, id, info.id, i32::try_from(p).unwrap_or(i32::MAX));
            }
            next += len;
        }
    }
    target
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::groups::consumer::TopicInfo;

    fn topics(specs: &[(&str, i32)]) -> Topics {
        specs
            .iter()
            .enumerate()
            .map(|(i, (n, p))| {
                let id = Uuid::from_u128(i as u128 + 1);
                (n.to_string(), TopicInfo { id, partitions: *p })
            })
            .collect()
    }

    fn counts(t: &BTreeMap<String, Assignment>) -> Vec<usize> {
        t.values().map(|a| count(Some(a))).collect()
    }

    fn every_partition_once(t: &BTreeMap<String, Assignment>, total: usize) {
        let mut seen = HashSet::new();
        for a in t.values() {
            for (topic, ps) in a {
                for p in ps {
                    assert!(seen.insert((*topic, *p)), "{topic}-{p} twice");
                }
            }
        }
        assert_eq!(seen.len(), total);
    }

    #[test]
    fn uniform_balances_and_keeps_partitions_where_they_were() {
        let t = topics(&[("a", 4), ("b", 3)]);
        let subs = |ids: &[&str]| -> BTreeMap<String, Topics> {
            ids.iter().map(|id| (id.to_string(), t.clone())).collect()
        };
        let one = Assignor::Uniform.assign(&subs(&["m1"]), &BTreeMap::new());
        assert_eq!(counts(&one), vec![7]);
        let two = Assignor::Uniform.assign(&subs(&["m1", "m2"]), &one);
        every_partition_once(&two, 7);
        assert_eq!(counts(&two), vec![4, 3]);
        // m1 kept four of its seven: nothing moved but what m2 needed.
        assert_eq!(difference_count(&one["m1"], &two["m1"]), 3);
        let three = Assignor::Uniform.assign(&subs(&["m1", "m2", "m3"]), &two);
        every_partition_once(&three, 7);
        let mut c = counts(&three);
        c.sort();
        assert_eq!(c, vec![2, 2, 3]);
        // m2 leaves: its partitions go, the others keep theirs.
        let back = Assignor::Uniform.assign(&subs(&["m1", "m3"]), &three);
        every_partition_once(&back, 7);
        assert_eq!(difference_count(&three["m1"], &back["m1"]), 0);
        assert_eq!(difference_count(&three["m3"], &back["m3"]), 0);
    }

    fn difference_count(before: &Assignment, after: &Assignment) -> usize {
        before
            .iter()
            .map(|(t, ps)| {
                ps.iter()
                    .filter(|p| !after.get(t).is_some_and(|a| a.contains(p)))
                    .count()
            })
            .sum()
    }

    #[test]
    fn uniform_gives_a_topic_only_to_its_subscribers() {
        let t = topics(&[("a", 4), ("b", 2)]);
        let only_a: Topics = t
            .iter()
            .filter(|(n, _)| *n == "a")
            .map(|(n, i)| (n.clone(), *i))
            .collect();
        let subs: BTreeMap<String, Topics> =
            [("m1".to_string(), t.clone()), ("m2".to_string(), only_a)].into();
        let target = Assignor::Uniform.assign(&subs, &BTreeMap::new());
        every_partition_once(&target, 6);
        let b = t["b"].id;
        assert!(!target["m2"].contains_key(&b));
        assert_eq!(counts(&target), vec![3, 3]);
    }

    #[test]
    fn range_gives_contiguous_ranges_per_topic() {
        let t = topics(&[("a", 5)]);
        let subs: BTreeMap<String, Topics> = [("m1", &t), ("m2", &t)]
            .into_iter()
            .map(|(id, t)| (id.to_string(), t.clone()))
            .collect();
        let target = Assignor::Range.assign(&subs, &BTreeMap::new());
        let a = t["a"].id;
        assert_eq!(target["m1"][&a], BTreeSet::from([0, 1, 2]));
        assert_eq!(target["m2"][&a], BTreeSet::from([3, 4]));
    }
}
