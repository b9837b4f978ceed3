//! Who reads a partition, and where. Every read names its reader (a fetch
//! its client id, address and the port of its connection), and the
//! partition keeps the position each recent reader read at: what `/stats`
//! shows operators, and what lets the data plane tell one reader's scan
//! from another's. Two consumers with the same client id on one host (a
//! client library's default id) are two readers.

use std::sync::Arc;

use parking_lot::Mutex;

/// The readers a partition keeps at the most; the one seen least recently
/// gives way.
pub const MAX_READERS: usize = 64;

/// A reader of partitions: a client connection by its client id, its
/// address (Kafka's form, `/` and the IP: what group members are known
/// by) and its port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reader {
    pub client_id: Arc<str>,
    pub address: Arc<str>,
    pub port: u16,
}

impl Reader {
    pub fn new(client_id: &str, address: &str, port: u16) -> Reader {
        Reader {
            client_id: Arc::from(client_id),
            address: Arc::from(address),
            port,
        }
    }
}

/// Where a reader last read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderPosition {
    pub reader: Reader,
    /// The offset its last read started at.
    pub offset: i64,
    /// When (ms since the epoch).
    pub at_ms: i64,
}

/// A partition's recent readers.
#[derive(Debug, Default)]
pub struct Readers {
    seen: Mutex<Vec<ReaderPosition>>,
}

impl Readers {
    /// Notes that `reader` read from `offset` at `now_ms`.
    pub fn note(&self, reader: &Reader, offset: i64, now_ms: i64) {
        let mut seen = self.seen.lock();
        if let Some(p) = seen.iter_mut().find(|p| p.reader == *reader) {
            p.offset = offset;
            p.at_ms = now_ms;
            return;
        }
        let position = ReaderPosition {
            reader: reader.clone(),
            offset,
            at_ms: now_ms,
        };
        if seen.len() < MAX_READERS {
            seen.push(position);
        } else if let Some(oldest) = seen.iter_mut().min_by_key(|p| p.at_ms) {
            *oldest = position;
        }
    }

    /// The readers seen, least recently first.
    pub fn positions(&self) -> Vec<ReaderPosition> {
        let mut seen = self.seen.lock().clone();
        seen.sort_by_key(|p| p.at_ms);
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reader_keeps_its_last_position_and_the_oldest_gives_way() {
        let readers = Readers::default();
        let (a, b) = (
            Reader::new("loader", "/10.0.0.1", 40001),
            Reader::new("indexer", "/10.0.0.2", 40001),
        );
        readers.note(&a, 0, 1);
        readers.note(&b, 500, 2);
        readers.note(&a, 100, 3);
        let seen = readers.positions();
        assert_eq!(
            seen.iter()
                .map(|p| (&*p.reader.client_id, p.offset, p.at_ms))
                .collect::<Vec<_>>(),
            [("indexer", 500, 2), ("loader", 100, 3)]
        );
        // The same client id from another address is another reader, and
        // so is one from another connection of the same host.
        readers.note(&Reader::new("loader", "/10.0.0.3", 40001), 7, 4);
        readers.note(&Reader::new("loader", "/10.0.0.1", 40002), 9, 5);
        assert_eq!(readers.positions().len(), 4);
        for i in 0..MAX_READERS {
            readers.note(&Reader::new(&format!("c{i}"), "/h", 1), i as i64, 10 + i as i64);
        }
        let seen = readers.positions();
        assert_eq!(seen.len(), MAX_READERS);
        assert!(
            seen.iter().all(|p| !p.reader.client_id.starts_with("loader")),
            "the oldest gave way"
        );
    }
}
