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

use super::store::{ShareState, StateRun};

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

/// One read of the log: it began at `from` and covered offsets up to
/// `to` (inclusive); `batches` are those of its batches whose records may
/// be delivered, in offset order (control batches and aborted
/// transactions' left out: the offsets the read covered without a
/// deliverable batch are archived).
#[derive(Debug, Clone, Copy)]
pub struct LogRead<'a> {
    pub from: i64,
    pub to: i64,
    pub batches: &'a [BatchSpan],
}

impl<'a> LogRead<'a> {
    /// A read whose every batch may be delivered.
    pub fn of(from: i64, batches: &'a [BatchSpan]) -> LogRead<'a> {
        LogRead {
            from,
            to: batches.last().map_or(from - 1, |b| b.last_offset),
            batches,
        }
    }
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
    /// Counts up at each reset of the start offset.
    state_epoch: i32,
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
            state_epoch: 0,
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

    /// Acquires for `member` what `batches` (a read of the log from
    /// `from`, in offset order) hold that is available: in-flight records
    /// released before, and records past the end offset while fewer than
    /// the in-flight limit are in flight; at most `max_records`. Whole
    /// batches when the limits allow (Kafka's batch-optimized mode); the
    /// client takes the acquired ranges whatever the batches. In-flight
    /// records the read passed over are gone from the log (compaction):
    /// they are archived.
    pub fn acquire(
        &mut self,
        member: &Arc<str>,
        read: LogRead<'_>,
        max_records: usize,
        limits: &ShareLimits,
        now_ms: i64,
    ) -> Vec<Acquired> {
        self.expire(limits, now_ms);
        let batches = read.batches;
        self.archive_missing(read.from, read.to, batches);
        let deadline_ms = now_ms.saturating_add(limits.lock_ms);
        self.earliest_deadline_ms = self.earliest_deadline_ms.min(deadline_ms);
        let max = max_records.max(1);
        let mut taken: Vec<(i64, i16)> = Vec::new();
        // Whether every batch was looked at: then what the read covered
        // past the last one has no record to deliver.
        let mut complete = true;
        'batches: for b in batches {
            if b.last_offset < self.start || b.last_offset < b.base_offset {
                continue;
            }
            if !self.reach(b.base_offset, limits) {
                complete = false;
                break;
            }
            for offset in b.base_offset.max(self.start)..=b.last_offset {
                if taken.len() >= max {
                    complete = false;
                    break 'batches;
                }
                let i = (offset - self.start) as usize;
                if i == self.slots.len() {
                    if self.slots.len() >= limits.max_in_flight {
                        complete = false;
                        break 'batches;
                    }
                    self.slots.push_back(Slot::available());
                }
                if let Some(deliveries) = self.take(i, member, deadline_ms, limits) {
                    taken.push((offset, deliveries));
                }
            }
        }
        if complete && read.to >= self.end_offset() {
            self.reach(read.to.saturating_add(1), limits);
        }
        self.advance();
        ranges(&taken)
    }

    /// Acquires the in-flight record at slot `i` if it is available;
    /// archives it instead if it was delivered as often as allowed (it
    /// was acquired when the broker stopped, or the limit was lowered).
    fn take(&mut self, i: usize, member: &Arc<str>, deadline_ms: i64, limits: &ShareLimits) -> Option<i16> {
        let slot = &mut self.slots[i];
        if slot.state != RecordState::Available {
            return None;
        }
        if slot.deliveries >= limits.delivery_limit {
            slot.state = RecordState::Archived;
            self.archived_at_limit += 1;
            return None;
        }
        if slot.deliveries > 0 {
            self.redeliveries += 1;
        }
        slot.acquire(member, deadline_ms);
        Some(slot.deliveries)
    }

    /// Brings the end offset up to a batch at `base_offset`: offsets the
    /// log skips before it (compaction, cleaned aborted transactions)
    /// cost nothing with nothing in flight (the start moves past them),
    /// else a slot each, archived. `false` when the batch is out of
    /// reach: past the in-flight limit, or past a gap wider than what is
    /// left of it (acquisition waits until what is in flight before it is
    /// done).
    fn reach(&mut self, base_offset: i64, limits: &ShareLimits) -> bool {
        let gap = base_offset.saturating_sub(self.end_offset());
        if gap <= 0 {
            return true;
        }
        if self.slots.len() >= limits.max_in_flight {
            return false;
        }
        if self.slots.is_empty() {
            self.start = base_offset;
            return true;
        }
        // The gap's slots and at least one record must fit.
        if gap >= (limits.max_in_flight - self.slots.len()) as i64 {
            return false;
        }
        (0..gap).for_each(|_| self.slots.push_back(Slot::archived()));
        true
    }

    /// Archives the available in-flight records in `[from, to]` that no
    /// deliverable batch of the read holds: the log no longer has them,
    /// or they are not to be delivered.
    fn archive_missing(&mut self, from: i64, to: i64, batches: &[BatchSpan]) {
        let upto = to.min(self.end_offset() - 1);
        let mut offset = from.max(self.start);
        let mut b = 0;
        while offset <= upto {
            while b < batches.len() && batches[b].last_offset < offset {
                b += 1;
            }
            if b < batches.len() && batches[b].base_offset <= offset {
                offset = batches[b].last_offset + 1;
                continue;
            }
            let next = batches.get(b).map_or(upto + 1, |n| n.base_offset.min(upto + 1));
            for o in offset..next {
                let slot = &mut self.slots[(o - self.start) as usize];
                if slot.state == RecordState::Available {
                    slot.state = RecordState::Archived;
                }
            }
            offset = next;
        }
    }

    /// Applies one acknowledgement batch of `member` (see
    /// [`SharePartition::acknowledge_all`]).
    pub fn acknowledge(
        &mut self,
        member: &str,
        first_offset: i64,
        last_offset: i64,
        types: &[AckType],
        limits: &ShareLimits,
        now_ms: i64,
    ) -> Result<(), AckError> {
        self.acknowledge_all(member, &[(first_offset, last_offset, types)], limits, now_ms)
    }

    /// Applies a request's acknowledgement batches for this partition,
    /// `(first offset, last offset, types)` with one type for the whole
    /// range or one per offset: all of them, or none if any is refused.
    /// Batches must be in offset order without overlap; every record of
    /// a batch must be acquired by `member`, except those below the start
    /// offset, which are done with and skipped (as after the log's start
    /// moved past them).
    /// Locks that ran out so far.
    pub fn lock_expiries(&self) -> u64 {
        self.lock_expiries
    }

    pub fn acknowledge_all(
        &mut self,
        member: &str,
        batches: &[(i64, i64, &[AckType])],
        limits: &ShareLimits,
        now_ms: i64,
    ) -> Result<(), AckError> {
        self.expire(limits, now_ms);
        let mut checked = Vec::with_capacity(batches.len());
        let mut previous: Option<i64> = None;
        for &(first, last, types) in batches {
            if previous.is_some_and(|p| first <= p) {
                return Err(AckError::InvalidRequest(
                    "acknowledgement batches overlap or are out of order".into(),
                ));
            }
            previous = Some(last);
            if let Some(part) = self.check_ack(member, first, last, types)? {
                checked.push((part, types));
            }
        }
        for ((from, last, skip), types) in checked {
            for (i, offset) in (from..=last).enumerate() {
                let ack = if types.len() == 1 {
                    types[0]
                } else {
                    types[skip + i]
                };
                self.apply_ack((offset - self.start) as usize, ack, limits, now_ms);
            }
        }
        self.advance();
        Ok(())
    }

    /// The part of an acknowledgement batch to apply, `(first, last,
    /// types to skip)`, or why it is refused.
    fn check_ack(
        &self,
        member: &str,
        first: i64,
        last: i64,
        types: &[AckType],
    ) -> Result<Option<(i64, i64, usize)>, AckError> {
        if last < first {
            return Err(AckError::InvalidRequest(format!(
                "last offset {last} is before first offset {first}"
            )));
        }
        let len = i128::from(last) - i128::from(first) + 1;
        if types.is_empty() || (types.len() != 1 && types.len() as i128 != len) {
            return Err(AckError::InvalidRequest(format!(
                "{} acknowledge types for {len} offsets",
                types.len()
            )));
        }
        if last < self.start {
            return Ok(None);
        }
        let from = first.max(self.start);
        if last >= self.end_offset() {
            return Err(AckError::InvalidRecordState(format!(
                "offsets {from}..={last} are not in flight ({}..{})",
                self.start,
                self.end_offset()
            )));
        }
        let base = (from - self.start) as usize;
        let n = (last - from + 1) as usize;
        if let Some(i) = (0..n).find(|i| !self.slots[base + i].held_by(member)) {
            return Err(AckError::InvalidRecordState(format!(
                "offset {} is not acquired by this member",
                from + i as i64
            )));
        }
        Ok(Some((from, last, (from - first) as usize)))
    }

    fn apply_ack(&mut self, i: usize, ack: AckType, limits: &ShareLimits, now_ms: i64) {
        let slot = &mut self.slots[i];
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
        self.state_epoch = self.state_epoch.wrapping_add(1);
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

    /// What survives a restart: the start offset and the in-flight
    /// records as runs of one state and delivery count.
    pub fn persisted(&self) -> ShareState {
        let mut runs: Vec<StateRun> = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let offset = self.start + i as i64;
            let code = slot.state.code();
            match runs.last_mut() {
                Some(r) if r.state == code && r.delivery_count == slot.deliveries => r.last_offset = offset,
                _ => runs.push(StateRun {
                    first_offset: offset,
                    last_offset: offset,
                    state: code,
                    delivery_count: slot.deliveries,
                }),
            }
        }
        ShareState {
            start_offset: self.start,
            state_epoch: self.state_epoch,
            runs,
        }
    }

    /// A share partition as it was persisted. Records acquired then are
    /// available now: their holders are gone. Their deliveries stay
    /// counted.
    pub fn restore(state: &ShareState) -> SharePartition {
        let mut sp = SharePartition::new(state.start_offset);
        sp.state_epoch = state.state_epoch;
        for r in &state.runs {
            let state = match r.state {
                2 => RecordState::Acknowledged,
                4 => RecordState::Archived,
                _ => RecordState::Available,
            };
            for _ in r.first_offset..=r.last_offset {
                sp.slots.push_back(Slot {
                    state,
                    deliveries: r.delivery_count,
                    owner: None,
                    deadline_ms: 0,
                });
            }
        }
        sp.advance();
        sp
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
