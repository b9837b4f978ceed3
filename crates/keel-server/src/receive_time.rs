//! How long a request's bytes waited in the socket's receive queue before a
//! request thread read them.
//!
//! A plaintext connection's socket has the kernel's receive timestamps on
//! (`SO_TIMESTAMPNS`): each `recvmsg` reports when the kernel received the
//! newest data it returned. A read's wait is the time from that receipt to
//! the read, and it becomes the `socket` stage of the request the read
//! completed: time at the broker that the stages after it cannot see (a
//! request thread not yet scheduled, or busy with other connections). TLS
//! connections read through rustls and are not timed this way.
//!
//! The timestamps are wall-clock time, which can step. A wait is bounded
//! with the monotonic clock (the data cannot have waited since before the
//! queue was last found empty, nor since before the caller began wanting
//! to read), and a read after the wall clock moved differently from the
//! monotonic one since the queue was last empty reports no wait.

use std::cell::RefCell;
use std::io;
use std::io::IoSliceMut;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant, SystemTime};

use bytes::BytesMut;
use nix::sys::socket::{recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags};
use nix::sys::time::TimeSpec;
use tokio::io::Interest;
use tokio::net::tcp::OwnedReadHalf;

/// The most one read takes. `recvmsg` needs initialised memory, so bytes
/// are read into a zeroed buffer per thread and copied out: a read costs
/// what it returns, whatever size of frame the client announced.
pub const MAX_READ_BYTES: usize = 256 << 10;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0; MAX_READ_BYTES]);
}

/// The read half of a plaintext connection, read with `recvmsg` so each
/// read says how long its data waited.
#[derive(Debug)]
pub struct StampedRead {
    half: OwnedReadHalf,
    /// Whether the kernel took `SO_TIMESTAMPNS`.
    stamped: bool,
    /// Room for one `SCM_TIMESTAMPNS` control message.
    control: Vec<u8>,
    /// When a read last left the receive queue empty (it returned less
    /// than it asked for), or when the connection was taken; on both
    /// clocks.
    drained_at: Instant,
    drained_wall: SystemTime,
}

impl StampedRead {
    /// Turns the kernel's receive timestamps on for the half's socket. Where
    /// they are refused the connection reads as before, with no waits.
    pub fn new(half: OwnedReadHalf) -> StampedRead {
        let stamped = setsockopt(half.as_ref(), sockopt::ReceiveTimestampns, &true).is_ok();
        StampedRead {
            half,
            stamped,
            control: nix::cmsg_space!(TimeSpec),
            drained_at: Instant::now(),
            drained_wall: SystemTime::now(),
        }
    }

    /// Appends at least one byte (none at the end of the stream) to `buf`,
    /// at most `want` (and [`MAX_READ_BYTES`]), and says how long the
    /// newest of them waited in the socket's receive queue, counted from
    /// `wanted_since` at the earliest, when the kernel stamped them.
    /// Cancel-safe: nothing is read unless it returns.
    pub async fn read(
        &mut self,
        buf: &mut BytesMut,
        want: usize,
        wanted_since: Instant,
    ) -> io::Result<(usize, Option<Duration>)> {
        let want = want.clamp(1, MAX_READ_BYTES);
        loop {
            self.half.as_ref().readable().await?;
            let stream = self.half.as_ref();
            let fd = stream.as_raw_fd();
            let control = &mut self.control;
            let got = stream.try_io(Interest::READABLE, || {
                SCRATCH.with_borrow_mut(|scratch| {
                    let (n, received) = recv_stamped(fd, &mut scratch[..want], control)?;
                    buf.extend_from_slice(&scratch[..n]);
                    Ok((n, received))
                })
            });
            match got {
                Ok((n, received)) => {
                    let (now, wall) = (Instant::now(), SystemTime::now());
                    let floor = self.drained_at.max(wanted_since);
                    let waited = received
                        .filter(|_| self.stamped && n > 0 && self.clocks_agree(now, wall))
                        .and_then(|ts| wall.duration_since(ts).ok())
                        .map(|w| w.min(now.saturating_duration_since(floor)));
                    if n < want {
                        (self.drained_at, self.drained_wall) = (now, wall);
                    }
                    return Ok((n, waited));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether the wall clock moved as the monotonic one did since the
    /// queue was last empty (within 1 ms and 0.1 %): the bytes read now
    /// arrived since then, so their stamps are comparable with `wall`.
    fn clocks_agree(&self, now: Instant, wall: SystemTime) -> bool {
        let mono = now.saturating_duration_since(self.drained_at);
        let Ok(walled) = wall.duration_since(self.drained_wall) else {
            return false;
        };
        mono.abs_diff(walled) <= Duration::from_millis(1) + mono / 1000
    }
}

/// One `recvmsg` into `into`: the bytes read, and when the kernel received
/// the newest of them.
fn recv_stamped(fd: i32, into: &mut [u8], control: &mut [u8]) -> io::Result<(usize, Option<SystemTime>)> {
    let mut iov = [IoSliceMut::new(into)];
    let msg = recvmsg::<()>(fd, &mut iov, Some(control), MsgFlags::MSG_DONTWAIT).map_err(io::Error::from)?;
    let received = msg.cmsgs().ok().and_then(|mut cmsgs| {
        cmsgs.find_map(|c| match c {
            ControlMessageOwned::ScmTimestampns(ts) => system_time(ts),
            _ => None,
        })
    });
    Ok((msg.bytes, received))
}

/// A `CLOCK_REALTIME` timestamp as a `SystemTime` (none before the epoch).
fn system_time(ts: TimeSpec) -> Option<SystemTime> {
    let since_epoch = Duration::new(
        u64::try_from(ts.tv_sec()).ok()?,
        u32::try_from(ts.tv_nsec()).ok()?,
    );
    SystemTime::UNIX_EPOCH.checked_add(since_epoch)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    /// Writes and reads a byte until a read is stamped: the kernel turns
    /// receive stamping on (a static key) shortly after the first socket
    /// asks, so a fresh process's first reads may not be.
    pub(crate) async fn until_stamped(client: &mut TcpStream, read: &mut StampedRead) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            client.write_all(b"w").await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
            let mut buf = BytesMut::new();
            let (n, waited) = read.read(&mut buf, 1, Instant::now()).await.unwrap();
            assert_eq!(n, 1);
            if waited.is_some() {
                return;
            }
        }
        panic!("no read of a plaintext socket was stamped");
    }

    pub(crate) async fn connected() -> (TcpStream, StampedRead) {
        // Dropping the write half shuts down only the server's sending side.
        let (mut client, read, _) = crate::connection::tests::connected().await;
        let mut read = StampedRead::new(read);
        assert!(read.stamped, "Linux takes SO_TIMESTAMPNS on a TCP socket");
        until_stamped(&mut client, &mut read).await;
        (client, read)
    }

    #[tokio::test]
    async fn a_read_says_how_long_its_bytes_waited_in_the_socket() {
        let (mut client, mut read) = connected().await;
        let long_ago = Instant::now() - Duration::from_secs(1);

        // The bytes sit in the receive queue while nothing reads them.
        client.write_all(b"first").await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        let mut buf = BytesMut::from(&b"kept"[..]);
        let (n, waited) = read.read(&mut buf, 64, long_ago).await.unwrap();
        assert_eq!(n, 5);
        assert_eq!(&buf[..], b"keptfirst", "appended");
        let waited = waited.expect("stamped");
        assert!(waited >= Duration::from_millis(60), "{waited:?}");

        // Bytes that arrived before the caller wanted them count only from
        // when it did (a muted connection, a full pipeline).
        client.write_all(b"late").await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        let wanted_since = Instant::now();
        let mut buf = BytesMut::new();
        let (n, waited) = read.read(&mut buf, 64, wanted_since).await.unwrap();
        assert_eq!(n, 4);
        assert!(waited.expect("stamped") <= wanted_since.elapsed());

        // Only `want` bytes are taken; the rest stays for the next read.
        client.write_all(b"0123456789").await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let mut buf = BytesMut::new();
        assert_eq!(read.read(&mut buf, 4, long_ago).await.unwrap().0, 4);
        assert_eq!(read.read(&mut buf, 64, long_ago).await.unwrap().0, 6);
        assert_eq!(&buf[..], b"0123456789");

        // A frame announced as 100 MB takes at most MAX_READ_BYTES a read,
        // and the buffer grows by what was read, not by what was announced.
        let writing = tokio::spawn(async move {
            client.write_all(&vec![7; MAX_READ_BYTES + 1000]).await.unwrap();
            client
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let mut buf = BytesMut::new();
        let (n, _) = read.read(&mut buf, 100 << 20, long_ago).await.unwrap();
        assert!(n <= MAX_READ_BYTES && buf.len() == n, "{n}");
        assert!(buf.capacity() < 2 * MAX_READ_BYTES, "{}", buf.capacity());
        while buf.len() < MAX_READ_BYTES + 1000 {
            read.read(&mut buf, 100 << 20, long_ago).await.unwrap();
        }
        assert!(buf.iter().all(|b| *b == 7));
        drop(writing.await.unwrap());

        // The end of the stream: 0 bytes, no wait.
        let mut buf = BytesMut::new();
        assert_eq!(read.read(&mut buf, 64, long_ago).await.unwrap(), (0, None));
        assert!(buf.is_empty());
    }

    #[tokio::test]
    async fn a_wall_clock_step_since_the_queue_was_empty_reports_no_wait() {
        let (_client, read) = connected().await;
        let (now, wall) = (read.drained_at, read.drained_wall);
        assert!(read.clocks_agree(now, wall));
        let later = now + Duration::from_secs(10);
        assert!(read.clocks_agree(later, wall + Duration::from_secs(10)));
        assert!(
            read.clocks_agree(later, wall + Duration::from_millis(10_010)),
            "0.1 % drift"
        );
        assert!(
            !read.clocks_agree(later, wall + Duration::from_secs(70)),
            "stepped forward"
        );
        assert!(!read.clocks_agree(later, wall), "stepped back");
    }
}
