//! The priority of the threads that work for history (cold reads, large
//! fetch responses, the log cleaner): the lowest the kernel has, for CPU
//! and for I/O, so that a backfill or a compaction run takes only what the
//! live path leaves.
//!
//! * CPU: `SCHED_IDLE`. A thread of the live path that wakes up preempts a
//!   `SCHED_IDLE` thread at once; a niced thread of the normal class may
//!   finish its time slice first (milliseconds on a busy core), and that
//!   wait lands on the produce or tail fetch that woke up. Where the policy
//!   cannot be set, the thread is niced by [`crate::BULK_NICE`] instead.
//! * I/O: the idle class (`ioprio_set`, `IOPRIO_CLASS_IDLE`): schedulers
//!   that honour classes (BFQ, mq-deadline) serve the live path's reads and
//!   writeback first.
//!
//! This module, like `resident`, uses unsafe code: Rust's safe wrappers
//! do not offer `sched_setscheduler` or `ioprio_set`.
#![expect(
    unsafe_code,
    reason = "sched_setscheduler and ioprio_set have no safe wrapper"
)]

use std::io;

/// Lowers the calling thread, a thread of the pool named `pool`; the
/// pool's `first` thread logs what could not be set.
pub fn lower_pool_thread(pool: &str, first: bool) {
    if let Some(problems) = lower_this_thread().problems().filter(|_| first) {
        tracing::info!(%problems, "{pool} threads run above the lowest priority");
    }
}

/// What [`lower_this_thread`] managed to set.
#[derive(Debug)]
struct Lowered {
    /// `"SCHED_IDLE"`, or `"nice +10"` where SCHED_IDLE was refused.
    cpu: io::Result<&'static str>,
    /// The idle I/O class.
    io: io::Result<()>,
}

impl Lowered {
    /// One line for the log, or None when everything was set.
    fn problems(&self) -> Option<String> {
        let mut out = Vec::new();
        match &self.cpu {
            Ok("SCHED_IDLE") => {}
            Ok(other) => out.push(format!("CPU priority {other} (SCHED_IDLE refused)")),
            Err(e) => out.push(format!("normal CPU priority ({e})")),
        }
        if let Err(e) = &self.io {
            out.push(format!("normal I/O priority ({e})"));
        }
        (!out.is_empty()).then(|| out.join(", "))
    }
}

/// Lowers the calling thread's CPU and I/O priority (Linux: both are the
/// thread's own, not the process's).
fn lower_this_thread() -> Lowered {
    let cpu = set_sched_idle().map(|()| "SCHED_IDLE").or_else(|idle| {
        rustix::process::nice(crate::BULK_NICE)
            .map(|_| "nice +10")
            .map_err(|e| io::Error::other(format!("SCHED_IDLE: {idle}; nice: {e}")))
    });
    Lowered {
        cpu,
        io: set_idle_io_class(),
    }
}

/// The calling thread's scheduling policy is SCHED_IDLE.
#[cfg(test)]
pub(crate) fn this_thread_is_sched_idle() -> bool {
    // SAFETY: no arguments; returns the calling thread's policy.
    unsafe { libc::sched_getscheduler(0) == libc::SCHED_IDLE }
}

/// The calling thread's I/O priority class: 3 is idle.
#[cfg(test)]
pub(crate) fn this_thread_io_class() -> io::Result<i32> {
    // SAFETY: ioprio_get(IOPRIO_WHO_PROCESS, 0) reads the calling thread's
    // I/O priority; it takes no pointers.
    let v = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) };
    if v < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i32::try_from(v >> IOPRIO_CLASS_SHIFT).unwrap_or(-1))
}

const IOPRIO_WHO_PROCESS: libc::c_long = 1;
const IOPRIO_CLASS_SHIFT: libc::c_long = 13;
const IOPRIO_CLASS_IDLE: libc::c_long = 3;

fn set_sched_idle() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` outlives the call.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_idle_io_class() -> io::Result<()> {
    // SAFETY: ioprio_set(IOPRIO_WHO_PROCESS, 0, value) sets the calling
    // thread's I/O priority; it takes no pointers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0 as libc::c_long,
            IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lowered_thread_is_idle_for_cpu_and_io() {
        std::thread::spawn(|| {
            let lowered = lower_this_thread();
            if lowered.cpu.as_ref().is_ok_and(|p| *p == "SCHED_IDLE") {
                assert!(this_thread_is_sched_idle());
            }
            if lowered.io.is_ok() {
                assert_eq!(this_thread_io_class().unwrap(), 3);
            }
            // Unprivileged Linux allows both for a thread's own priority.
            assert!(lowered.problems().is_none(), "{:?}", lowered.problems());
        })
        .join()
        .unwrap();
        assert!(
            !this_thread_is_sched_idle(),
            "only the spawned thread was lowered"
        );
    }
}
