//! `keel serve` configuration: Kafka-named keys from, in rising precedence,
//! built-in defaults, a TOML file, `KEEL_*` environment variables and flags.

use std::collections::BTreeMap;
use std::path::PathBuf;

use keel_config::known_keys;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// TOML file with configuration keys (`"log.segment.bytes" = 1048576`
    /// or nested tables: `[log] segment.bytes = ...`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on (key `listen`).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// Directory holding all partition data (key `log.dirs`).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<String>,
    /// Address clients are told to connect to (key `advertised`); defaults
    /// to the listen address.
    #[arg(long, value_name = "HOST:PORT")]
    pub advertised: Option<String>,
    /// Any configuration key, e.g. `--set log.segment.bytes=1048576`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// Merges file, environment and flags into one key/value map.
pub fn gather(args: &ServeArgs) -> Result<BTreeMap<String, String>, String> {
    let mut map = BTreeMap::new();
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let table: toml::Table = text.parse().map_err(|e| format!("{}: {e}", path.display()))?;
        flatten("", &table, &mut map).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    for key in known_keys() {
        let var = format!("KEEL_{}", key.to_ascii_uppercase().replace('.', "_"));
        if let Ok(value) = std::env::var(&var) {
            map.insert(key.to_string(), value);
        }
    }
    let flags = [
        ("listen", &args.listen),
        ("log.dirs", &args.data_dir),
        ("advertised", &args.advertised),
    ];
    for (key, value) in flags {
        if let Some(v) = value {
            map.insert(key.to_string(), v.clone());
        }
    }
    for kv in &args.set {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--set `{kv}`: expected KEY=VALUE"))?;
        map.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(map)
}

fn flatten(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, String>) -> Result<(), String> {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        let value = match v {
            toml::Value::Table(t) => {
                flatten(&key, t, out)?;
                continue;
            }
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Array(items) => items
                .iter()
                .map(|i| match i {
                    toml::Value::String(s) => Ok(s.clone()),
                    other => Err(format!("`{key}`: list items must be strings, found {other:?}")),
                })
                .collect::<Result<Vec<_>, _>>()?
                .join(","),
            toml::Value::Datetime(d) => d.to_string(),
        };
        out.insert(key, value);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_tables_flatten_to_dotted_keys() {
        let table: toml::Table =
            "listen = \"0.0.0.0:1\"\n[log]\nsegment.bytes = 4096\n\"retention.ms\" = 5\n"
                .parse()
                .unwrap();
        let mut out = BTreeMap::new();
        flatten("", &table, &mut out).unwrap();
        assert_eq!(out["listen"], "0.0.0.0:1");
        assert_eq!(out["log.segment.bytes"], "4096");
        assert_eq!(out["log.retention.ms"], "5");
    }
}
