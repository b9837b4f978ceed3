//! The log subscriber's levels, changeable while the broker runs: Kafka's
//! BROKER_LOGGER resource (`keel_broker::loggers`). A logger is a tracing
//! target of Keel's: a crate (`keel_broker`) or a module path under one
//! (`keel_broker::handlers::produce`); `root` is the level of everything
//! else. `KEEL_LOG` gives the levels at start-up.
//!
//! DescribeConfigs lists the root, Keel's crates and every module that has
//! logged (or tried to, at a level filtered out) since start-up, each with
//! its effective level; `kafka-configs` only lets an operator change the
//! loggers listed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use keel_broker::loggers::{Loggers, ROOT};
use parking_lot::Mutex;
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::layer::Layer;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// The crates whose targets are Keel's loggers.
const CRATES: &[&str] = &["keel", "keel_broker", "keel_log", "keel_tier", "keel_protocol"];

static INSTALLED: OnceLock<Arc<Levels>> = OnceLock::new();

/// The levels the subscriber filters by, and the handle to change them.
pub struct Levels {
    handle: reload::Handle<EnvFilter, Registry>,
    state: Mutex<State>,
    /// Keel's targets seen at a callsite so far.
    seen: Mutex<BTreeSet<String>>,
}

/// Records the targets of Keel's callsites as they register (each on its
/// first use), for [`Loggers::levels`]. Filters nothing.
pub struct Targets;

impl<S: Subscriber> Layer<S> for Targets {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        let target = metadata.target();
        if is_keel(target) {
            if let Some(levels) = INSTALLED.get() {
                levels.seen.lock().insert(target.to_string());
            }
        }
        Interest::always()
    }
}

fn is_keel(target: &str) -> bool {
    CRATES
        .iter()
        .any(|c| target == *c || target.strip_prefix(c).is_some_and(|rest| rest.starts_with("::")))
}

struct State {
    /// The root level, as tracing writes it (`info`).
    root: String,
    /// Loggers with a level of their own: target -> tracing level.
    own: BTreeMap<String, String>,
    /// `KEEL_LOG` directives that are not a plain `target=level` (span or
    /// field filters): kept as they are.
    other: Vec<String>,
}

impl State {
    fn parse(directives: &str) -> State {
        let mut state = State {
            root: "info".into(),
            own: BTreeMap::new(),
            other: Vec::new(),
        };
        for d in directives.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            match d.split_once('=') {
                None if is_level(d) => state.root = d.to_ascii_lowercase(),
                Some((target, level)) if is_target(target) && is_level(level) => {
                    state.own.insert(target.to_string(), level.to_ascii_lowercase());
                }
                _ => state.other.push(d.to_string()),
            }
        }
        state
    }

    fn directives(&self) -> String {
        let mut all = vec![self.root.clone()];
        all.extend(self.other.iter().cloned());
        all.extend(self.own.iter().map(|(t, l)| format!("{t}={l}")));
        all.join(",")
    }
}

fn is_level(s: &str) -> bool {
    matches!(
        s.to_ascii_lowercase().as_str(),
        "off" | "error" | "warn" | "info" | "debug" | "trace"
    )
}

fn is_target(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// A target's level: that of its own or its nearest parent's, else root's.
fn effective<'a>(state: &'a State, target: &str) -> &'a str {
    let mut at = target;
    loop {
        if let Some(level) = state.own.get(at) {
            return level;
        }
        match at.rfind("::") {
            Some(i) => at = &at[..i],
            None => return &state.root,
        }
    }
}

/// Kafka's level for a tracing level.
fn kafka_level(tracing: &str) -> String {
    match tracing {
        "off" => "OFF".into(),
        other => other.to_ascii_uppercase(),
    }
}

/// tracing's level for one of Kafka's (`FATAL` has no tracing level of
/// its own: `error`).
fn tracing_level(kafka: &str) -> String {
    match kafka {
        "FATAL" => "error".into(),
        other => other.to_ascii_lowercase(),
    }
}

/// The filter for `KEEL_LOG` (or `info`), with the handle that changes it;
/// the handle is kept for [`installed`].
pub fn filter() -> reload::Layer<EnvFilter, Registry> {
    let directives = std::env::var("KEEL_LOG").unwrap_or_else(|_| "info".into());
    let (filter, state) = match EnvFilter::try_new(&directives) {
        Ok(filter) => (filter, State::parse(&directives)),
        Err(e) => {
            eprintln!("keel: KEEL_LOG={directives:?} is not a log filter ({e}); using info");
            (EnvFilter::new("info"), State::parse("info"))
        }
    };
    let (layer, handle) = reload::Layer::new(filter);
    let _ = INSTALLED.set(Arc::new(Levels {
        handle,
        state: Mutex::new(state),
        seen: Mutex::new(CRATES.iter().map(|c| c.to_string()).collect()),
    }));
    layer
}

/// The levels of the subscriber [`filter`] made, if it was made.
pub fn installed() -> Option<Arc<Levels>> {
    INSTALLED.get().cloned()
}

impl Loggers for Levels {
    fn levels(&self) -> Vec<(String, String)> {
        let state = self.state.lock();
        let mut names: BTreeSet<String> = self.seen.lock().clone();
        names.extend(state.own.keys().cloned());
        std::iter::once((ROOT.to_string(), kafka_level(&state.root)))
            .chain(names.into_iter().map(|t| {
                let level = effective(&state, &t);
                (t, kafka_level(level))
            }))
            .collect()
    }

    fn exists(&self, name: &str) -> bool {
        name == ROOT || (is_keel(name) && is_target(name))
    }

    fn apply(&self, changes: &[(String, Option<String>)]) {
        let mut state = self.state.lock();
        for (logger, level) in changes {
            match (logger.as_str(), level) {
                (ROOT, Some(level)) => state.root = tracing_level(level),
                (_, Some(level)) => {
                    state.own.insert(logger.clone(), tracing_level(level));
                }
                (_, None) => {
                    state.own.remove(logger);
                }
            }
        }
        let directives = state.directives();
        match EnvFilter::try_new(&directives) {
            Ok(filter) => {
                if let Err(e) = self.handle.reload(filter) {
                    tracing::warn!(error = %e, "cannot change the log levels");
                }
            }
            Err(e) => tracing::warn!(%directives, error = %e, "cannot change the log levels"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keel_log_directives_become_loggers_and_back() {
        let s = State::parse("warn,keel_broker=debug,keel_log::seal=TRACE,[span]=info");
        assert_eq!(s.root, "warn");
        assert_eq!(
            s.own
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect::<Vec<_>>(),
            [("keel_broker", "debug"), ("keel_log::seal", "trace")]
        );
        assert_eq!(s.other, ["[span]=info"]);
        assert_eq!(
            s.directives(),
            "warn,[span]=info,keel_broker=debug,keel_log::seal=trace"
        );
        assert!(EnvFilter::try_new(s.directives()).is_ok());
        assert_eq!(
            (kafka_level("debug"), tracing_level("FATAL")),
            ("DEBUG".into(), "error".into())
        );
        assert_eq!(effective(&s, "keel_broker::handlers::produce"), "debug");
        assert_eq!(effective(&s, "keel_log::seal"), "trace");
        assert_eq!(effective(&s, "keel_log::partition"), "warn");
        assert!(is_keel("keel_log::seal") && is_keel("keel") && !is_keel("keelhaul") && !is_keel("hyper"));
    }
}
