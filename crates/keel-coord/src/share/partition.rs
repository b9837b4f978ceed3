//! One share partition: the records of a topic partition a share group
//! reads, each available, acquired by one member until its lock runs out,
//! acknowledged or archived, with how often it was delivered (KIP-932).
//!
//! Offsets, as Kafka names them:
//! * the **start offset** (SPSO): every record below it is acknowledged or
//!   archived; it only moves forward, except when an operator resets it;
//! * the **end offset** (SPEO): one past the last record ever acquired;
//!   records at and past it have not been read yet.
//!
//! Records in `[start, end)` are *in flight*, one slot each. No I/O and no
//! clock: every operation takes `now_ms`, and the caller arms a timer for
//! [`SharePartition::next_deadline_ms`].

use std::collections::VecDeque;
use std::sync::Arc;

/// A record's state in its share partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    Available,
    Acquired,
    Acknowledged,
    Archived,
}

impl RecordState {
    /// Kafka's state codes, as persisted in share snapshots.
    pub fn code(self) -> i8 {
        match self {
            RecordState::Available => 0,
            RecordState::Acquired => 1,
            RecordState::Acknowledged => 2,
            RecordState::Archived => 4,
        }
    }

    /// Whether the record is done with: below the start offset.
    fn terminal(self) -> bool {
        matches!(self, RecordState::Acknowledged | RecordState::Archived)
    }
}

/// An acknowledgement type (ShareFetch and ShareAcknowledge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckType {
    /// An offset with no record (compacted away, or a control record): archived.
    Gap,
    /// Processed: acknowledged.
    Accept,
    /// Not processed: available again, or archived at the delivery limit.
    Release,
    /// Unprocessable: archived.
    Reject,
    /// Still being processed: the lock starts again (KIP-1222).
    Renew,
}

impl AckType {
    pub fn from_code(code: i8) -> Option<AckType> {
        Some(match code {
            0 => AckType::Gap,
            1 => AckType::Accept,
            2 => AckType::Release,
            3 => AckType::Reject,
            4 => AckType::Renew,
            _ => return None,
        })
    }
}

/// Why an acknowledgement was refused; nothing of its batch was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckError {
    /// A record of the batch is not acquired by this member (never was,
    /// its lock ran out, or it was acknowledged already):
    /// INVALID_RECORD_STATE.
    InvalidRecordState(String),
    /// A malformed batch (offsets out of order, types that do not match
    /// the range, an unknown type): INVALID_REQUEST.
    InvalidRequest(String),
}

/// The settings a share partition works under: the group's, or the
/// broker's `group.share.*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareLimits {
    /// `group.share.delivery.count.limit`: a record delivered this often
    /// and not accepted is archived.
    pub delivery_limit: i16,
    /// `group.share.record.lock.duration.ms`.
    pub lock_ms: i64,
    /// `group.share.partition.max.record.locks`: at most this many
    /// records in flight; acquisition of new records stops there.
    pub max_in_flight: usize,
}

impl Default for ShareLimits {
    fn default() -> Self {
        ShareLimits {
            delivery_limit: 5,
            lock_ms: 30_000,
            max_in_flight: 2000,
        }
    }
}

/// One in-flight record.
#[derive(Debug, Clone)]
struct Slot {
    state: RecordState,
    /// Deliveries so far; it counts up on each acquisition.
    deliveries: i16,
    /// The member holding it, while acquired.
    owner: Option<Arc<str>>,
    /// When the lock runs out, while acquired.
    deadline_ms: i64,
}

impl Slot {
    fn available() -> Slot {
        Slot {
            state: RecordState::Available,
            deliveries: 0,
            owner: None,
            deadline_ms: 0,
        }
    }

    fn archived() -> Slot {
        Slot {
            state: RecordState::Archived,
            ..Slot::available()
        }
    }

    fn acquire(&mut self, member: &Arc<str>, deadline_ms: i64) {
        self.state = RecordState::Acquired;
        self.deliveries = self.deliveries.saturating_add(1);
        self.owner = Some(Arc::clone(member));
        self.deadline_ms = deadline_ms;
    }

    /// Back to available, or archived once delivered `limit` times.
    fn release(&mut self, limit: i16) {
        self.state = if self.deliveries >= limit {
            RecordState::Archived
        } else {
            RecordState::Available
        };
        self.owner = None;
    }

    fn held_by(&self, member: &str) -> bool {
        self.state == RecordState::Acquired && self.owner.as_deref() == Some(member)
    }
}

/// A range of acquired records, as ShareFetch returns them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    pub first_offset: i64,
    pub last_offset: i64,
    pub delivery_count: i16,
}

/// A log batch's offsets, as a read returned them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSpan {
    pub base_offset: i64,
    pub last_offset: i64,
}

/// In-flight records by state, and what the partition did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShareCounts {
    pub available: u64,
    pub acquired: u64,
    pub acknowledged: u64,
    pub archived: u64,
    /// Acquisitions of records delivered before.
    pub redeliveries: u64,
    /// Records archived at the delivery limit.
    pub archived_at_limit: u64,
    /// Locks that ran out.
    pub lock_expiries: u64,
}

#[derive(Debug, Clone)]
pub struct SharePartition {
    /// The start offset (SPSO). `slots[i]` is the record at `start + i`.
    start: i64,
    slots: VecDeque<Slot>,
    /// No lock runs out before this: a lower bound of the acquired
    /// records' deadlines (`i64::MAX` with none), so checking for expired
    /// locks costs nothing until one may have run out.
    earliest_deadline_ms: i64,
    redeliveries: u64,
    archived_at_limit: u64,
    lock_expiries: u64,
}

impl SharePartition {
    /// A share partition with nothing in flight, starting at `start`.
    pub fn new(start: i64) -> SharePartition {
        SharePartition {
            start,
            slots: VecDeque::new(),
            earliest_deadline_ms: i64::MAX,
            redeliveries: 0,
            archived_at_limit: 0,
            lock_expiries: 0,
        }
    }

    pub fn start_offset(&self) -> i64 {
        self.start
    }

    /// One past the last record acquired (SPEO).
    pub fn end_offset(&self) -> i64 {
        self.start + self.slots.len() as i64
    }

    /// Where the next read of the log should begin: the first available
    /// in-flight record, else the end offset; `None` when nothing can be
    /// acquired (every in-flight record is taken and the in-flight limit
    /// is reached). Locks that ran out by `now_ms` are released first.
    pub fn next_fetch_offset(&mut self, limits: &ShareLimits, now_ms: i64) -> Option<i64> {
        self.expire(limits, now_ms);
        if let Some(i) = self.slots.iter().position(|s| s.state == RecordState::Available) {
            return Some(self.start + i as i64);
        }
        (self.slots.len() < limits.max_in_flight).then(|| self.end_offset())
    }

    /// Acquires for `member` what `batches` (a read of the log, in offset
    /// order) hold that is available: in-flight records released before,
    /// and records past the end offset while fewer than the in-flight
    /// limit are in flight. Whole batches are taken until `max_records`
    /// are (Kafka's batch-optimized mode). Offsets between batches, which
    /// the log no longer has, are archived as they are passed.
    pub fn acquire(
        &mut self,
        member: &Arc<str>,
        batches: &[BatchSpan],
        max_records: usize,
        limits: &ShareLimits,
        now_ms: i64,
    ) -> Vec<Acquired> {
        self.expire(limits, now_ms);
        let deadline_ms = now_ms.saturating_add(limits.lock_ms);
        self.earliest_deadline_ms = self.earliest_deadline_ms.min(deadline_ms);
        let mut taken: Vec<(i64, i16)> = Vec::new();
        for b in batches {
            if taken.len() >= max_records.max(1) {
                break;
            }
            if b.last_offset < self.start || b.last_offset < b.base_offset {
                continue;
            }
            // A batch begun under the in-flight limit is taken whole, as
            // Kafka does: the limit may be passed by one batch.
            let may_extend = self.slots.len() < limits.max_in_flight;
            if !may_extend && b.base_offset >= self.end_offset() {
                break;
            }
            // Offsets the log skips between the end and this batch
            // (compaction, aborted-and-cleaned transactions): with nothing
            // in flight the start moves past them; otherwise they take a
            // slot each, so a gap wider than the in-flight limit waits
            // until what is in flight before it is done.
            let gap = b.base_offset.saturating_sub(self.end_offset());
            if gap > 0 && may_extend {
                if self.slots.is_empty() {
                    self.start = b.base_offset;
                } else if gap > limits.max_in_flight as i64 {
                    break;
                } else {
                    (0..gap).for_each(|_| self.slots.push_back(Slot::archived()));
                }
            }
            for offset in b.base_offset.max(self.start)..=b.last_offset {
                let i = (offset - self.start) as usize;
                if i == self.slots.len() {
                    if !may_extend {
                        break;
                    }
                    self.slots.push_back(Slot::available());
                }
                let slot = &mut self.slots[i];
                if slot.state == RecordState::Available {
                    if slot.deliveries > 0 {
                        self.redeliveries += 1;
                    }
                    slot.acquire(member, deadline_ms);
                    taken.push((offset, slot.deliveries));
                }
            }
        }
        self.advance();
        ranges(&taken)
    }

    /// Applies one acknowledgement batch of `member`: `types` holds one
    /// type for the whole range, or one per offset. Every record of the
    /// range must be acquired by `member`, or nothing is applied.
    pub fn acknowledge(
        &mut self,
        member: &str,
        first_offset: i64,
        last_offset: i64,
        types: &[AckType],
        limits: &ShareLimits,
        now_ms: i64,
    ) -> Result<(), AckError> {
        self.expire(limits, now_ms);
        if last_offset < first_offset {
            return Err(AckError::InvalidRequest(format!(
                "last offset {last_offset} is before first offset {first_offset}"
            )));
        }
        // Within the in-flight records first, so the length cannot overflow.
        if first_offset < self.start || last_offset >= self.end_offset() {
            return Err(AckError::InvalidRecordState(format!(
                "offsets {first_offset}..={last_offset} are not in flight ({}..{})",
                self.start,
                self.end_offset()
            )));
        }
        let len = last_offset - first_offset + 1;
        if types.len() != 1 && types.len() as i64 != len {
            return Err(AckError::InvalidRequest(format!(
                "{} acknowledge types for {len} offsets",
                types.len()
            )));
        }
        let base = (first_offset - self.start) as usize;
        if let Some(i) = (0..len as usize).find(|i| !self.slots[base + i].held_by(member)) {
            return Err(AckError::InvalidRecordState(format!(
                "offset {} is not acquired by this member",
                first_offset + i as i64
            )));
        }
        for i in 0..len as usize {
            let ack = if types.len() == 1 { types[0] } else { types[i] };
            let slot = &mut self.slots[base + i];
            match ack {
                AckType::Accept => {
                    slot.state = RecordState::Acknowledged;
                    slot.owner = None;
                }
                AckType::Gap | AckType::Reject => {
                    slot.state = RecordState::Archived;
                    slot.owner = None;
                }
                AckType::Release => {
                    slot.release(limits.delivery_limit);
                    if slot.state == RecordState::Archived {
                        self.archived_at_limit += 1;
                    }
                }
                AckType::Renew => slot.deadline_ms = now_ms.saturating_add(limits.lock_ms),
            }
        }
        self.advance();
        Ok(())
    }

    /// Releases every lock that ran out by `now_ms`; returns how many.
    pub fn expire(&mut self, limits: &ShareLimits, now_ms: i64) -> usize {
        if now_ms < self.earliest_deadline_ms {
            return 0;
        }
        let mut expired = 0;
        let mut earliest = i64::MAX;
        for slot in self.slots.iter_mut() {
            if slot.state != RecordState::Acquired {
                continue;
            }
            if slot.deadline_ms <= now_ms {
                slot.release(limits.delivery_limit);
                if slot.state == RecordState::Archived {
                    self.archived_at_limit += 1;
                }
                expired += 1;
            } else {
                earliest = earliest.min(slot.deadline_ms);
            }
        }
        self.earliest_deadline_ms = earliest;
        self.lock_expiries += expired as u64;
        if expired > 0 {
            self.advance();
        }
        expired
    }

    /// Releases every record `member` holds (its share session closed or
    /// its connection went away); returns how many.
    pub fn release_member(&mut self, member: &str, limits: &ShareLimits) -> usize {
        let mut released = 0;
        for slot in self.slots.iter_mut().filter(|s| s.held_by(member)) {
            slot.release(limits.delivery_limit);
            if slot.state == RecordState::Archived {
                self.archived_at_limit += 1;
            }
            released += 1;
        }
        if released > 0 {
            self.advance();
        }
        released
    }

    /// No lock runs out before this (`None`: none is held). A lower
    /// bound: a lock renewed or released since may run out later.
    pub fn next_deadline_ms(&self) -> Option<i64> {
        (self.earliest_deadline_ms != i64::MAX).then_some(self.earliest_deadline_ms)
    }

    /// The log's start moved past records in flight (retention, deleted
    /// records): they are gone, and the start offset moves with it.
    pub fn skip_to(&mut self, log_start_offset: i64) {
        while self.start < log_start_offset {
            if self.slots.pop_front().is_none() {
                self.start = log_start_offset;
                return;
            }
            self.start += 1;
        }
    }

    /// Starts over at `start` with nothing in flight (an operator's
    /// reset of the group's offsets).
    pub fn reset(&mut self, start: i64) {
        self.start = start;
        self.slots.clear();
        self.earliest_deadline_ms = i64::MAX;
    }

    /// The in-flight records by state, and the partition's counters.
    pub fn counts(&self) -> ShareCounts {
        let mut c = ShareCounts {
            redeliveries: self.redeliveries,
            archived_at_limit: self.archived_at_limit,
            lock_expiries: self.lock_expiries,
            ..ShareCounts::default()
        };
        for s in &self.slots {
            match s.state {
                RecordState::Available => c.available += 1,
                RecordState::Acquired => c.acquired += 1,
                RecordState::Acknowledged => c.acknowledged += 1,
                RecordState::Archived => c.archived += 1,
            }
        }
        c
    }

    /// The state and delivery count of the record at `offset`, while in
    /// flight.
    pub fn record(&self, offset: i64) -> Option<(RecordState, i16)> {
        let i = usize::try_from(offset.checked_sub(self.start)?).ok()?;
        self.slots.get(i).map(|s| (s.state, s.deliveries))
    }

    /// Moves the start offset past the records that are done with.
    fn advance(&mut self) {
        while self.slots.front().is_some_and(|s| s.state.terminal()) {
            self.slots.pop_front();
            self.start += 1;
        }
    }
}

/// Runs of consecutive offsets with one delivery count.
fn ranges(taken: &[(i64, i16)]) -> Vec<Acquired> {
    let mut out: Vec<Acquired> = Vec::new();
    for &(offset, count) in taken {
        match out.last_mut() {
            Some(r) if r.last_offset + 1 == offset && r.delivery_count == count => r.last_offset = offset,
            _ => out.push(Acquired {
                first_offset: offset,
                last_offset: offset,
                delivery_count: count,
            }),
        }
    }
    out
}
