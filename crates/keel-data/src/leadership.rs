//! Who leads each partition, and in which leader epoch: the seam a cluster
//! plugs in behind. Handlers reach a partition through
//! [`DataPlane::lead`](crate::plane::DataPlane::lead), which asks this seam
//! and checks the epoch the client knows as Kafka does (KIP-320). One node
//! ([`SingleNode`]) leads every partition in epoch 0, forever.

use keel_protocol::ResponseError;
use uuid::Uuid;

/// The broker leading one partition, and its leader epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leader {
    pub node_id: i32,
    pub epoch: i32,
}

/// Which broker leads each partition.
pub trait Leadership: Send + Sync {
    /// This broker's `node.id`.
    fn node_id(&self) -> i32;
    /// The leader of partition `index` of the topic `topic_id` now, or
    /// `None` while no broker leads it.
    fn leader(&self, topic_id: Uuid, index: i32) -> Option<Leader>;
    /// The brokers holding the partition's records (Metadata's replicas
    /// and in-sync replicas).
    fn replicas(&self, topic_id: Uuid, index: i32) -> Vec<i32>;
}

/// One broker alone: it leads every partition, in epoch 0, and holds every
/// partition's only copy.
#[derive(Debug, Clone, Copy)]
pub struct SingleNode {
    pub node_id: i32,
}

/// The leader epoch of every partition of a single node: never re-elected.
pub const SINGLE_NODE_EPOCH: i32 = 0;

impl Leadership for SingleNode {
    fn node_id(&self) -> i32 {
        self.node_id
    }

    fn leader(&self, _topic_id: Uuid, _index: i32) -> Option<Leader> {
        Some(Leader {
            node_id: self.node_id,
            epoch: SINGLE_NODE_EPOCH,
        })
    }

    fn replicas(&self, _topic_id: Uuid, _index: i32) -> Vec<i32> {
        vec![self.node_id]
    }
}

/// Why a request for a partition is not served here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unserved {
    /// No such topic (by name or id) or partition.
    Unknown(ResponseError),
    /// Another broker leads it, or none does now; the client is told which
    /// one where the response has room (KIP-951).
    NotLeader(Option<Leader>),
    /// The client knows an older epoch than the leader's: its metadata is
    /// stale (FENCED_LEADER_EPOCH).
    FencedEpoch,
    /// The client knows a newer epoch than this broker: this broker's view
    /// is behind (UNKNOWN_LEADER_EPOCH).
    UnknownEpoch,
}

impl Unserved {
    /// The Kafka error to answer with.
    pub fn error(self) -> ResponseError {
        match self {
            Unserved::Unknown(e) => e,
            Unserved::NotLeader(_) => ResponseError::NotLeaderOrFollower,
            Unserved::FencedEpoch => ResponseError::FencedLeaderEpoch,
            Unserved::UnknownEpoch => ResponseError::UnknownLeaderEpoch,
        }
    }
}

/// Kafka's check of the epoch a request carries (`current_leader_epoch`,
/// -1 when the client does not know one) against the leader's.
pub fn check_epoch(current: i32, leader: Leader) -> Result<(), Unserved> {
    match current {
        c if c < 0 => Ok(()),
        c if c < leader.epoch => Err(Unserved::FencedEpoch),
        c if c > leader.epoch => Err(Unserved::UnknownEpoch),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_checked_as_kafka_checks_them() {
        let leader = Leader { node_id: 1, epoch: 5 };
        assert_eq!(check_epoch(-1, leader), Ok(()));
        assert_eq!(check_epoch(5, leader), Ok(()));
        assert_eq!(check_epoch(4, leader), Err(Unserved::FencedEpoch));
        assert_eq!(check_epoch(6, leader), Err(Unserved::UnknownEpoch));
        assert_eq!(Unserved::FencedEpoch.error(), ResponseError::FencedLeaderEpoch);
        assert_eq!(Unserved::UnknownEpoch.error(), ResponseError::UnknownLeaderEpoch);
        assert_eq!(
            Unserved::NotLeader(None).error(),
            ResponseError::NotLeaderOrFollower
        );
    }
}
