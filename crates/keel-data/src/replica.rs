//! A partition's side of cluster durability: the leader epoch it has
//! claimed, the groups it wrote that the cluster has not committed yet,
//! and the producers waiting for them.
//!
//! In a cluster a partition's high watermark is its committed offset: a
//! group of batches is written to the local log, handed to the broker's
//! [`Wal`](crate::wal::Wal), and its offsets become readable (and its
//! acks=all producers are answered) only once the WAL object holding it
//! is in the object store and committed in the coordination store. Every
//! claim of leadership starts a new *term*; a term ends when the cluster
//! refuses its commits (another leader claimed the partition, or this
//! broker's session ended), and what it wrote past the committed offset is
//! never acknowledged: the next claim cuts it from the local log.

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// What a group of batches was written under: the leader epoch its
/// batches carry and the claim it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Term {
    pub epoch: i32,
    /// Rises with every claim and every end of one.
    pub generation: u64,
}

/// Why an acks=all write was not made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotDurable {
    /// Its term ended: another leader holds the partition, or this
    /// broker's session ended. It will never be acknowledged.
    Fenced,
    /// Not committed within the request's timeout (the object store or
    /// the coordination store is slow or away); it may still be.
    TimedOut,
}

#[derive(Debug, Default)]
struct State {
    /// The claimed leader epoch, `None` while this broker may not write.
    epoch: Option<i32>,
    generation: u64,
    /// The partition's key revision the next commit compares against.
    revision: i64,
    /// The revision of the claim that started the term: what records of
    /// segment copies and log starts compare against.
    claimed_at: i64,
    /// Where the current term's committed log ends.
    committed: i64,
    /// The last term that ended, and where its committed log ended then:
    /// its waiters learn whether their write made it.
    ended: Option<(u64, i64)>,
    /// Written, not yet committed: each group's end offset and the last
    /// stable offset the partition has once it is committed.
    pending: VecDeque<(i64, i64)>,
}

impl State {
    fn end(&mut self) {
        if self.epoch.take().is_some() {
            self.ended = Some((self.generation, self.committed));
        }
        self.generation += 1;
        self.pending.clear();
    }

    /// Whether a write at `offset` in term `generation` is committed
    /// (`Some(true)`), never will be (`Some(false)`), or may yet be.
    fn decided(&self, generation: u64, offset: i64) -> Option<bool> {
        if generation == self.generation && self.epoch.is_some() {
            return (self.committed > offset).then_some(true);
        }
        match self.ended {
            Some((g, committed)) if g == generation => Some(committed > offset),
            _ => Some(false),
        }
    }
}

/// The cluster side of one partition (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Replica {
    state: Mutex<State>,
    /// Woken at every commit and every end of a term.
    changed: Notify,
}

impl Replica {
    /// The term appends are written in now, `None` while unclaimed.
    pub fn term(&self) -> Option<Term> {
        let st = self.state.lock();
        st.epoch.map(|epoch| Term {
            epoch,
            generation: st.generation,
        })
    }

    /// Starts a term in `epoch`, the log committed up to `committed` at
    /// `revision` (ending the current term, if any): `publish` makes the
    /// committed offset the high watermark, under the state's lock, so
    /// publications keep their order.
    pub fn claim(&self, epoch: i32, (committed, revision): (i64, i64), publish: impl FnOnce()) -> Term {
        let mut st = self.state.lock();
        st.end();
        st.epoch = Some(epoch);
        st.revision = revision;
        st.claimed_at = revision;
        st.committed = committed;
        publish();
        let term = Term {
            epoch,
            generation: st.generation,
        };
        drop(st);
        self.changed.notify_waiters();
        term
    }

    /// Ends the term `generation` if it is the current one: nothing it
    /// wrote past the committed offset will be acknowledged.
    pub fn end_term(&self, generation: u64) -> bool {
        let mut st = self.state.lock();
        if st.generation != generation || st.epoch.is_none() {
            return false;
        }
        st.end();
        drop(st);
        self.changed.notify_waiters();
        true
    }

    /// A group written in `generation` ending at `end`; `lso` is the last
    /// stable offset once it is committed. False if the term has ended
    /// (the caller does not hand the group to the WAL).
    pub fn written(&self, generation: u64, end: i64, lso: i64) -> bool {
        let mut st = self.state.lock();
        if st.generation != generation || st.epoch.is_none() {
            return false;
        }
        st.pending.push_back((end, lso));
        true
    }

    /// The revision a commit in `generation` compares against, `None` if
    /// that term has ended.
    pub fn revision(&self, generation: u64) -> Option<i64> {
        let st = self.state.lock();
        (st.generation == generation && st.epoch.is_some()).then_some(st.revision)
    }

    /// The revision of the current term's claim, `None` without a term.
    pub fn claimed_at(&self) -> Option<i64> {
        let st = self.state.lock();
        st.epoch.is_some().then_some(st.claimed_at)
    }

    /// The groups of `generation` up to `end` are committed at `revision`:
    /// `publish(high watermark, last stable offset)` runs under the state's
    /// lock. Ignored if the term has ended.
    pub fn committed(&self, generation: u64, end: i64, revision: i64, publish: impl FnOnce(i64, i64)) {
        let mut st = self.state.lock();
        if st.generation != generation || st.epoch.is_none() {
            return;
        }
        st.revision = revision;
        let mut last = None;
        while st.pending.front().is_some_and(|(e, _)| *e <= end) {
            last = st.pending.pop_front();
        }
        if let Some((end, lso)) = last {
            st.committed = st.committed.max(end);
            publish(end, lso);
        }
        drop(st);
        self.changed.notify_waiters();
    }

    /// Waits until the write at `offset` made in term `generation` is
    /// committed, is known never to be (its term ended before its commit),
    /// or `timeout` passes.
    pub async fn wait(&self, generation: u64, offset: i64, timeout: Duration) -> Result<(), NotDurable> {
        let waited = async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                match self.state.lock().decided(generation, offset) {
                    Some(true) => return Ok(()),
                    Some(false) => return Err(NotDurable::Fenced),
                    None => {}
                }
                changed.await;
            }
        };
        tokio::time::timeout(timeout, waited)
            .await
            .unwrap_or(Err(NotDurable::TimedOut))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn writes_become_durable_in_order_and_die_with_their_term() {
        let replica = Arc::new(Replica::default());
        let hw = Arc::new(AtomicI64::new(0));
        assert_eq!(replica.term(), None);
        let term = replica.claim(3, (0, 10), || {});
        assert!(replica.written(term.generation, 5, 5));
        assert!(replica.written(term.generation, 9, 7));
        let r = Arc::clone(&replica);
        let waiter = tokio::spawn(async move { r.wait(term.generation, 6, Duration::from_secs(5)).await });
        let publish = |end: i64, lso: i64| {
            assert!(lso <= end);
            hw.store(end, Ordering::SeqCst);
        };
        replica.committed(term.generation, 5, 11, publish);
        assert_eq!(hw.load(Ordering::SeqCst), 5);
        replica.committed(term.generation, 9, 12, publish);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        assert_eq!(replica.revision(term.generation), Some(12));
        // The term ends: its waiters past the commit are told, the ones
        // below it are not misled, later commits change nothing.
        assert!(replica.written(term.generation, 12, 12));
        let r = Arc::clone(&replica);
        let late = tokio::spawn(async move { r.wait(term.generation, 10, Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        assert!(replica.end_term(term.generation));
        assert_eq!(late.await.unwrap(), Err(NotDurable::Fenced));
        replica.committed(term.generation, 12, 13, |_, _| panic!("an ended term published"));
        assert_eq!(replica.revision(term.generation), None);
        assert!(!replica.written(term.generation, 13, 13));
        // A new term commits past the old one's offsets with other records:
        // a late waiter of the old term is not told its write made it.
        let next = replica.claim(4, (9, 20), || {});
        assert!(next.generation > term.generation);
        assert!(replica.written(next.generation, 15, 15));
        replica.committed(next.generation, 15, 21, |_, _| {});
        let wait = |g, o| replica.wait(g, o, Duration::from_millis(10));
        assert_eq!(wait(term.generation, 12).await, Err(NotDurable::Fenced));
        assert_eq!(
            wait(term.generation, 8).await,
            Ok(()),
            "committed before its term ended"
        );
        assert_eq!(wait(next.generation, 14).await, Ok(()));
        assert_eq!(wait(next.generation, 15).await, Err(NotDurable::TimedOut));
    }
}
