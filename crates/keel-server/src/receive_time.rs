//! How long a request's bytes waited in the socket's receive queue before a
//! request thread read them.
//!
//! A plaintext connection's socket has the kernel's receive timestamps on
//! (`SO_TIMESTAMPNS`): each `recvmsg` reports when the kernel received the
//! newest data it returned. A read's wait is then the time from that receipt
//! to the read, and it becomes the `socket` stage of the request the read
//! completed: time at the broker that the stages after it cannot see (a
//! request thread not yet scheduled, or busy with other connections). TLS
//! connections read through rustls and are not timed this way.

use std::io;
use std::io::IoSliceMut;
use std::os::fd::AsRawFd;
use std::time::{Duration, SystemTime};

use bytes::BytesMut;
use nix::sys::socket::{recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags};
use nix::sys::time::TimeSpec;
use tokio::io::Interest;
use tokio::net::tcp::OwnedReadHalf;

/// The read half of a plaintext connection, read with `recvmsg` so each
/// read says how long its data waited.
#[derive(Debug)]
pub struct StampedRead {
    half: OwnedReadHalf,
    /// Whether the kernel took `SO_TIMESTAMPNS`.
    stamped: bool,
    /// Room for one `SCM_TIMESTAMPNS` control message.
    control: Vec<u8>,
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
        }
    }

    /// Reads at least one byte (or the end of the stream, 0) into `buf`,
    /// at most `want`, and how long the newest of them waited in the
    /// socket's receive queue, when the kernel says. Cancel-safe: nothing
    /// is read unless it returns.
    pub async fn read(&mut self, buf: &mut BytesMut, want: usize) -> io::Result<(usize, Option<Duration>)> {
        let start = buf.len();
        loop {
            self.half.as_ref().readable().await?;
            // Zeroed, because recvmsg takes initialised memory: the caller
            // asks for what the frame still needs, so this costs about as
            // much as the bytes read.
            buf.resize(start + want.max(1), 0);
            let stream = self.half.as_ref();
            let fd = stream.as_raw_fd();
            let control = &mut self.control;
            let got = stream.try_io(Interest::READABLE, || {
                let mut iov = [IoSliceMut::new(&mut buf[start..])];
                let msg = recvmsg::<()>(fd, &mut iov, Some(control.as_mut_slice()), MsgFlags::MSG_DONTWAIT)
                    .map_err(io::Error::from)?;
                let received = msg.cmsgs().ok().and_then(|mut cmsgs| {
                    cmsgs.find_map(|c| match c {
                        ControlMessageOwned::ScmTimestampns(ts) => Some(ts),
                        _ => None,
                    })
                });
                Ok((msg.bytes, received))
            });
            match got {
                Ok((n, received)) => {
                    buf.truncate(start + n);
                    let waited = received
                        .filter(|_| self.stamped && n > 0)
                        .and_then(|ts| SystemTime::now().duration_since(system_time(ts)).ok());
                    return Ok((n, waited));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    buf.truncate(start);
                }
                Err(e) => {
                    buf.truncate(start);
                    return Err(e);
                }
            }
        }
    }
}

/// A `CLOCK_REALTIME` timestamp as a `SystemTime`.
fn system_time(ts: TimeSpec) -> SystemTime {
    let since_epoch = Duration::new(
        u64::try_from(ts.tv_sec()).unwrap_or(0),
        u32::try_from(ts.tv_nsec()).unwrap_or(0),
    );
    SystemTime::UNIX_EPOCH + since_epoch
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    #[tokio::test]
    async fn a_read_says_how_long_its_bytes_waited_in_the_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (read, _write) = server.into_split();
        let mut read = StampedRead::new(read);
        assert!(read.stamped, "Linux takes SO_TIMESTAMPNS on a TCP socket");

        // The bytes sit in the receive queue while nothing reads them. The
        // kernel turns stamping on (a static key) shortly after the first
        // socket asks, so a fresh process's first reads may be unstamped.
        let mut stamped = None;
        for _ in 0..50 {
            client.write_all(b"first").await.unwrap();
            tokio::time::sleep(Duration::from_millis(60)).await;
            let mut buf = BytesMut::from(&b"kept"[..]);
            let (n, waited) = read.read(&mut buf, 64).await.unwrap();
            assert_eq!(n, 5);
            assert_eq!(&buf[..], b"keptfirst", "appended, nothing zeroed left behind");
            stamped = waited;
            if stamped.is_some() {
                break;
            }
        }
        let waited = stamped.expect("the kernel stamps a plaintext socket's data");
        assert!(waited >= Duration::from_millis(60), "{waited:?}");

        // Read as soon as it lands: a wait shorter than the one above.
        let reading = tokio::spawn(async move {
            let mut buf = BytesMut::new();
            let got = read.read(&mut buf, 64).await.unwrap();
            (got, buf, read)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        client.write_all(b"second").await.unwrap();
        let ((n, waited), buf, mut read) = reading.await.unwrap();
        assert_eq!((n, &buf[..]), (6, &b"second"[..]));
        assert!(waited.expect("stamped") < Duration::from_millis(60));

        // Only `want` bytes are taken; the rest stays for the next read.
        client.write_all(b"0123456789").await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let mut buf = BytesMut::new();
        assert_eq!(read.read(&mut buf, 4).await.unwrap().0, 4);
        assert_eq!(read.read(&mut buf, 64).await.unwrap().0, 6);
        assert_eq!(&buf[..], b"0123456789");

        // The end of the stream: 0 bytes, no wait.
        drop(client);
        let mut buf = BytesMut::new();
        assert_eq!(read.read(&mut buf, 64).await.unwrap(), (0, None));
        assert!(buf.is_empty());
    }
}
