//! The classic groups by id, and the requests waiting on them.
//!
//! A [`Group`] answers a waiting JoinGroup or SyncGroup with a
//! [`Completion`] for its [`WaiterId`]; the request itself waits on a
//! `oneshot` registered here. Every lock of the groups settles when it is
//! let go ([`ClassicLock`]'s drop): each completion reaches its request,
//! and a request whose waiter the group no longer holds unanswered (its
//! member was replaced, or sent the request again) is let go, its receiver
//! seeing the sender dropped.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::oneshot;

use super::group::{Answer, Completion, Group, JoinResult, SyncResult, WaiterId};

/// A request's answer: now, or when the rebalance moves on.
pub(super) enum Awaited<T> {
    Now(T),
    Later(oneshot::Receiver<T>),
}

enum Waiting {
    Join(WaiterId, oneshot::Sender<JoinResult>),
    Sync(WaiterId, oneshot::Sender<SyncResult>),
}

impl Waiting {
    fn id(&self) -> WaiterId {
        match self {
            Waiting::Join(id, _) | Waiting::Sync(id, _) => *id,
        }
    }
}

/// The classic groups by id (a map), with the requests waiting on them.
#[derive(Default)]
pub(super) struct ClassicGroups {
    groups: HashMap<String, Group>,
    /// By group id: requests waiting for that group's rebalance.
    waiting: HashMap<String, Vec<Waiting>>,
}

impl ClassicGroups {
    pub(super) fn new(groups: HashMap<String, Group>) -> ClassicGroups {
        ClassicGroups {
            groups,
            waiting: HashMap::new(),
        }
    }

    /// Where a JoinGroup to `group_id` gets its answer.
    pub(super) fn join_answer(&mut self, group_id: &str, answer: Answer<JoinResult>) -> Awaited<JoinResult> {
        self.answer(group_id, answer, Waiting::Join)
    }

    /// Where a SyncGroup to `group_id` gets its answer.
    pub(super) fn sync_answer(&mut self, group_id: &str, answer: Answer<SyncResult>) -> Awaited<SyncResult> {
        self.answer(group_id, answer, Waiting::Sync)
    }

    fn answer<T>(
        &mut self,
        group_id: &str,
        answer: Answer<T>,
        waiting: fn(WaiterId, oneshot::Sender<T>) -> Waiting,
    ) -> Awaited<T> {
        match answer {
            Answer::Now(result) => Awaited::Now(result),
            Answer::Later(id) => {
                let (tx, rx) = oneshot::channel();
                self.waiting_on(group_id).push(waiting(id, tx));
                Awaited::Later(rx)
            }
        }
    }

    fn waiting_on(&mut self, group_id: &str) -> &mut Vec<Waiting> {
        self.waiting.entry(group_id.to_string()).or_default()
    }

    /// Removes a group, its answers delivered first.
    pub(super) fn remove_group(&mut self, group_id: &str) -> Option<Group> {
        self.settle();
        let group = self.groups.remove(group_id);
        self.waiting.remove(group_id);
        group
    }

    /// Delivers every answer the groups gave, and lets go of the requests
    /// no group holds any more.
    fn settle(&mut self) {
        let groups = &mut self.groups;
        self.waiting.retain(|group_id, waiting| {
            let Some(group) = groups.get_mut(group_id) else {
                return false;
            };
            for completion in group.take_completions() {
                deliver(waiting, completion);
            }
            let held = group.held_waiters();
            waiting.retain(|w| held.contains(&w.id()));
            !waiting.is_empty()
        });
    }
}

fn deliver(waiting: &mut Vec<Waiting>, completion: Completion) {
    let id = match &completion {
        Completion::Join(id, _) | Completion::Sync(id, _) => *id,
    };
    let Some(at) = waiting.iter().position(|w| w.id() == id) else {
        return;
    };
    match (waiting.swap_remove(at), completion) {
        (Waiting::Join(_, tx), Completion::Join(_, result)) => {
            let _ = tx.send(result);
        }
        (Waiting::Sync(_, tx), Completion::Sync(_, result)) => {
            let _ = tx.send(result);
        }
        // A join's waiter answered as a sync (or back): a bug in `Group`.
        _ => unreachable!("a completion of the other kind for waiter {id:?}"),
    }
}

impl Deref for ClassicGroups {
    type Target = HashMap<String, Group>;

    fn deref(&self) -> &HashMap<String, Group> {
        &self.groups
    }
}

/// Mutable access to the map. Removing a group through it would drop its
/// undelivered answers: use [`ClassicGroups::remove_group`].
impl DerefMut for ClassicGroups {
    fn deref_mut(&mut self) -> &mut HashMap<String, Group> {
        &mut self.groups
    }
}

/// The lock over the classic groups.
#[derive(Default)]
pub(super) struct ClassicMutex(Mutex<ClassicGroups>);

impl ClassicMutex {
    pub(super) fn new(groups: HashMap<String, Group>) -> ClassicMutex {
        ClassicMutex(Mutex::new(ClassicGroups::new(groups)))
    }

    pub(super) fn lock(&self) -> ClassicLock<'_> {
        ClassicLock(self.0.lock())
    }
}

/// The classic groups, locked; settles when let go.
pub(super) struct ClassicLock<'a>(MutexGuard<'a, ClassicGroups>);

impl Deref for ClassicLock<'_> {
    type Target = ClassicGroups;

    fn deref(&self) -> &ClassicGroups {
        &self.0
    }
}

impl DerefMut for ClassicLock<'_> {
    fn deref_mut(&mut self) -> &mut ClassicGroups {
        &mut self.0
    }
}

impl Drop for ClassicLock<'_> {
    fn drop(&mut self) {
        self.0.settle();
    }
}
