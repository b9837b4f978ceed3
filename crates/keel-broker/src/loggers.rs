//! Kafka's BROKER_LOGGER resource: the broker's loggers and their levels,
//! described with DescribeConfigs and changed at run time with
//! IncrementalAlterConfigs (`kafka-configs --entity-type broker-loggers`).
//! As in Kafka, changes last until the process stops.
//!
//! The process's log subscriber lives in the binary; the broker sees it
//! through [`Loggers`]. The checks on a change are Kafka's and live here.

use std::sync::Arc;

use keel_protocol::ResponseError;

use keel_config::ConfigChange;

/// Kafka's log levels (`LogLevelConfig.VALID_LOG_LEVELS`).
pub const LEVELS: [&str; 6] = ["FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"];

/// The root logger: every logger without a level of its own takes its.
pub const ROOT: &str = "root";

/// The process's loggers, as the subscriber holds them.
pub trait Loggers: Send + Sync {
    /// Every logger with a level of its own and the root, as
    /// (name, Kafka level).
    fn levels(&self) -> Vec<(String, String)>;
    /// Whether a logger of that name exists (can take a level).
    fn exists(&self, name: &str) -> bool;
    /// Sets levels (`Some`) and removes them (`None`), all at once. The
    /// changes have passed [`check`].
    fn apply(&self, changes: &[(String, Option<String>)]);
}

/// Levels to set (`Some`) or remove (`None`), by logger.
pub type LevelChanges = Vec<(String, Option<String>)>;

/// Checks `changes` to loggers as Kafka does (after the checks every
/// resource's changes pass: each key once, a value but for DELETE) and
/// returns them ready for [`Loggers::apply`].
pub fn check(
    loggers: &Arc<dyn Loggers>,
    changes: &[ConfigChange],
) -> Result<LevelChanges, (ResponseError, String)> {
    let mut out: LevelChanges = Vec::with_capacity(changes.len());
    for c in changes {
        if !loggers.exists(&c.name) {
            return Err((
                ResponseError::InvalidConfig,
                format!("Logger {} does not exist!", c.name),
            ));
        }
        match c.op {
            ConfigChange::SET => {
                let level = c.value.clone().unwrap_or_default();
                if !LEVELS.contains(&level.as_str()) {
                    return Err((
                        ResponseError::InvalidConfig,
                        format!(
                            "Cannot set the log level of {} to {level} as it is not a supported log \
                             level. Valid log levels are {}",
                            c.name,
                            LEVELS.join(", ")
                        ),
                    ));
                }
                out.push((c.name.clone(), Some(level)));
            }
            ConfigChange::DELETE if c.name == ROOT => {
                return Err((
                    ResponseError::InvalidRequest,
                    "Removing the log level of the root logger is not allowed".into(),
                ))
            }
            ConfigChange::DELETE => out.push((c.name.clone(), None)),
            ConfigChange::APPEND | ConfigChange::SUBTRACT => {
                let op = if c.op == ConfigChange::APPEND {
                    "APPEND"
                } else {
                    "SUBTRACT"
                };
                return Err((
                    ResponseError::InvalidRequest,
                    format!("{op} operation is not allowed for the BROKER_LOGGER resource"),
                ));
            }
            other => {
                return Err((
                    ResponseError::InvalidRequest,
                    format!("unknown config operation {other} for {}", c.name),
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;

    impl Loggers for Fixed {
        fn levels(&self) -> Vec<(String, String)> {
            vec![(ROOT.into(), "INFO".into())]
        }
        fn exists(&self, name: &str) -> bool {
            name == ROOT || name.starts_with("keel")
        }
        fn apply(&self, _: &[(String, Option<String>)]) {}
    }

    fn change(logger: &str, op: i8, level: Option<&str>) -> ConfigChange {
        ConfigChange {
            name: logger.into(),
            op,
            value: level.map(str::to_string),
        }
    }

    #[test]
    fn changes_are_checked_as_kafka_checks_them() {
        let l: Arc<dyn Loggers> = Arc::new(Fixed);
        assert_eq!(
            check(
                &l,
                &[
                    change("keel_broker", 0, Some("DEBUG")),
                    change("keel_log", 1, None)
                ]
            ),
            Ok(vec![
                ("keel_broker".into(), Some("DEBUG".into())),
                ("keel_log".into(), None)
            ])
        );
        let code = |r: Result<_, (ResponseError, String)>| r.unwrap_err().0;
        assert_eq!(
            code(check(&l, &[change("kafka.server", 0, Some("DEBUG"))])),
            ResponseError::InvalidConfig
        );
        assert_eq!(
            code(check(&l, &[change("keel_broker", 0, Some("debug"))])),
            ResponseError::InvalidConfig
        );
        assert_eq!(
            code(check(&l, &[change("keel_broker", 0, None)])),
            ResponseError::InvalidConfig
        );
        assert_eq!(
            code(check(&l, &[change(ROOT, 1, None)])),
            ResponseError::InvalidRequest
        );
        assert_eq!(
            code(check(&l, &[change("keel", 2, Some("INFO"))])),
            ResponseError::InvalidRequest
        );
    }
}
