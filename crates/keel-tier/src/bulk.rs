//! [`Bulk`]: a few threads, at a lower CPU priority, for work done on
//! behalf of consumers reading history: cold reads (I/O, CRC checks, copies),
//! assembling and encoding large fetch responses, and writing them to the
//! socket (the server hands them the connection's write half a piece at a
//! time).
//!
//! The request threads (the async runtime's workers) then never spend
//! milliseconds copying a backfill's megabytes while a producer's request
//! waits behind it, and when the CPU or the disk is short the kernel serves
//! the live path's threads first: bulk threads run at the lowest CPU and
//! I/O priority ([`crate::priority`]). Where that is not allowed they say
//! so once and run at what they got.

use std::sync::mpsc;
use std::sync::Arc;

use parking_lot::Mutex;

/// How much a background thread is niced where SCHED_IDLE is refused (CFS
/// weight about a tenth).
pub const BULK_NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Debug)]
pub struct Bulk {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    threads: usize,
}

impl Bulk {
    /// Starts `threads` (at least one) bulk threads named `keel-bulk`.
    pub fn new(threads: usize) -> std::io::Result<Bulk> {
        let threads = threads.max(1);
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let rx = Arc::clone(&rx);
            std::thread::Builder::new()
                .name("keel-bulk".into())
                .spawn(move || {
                    crate::priority::lower_pool_thread("bulk", i == 0);
                    loop {
                        // One receiver at a time; the job runs unlocked.
                        let job = rx.lock().recv();
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                })?;
        }
        Ok(Bulk {
            jobs: Mutex::new(Some(tx)),
            threads,
        })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` on a bulk thread and returns its result. A job that panics
    /// is an error, not a crash of the caller.
    pub async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> std::io::Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(out);
        });
        let sent = self.jobs.lock().as_ref().map(|jobs| jobs.send(job));
        if !matches!(sent, Some(Ok(()))) {
            return Err(std::io::Error::other("the bulk threads have stopped"));
        }
        match rx.await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(_)) => Err(std::io::Error::other("a bulk job panicked")),
            Err(_) => Err(std::io::Error::other("a bulk job was dropped")),
        }
    }
}

impl Drop for Bulk {
    fn drop(&mut self) {
        // Closing the channel ends the threads once their jobs are done.
        self.jobs.lock().take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_off_the_caller_at_lower_priority() {
        let bulk = Bulk::new(2).unwrap();
        let caller = std::thread::current().id();
        let (thread, name, idle, io_class) = bulk
            .run(|| {
                let t = std::thread::current();
                (
                    t.id(),
                    t.name().map(String::from),
                    crate::priority::this_thread_is_sched_idle(),
                    crate::priority::this_thread_io_class().ok(),
                )
            })
            .await
            .unwrap();
        assert_ne!(thread, caller);
        assert_eq!(name.as_deref(), Some("keel-bulk"));
        assert!(idle, "bulk threads are SCHED_IDLE");
        assert_eq!(io_class, Some(3), "bulk threads are in the idle I/O class");
        assert!(!crate::priority::this_thread_is_sched_idle());
        for i in 0..8 {
            assert_eq!(bulk.run(move || i * i).await.unwrap(), i * i);
        }
        assert!(bulk.run(|| panic!("boom")).await.is_err());
        assert_eq!(
            bulk.run(|| 7).await.unwrap(),
            7,
            "a panicking job does not take a thread down"
        );
    }
}
