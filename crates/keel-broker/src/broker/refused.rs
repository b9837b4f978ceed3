//! Requests for an API, or a version of one, that Keel does not serve.
//! The connection is closed, as Kafka closes it; the broker says so once per
//! client id and API, at info, so that an operator learns which client wants
//! what without a line per attempt (a client retries on every reconnect).

use std::collections::HashSet;

use keel_protocol::RequestFrame;
use parking_lot::Mutex;

/// Client ids are remembered up to this many bytes: a client chooses its
/// id, and the set must stay small whatever it sends.
const CLIENT_ID_MAX_BYTES: usize = 256;

/// At most this many (client id, API key) pairs are remembered; a full set
/// is emptied, so a broker facing endless new client ids logs a pair again
/// at most once per this many new pairs, in at most ~1.5 MiB.
const MAX_PAIRS: usize = 4096;

/// The (client id, API key) pairs already logged.
#[derive(Debug)]
pub struct RefusedApis {
    seen: Mutex<HashSet<(String, i16)>>,
    max_pairs: usize,
}

impl Default for RefusedApis {
    fn default() -> Self {
        RefusedApis::with_max_pairs(MAX_PAIRS)
    }
}

impl RefusedApis {
    fn with_max_pairs(max_pairs: usize) -> Self {
        RefusedApis {
            seen: Mutex::new(HashSet::new()),
            max_pairs,
        }
    }

    /// Whether `api_key` is refused to `client_id` for the first time (so
    /// the refusal is to be logged); remembers it.
    pub fn first(&self, client_id: &str, api_key: i16) -> bool {
        let mut cut = CLIENT_ID_MAX_BYTES.min(client_id.len());
        while !client_id.is_char_boundary(cut) {
            cut -= 1;
        }
        let pair = (client_id[..cut].to_string(), api_key);
        let mut seen = self.seen.lock();
        if seen.contains(&pair) {
            return false;
        }
        if seen.len() >= self.max_pairs {
            seen.clear();
        }
        seen.insert(pair);
        true
    }

    /// Logs the refusal of `frame` from `host` when it is the first of its
    /// API to its client id.
    pub fn log(&self, frame: &RequestFrame, host: &str) {
        let client_id = frame.client_id().unwrap_or_default();
        if !self.first(&client_id, frame.api_key) {
            return;
        }
        let (api, served) = match frame.known_api_key() {
            Some(key) => (
                format!("{key:?}"),
                keel_protocol::versions::support(key)
                    .map_or_else(|| "none".to_string(), |s| format!("{}-{}", s.min, s.max)),
            ),
            None => ("an API Kafka does not define".to_string(), "none".to_string()),
        };
        tracing::info!(
            client_id = %client_id,
            client_host = %host,
            api = %api,
            api_key = frame.api_key,
            api_version = frame.api_version,
            served_versions = %served,
            "refused a request Keel does not serve, closing the connection as Kafka does \
             (logged once per client id and API)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_identical_refusal_is_not_logged_again() {
        let refused = RefusedApis::default();
        assert!(refused.first("rdkafka", 7));
        assert!(!refused.first("rdkafka", 7));
        assert!(refused.first("rdkafka", 58), "another API");
        assert!(refused.first("other", 7), "another client");
        assert!(refused.first("", 7) && !refused.first("", 7), "no client id");
    }

    #[test]
    fn memory_stays_bounded() {
        let refused = RefusedApis::with_max_pairs(3);
        for i in 0..10 {
            assert!(refused.first(&format!("client-{i}"), 7));
            assert!(refused.seen.lock().len() <= 3);
        }
        // Long ids are remembered by their first bytes, on a char boundary.
        let long = "é".repeat(CLIENT_ID_MAX_BYTES);
        let refused = RefusedApis::default();
        assert!(refused.first(&long, 7));
        assert!(!refused.first(&format!("{long}-and-more"), 7));
        assert!(refused
            .seen
            .lock()
            .iter()
            .all(|(id, _)| id.len() <= CLIENT_ID_MAX_BYTES));
    }
}
