//! Kafka's JAAS config lines (`sasl.jaas.config`):
//! `<LoginModule class> <flag> key="value" key=value ... ;`.
//! A broker's PLAIN users are its `user_<name>="<password>"` options.

use std::collections::BTreeMap;

/// One login module's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JaasEntry {
    pub module: String,
    pub flag: String,
    pub options: BTreeMap<String, String>,
}

/// The module class PLAIN's users are given under.
pub const PLAIN_LOGIN_MODULE: &str = "org.apache.kafka.common.security.plain.PlainLoginModule";

const FLAGS: [&str; 4] = ["required", "requisite", "sufficient", "optional"];

/// Parses a `sasl.jaas.config` value, which holds exactly one entry as in
/// Kafka. Errors name what is wrong, never a value (values are passwords).
pub fn parse(text: &str) -> Result<JaasEntry, String> {
    let tokens = tokenize(text)?;
    let mut it = tokens.into_iter().peekable();
    let module = match it.next() {
        Some(Token::Word(w)) => w,
        _ => return Err("a JAAS config starts with a login module class name".into()),
    };
    let flag = match it.next() {
        Some(Token::Word(w)) if FLAGS.contains(&w.to_ascii_lowercase().as_str()) => w.to_ascii_lowercase(),
        _ => {
            return Err(format!(
                "the login module {module} needs a control flag: required, requisite, sufficient or optional"
            ))
        }
    };
    let mut options = BTreeMap::new();
    loop {
        match it.next() {
            Some(Token::Semicolon) => break,
            Some(Token::Word(key)) => {
                if it.next() != Some(Token::Equals) {
                    return Err(format!("JAAS option {key} has no `=`"));
                }
                let value = match it.next() {
                    Some(Token::Word(v)) | Some(Token::Quoted(v)) => v,
                    _ => return Err(format!("JAAS option {key} has no value")),
                };
                options.insert(key, value);
            }
            None => return Err("a JAAS config entry ends with `;`".into()),
            Some(_) => return Err("a JAAS option is key=value".into()),
        }
    }
    if it.next().is_some() {
        return Err("sasl.jaas.config holds exactly one login module".into());
    }
    Ok(JaasEntry {
        module,
        flag,
        options,
    })
}

impl JaasEntry {
    /// PLAIN's users: the `user_<name>` options.
    pub fn plain_users(&self) -> BTreeMap<String, String> {
        self.options
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("user_")?.to_string(), v.clone())))
            .filter(|(name, _)| !name.is_empty())
            .collect()
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    Quoted(String),
    Equals,
    Semicolon,
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '=' => {
                chars.next();
                out.push(Token::Equals);
            }
            ';' => {
                chars.next();
                out.push(Token::Semicolon);
            }
            '"' => {
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(e) => s.push(e),
                            None => return Err("a JAAS value ends inside an escape".into()),
                        },
                        Some(ch) => s.push(ch),
                        None => return Err("a quoted JAAS value is not closed".into()),
                    }
                }
                out.push(Token::Quoted(s));
            }
            _ => {
                let mut s = String::new();
                while let Some(&ch) = chars.peek() {
                    if ch.is_whitespace() || ch == '=' || ch == ';' || ch == '"' {
                        break;
                    }
                    s.push(ch);
                    chars.next();
                }
                out.push(Token::Word(s));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kafkas_plain_example() {
        let e = parse(
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required
               username="admin" password="admin-secret"
               user_admin="admin-secret" user_alice="al\"ice;=" unquoted=x;"#,
        )
        .unwrap();
        assert_eq!(e.module, PLAIN_LOGIN_MODULE);
        assert_eq!(e.flag, "required");
        assert_eq!(e.options["unquoted"], "x");
        let users = e.plain_users();
        assert_eq!(users.len(), 2);
        assert_eq!(users["alice"], "al\"ice;=");
    }

    #[test]
    fn refuses_malformed_entries_without_echoing_values() {
        for bad in [
            "",
            "Module;",
            "Module bogus;",
            "Module required user_a=\"secret\"",
            "Module required user_a=;",
            "Module required user_a \"secret\";",
            "Module required user_a=\"secret;",
            "Module required; Other required;",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(!e.contains("secret"), "{bad}: {e}");
        }
    }
}
