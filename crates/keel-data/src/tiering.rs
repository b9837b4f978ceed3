//! Reader-aware tiering: which sealed segment the mover keeps on the fast
//! tier for a reader about to read it.
//!
//! A reader is a fetch position seen in the last [`RECENT_MS`] (the
//! partition's [`crate::readers::Readers`]) or an offset a group committed
//! in that time ([`CommittedOffsets`]). The oldest local segment is kept
//! while a reader is in it or behind it by at most a window
//! (`keel.tier.reader.window.bytes`, [`WINDOW_BYTES`] by default; 0 turns
//! this off), estimated from the segment's own bytes per offset, and released as
//! soon as every reader has passed it. A group minutes behind then reads
//! from the fast tier; one days behind (further than the window, or not
//! seen for minutes) reads from the colder tier, as before.
//!
//! A hold keeps at most a window of what the mover would have released (a
//! reader stuck in place holds no more), and held segments may take the
//! fast tier over `keel.tier.fast.max.bytes` by [`OVER_BUDGET_PERCENT`] at
//! most; all holds together keep at most half the fast tier's free space
//! (and without a budget a tenth of its filesystem), and nothing while it
//! is under 5 % free. Past any of these the oldest go regardless (the
//! mover counts those overrides).
//!
//! A group's commit holds until the group commits again or five minutes
//! pass: a group that reads far past its last commit without committing
//! holds the stretch from its commit, up to a window.

/// How recently a reader must have been seen (a fetch, or a group's
/// commit) to hold segments.
pub const RECENT_MS: i64 = 5 * 60 * 1000;

/// How far behind a segment a reader may be and still hold it, and the
/// most a hold keeps: `keel.tier.reader.window.bytes`'s default.
pub const WINDOW_BYTES: u64 = 1 << 30;

/// How far over `keel.tier.fast.max.bytes` held segments may take the fast
/// tier.
pub const OVER_BUDGET_PERCENT: u64 = 10;

/// An offset some group committed, recently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// The group coordinator's committed offsets, as the mover sees them.
pub trait CommittedOffsets: Send + Sync + std::fmt::Debug {
    /// Offsets committed at or after `since_ms` (ms since the epoch).
    fn committed_since(&self, since_ms: i64) -> Vec<Commit>;
}

/// Who holds a segment: a group by its committed offset, or a reader by
/// its last fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// `group <id>`, or `<client id> <address>:<port>`.
    pub who: String,
    pub offset: i64,
}

/// The local segments `[base_offset, next_offset)` (`size_bytes` of them)
/// the mover would have released but keeps on the fast tier for `holder`,
/// who is about to read the first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub base_offset: i64,
    pub next_offset: i64,
    pub size_bytes: u64,
    pub holder: Mark,
}

/// The reader nearest behind (or in) the segment `[base, next)` of `size`
/// bytes, within `window` bytes of it: the one it is kept for; `None`: every
/// reader has passed it or is too far behind.
pub fn holder(base: i64, next: i64, size: u64, marks: &[Mark], window: u64) -> Option<&Mark> {
    let span = (next - base).max(1) as f64;
    let bytes_per_offset = size as f64 / span;
    marks
        .iter()
        .filter(|m| m.offset >= 0 && m.offset < next)
        .map(|m| {
            let behind = (base.saturating_sub(m.offset).max(0) as f64 * bytes_per_offset) as u64;
            (behind, m)
        })
        .filter(|(behind, _)| *behind <= window)
        .min_by_key(|(behind, _)| *behind)
        .map(|(_, m)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(who: &str, offset: i64) -> Mark {
        Mark {
            who: who.into(),
            offset,
        }
    }

    #[test]
    fn a_segment_is_kept_for_the_nearest_reader_not_yet_past_it_within_the_window() {
        // 1,000 offsets of 1 KB each: 1 MB.
        let (base, next, size) = (10_000, 11_000, 1_000_000);
        let window = 5_000_000;
        // In it, and behind it by 2 MB and by 8 MB.
        let marks = [
            mark("group far", 2_000),
            mark("group near", 8_000),
            mark("loader /h:1", 10_500),
        ];
        assert_eq!(holder(base, next, size, &marks, window), Some(&marks[2]));
        assert_eq!(holder(base, next, size, &marks[..2], window), Some(&marks[1]));
        // Too far behind, or passed: nobody keeps it.
        assert_eq!(holder(base, next, size, &marks[..1], window), None);
        assert_eq!(holder(base, next, size, &[mark("done", 11_000)], window), None);
        assert_eq!(holder(base, next, size, &[], window), None);
        // No offset yet (-1), or a forged one, holds nothing and breaks nothing.
        assert_eq!(
            holder(
                base,
                next,
                size,
                &[mark("new", -1), mark("forged", i64::MIN)],
                window
            ),
            None
        );
    }
}
