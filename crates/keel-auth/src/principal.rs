//! Who a TLS client is: Kafka's `ssl.principal.mapping.rules` turn a
//! client certificate's distinguished name into a user.

use crate::SettingError;

/// One of Kafka's `ssl.principal.mapping.rules`.
#[derive(Debug, Clone)]
enum Rule {
    /// The certificate's distinguished name as it is.
    Default,
    /// `RULE:pattern/replacement/[LU]`: when the pattern matches the
    /// whole name, the replacement, lower- or upper-cased.
    Rule {
        pattern: regex::Regex,
        replacement: String,
        case: Option<char>,
    },
}

/// Kafka's `SslPrincipalMapper`: the first rule whose pattern matches a
/// client certificate's distinguished name (RFC 2253) gives the user;
/// none matching refuses the client.
#[derive(Debug, Clone)]
pub struct PrincipalMapper {
    rules: Vec<Rule>,
}

/// Reads up to an unescaped `/`: -> (the text with `\/` unescaped, the
/// rest after the `/`).
fn until_slash(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' if s[i + 1..].starts_with('/') => {
                out.push('/');
                chars.next();
            }
            '/' => return Some((out, &s[i + 1..])),
            c => out.push(c),
        }
    }
    None
}

impl PrincipalMapper {
    pub fn parse(rules: &str) -> Result<PrincipalMapper, SettingError> {
        let key = "ssl.principal.mapping.rules";
        let bad = |why: String| SettingError::new(key, why);
        let mut out = Vec::new();
        let mut rest = rules.trim();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("DEFAULT") {
                out.push(Rule::Default);
                rest = after;
            } else if let Some(after) = rest.strip_prefix("RULE:") {
                let (pattern, after) = until_slash(after)
                    .ok_or_else(|| bad(format!("`{rest}`: expected RULE:pattern/replacement/")))?;
                let (replacement, after) = until_slash(after)
                    .ok_or_else(|| bad(format!("`{rest}`: expected RULE:pattern/replacement/")))?;
                let (case, after) = match after.chars().next() {
                    Some(c @ ('L' | 'U')) => (Some(c), &after[1..]),
                    _ => (None, after),
                };
                let pattern = regex::Regex::new(&format!("^(?:{pattern})$"))
                    .map_err(|e| bad(format!("`{pattern}`: {e}")))?;
                out.push(Rule::Rule {
                    pattern,
                    replacement,
                    case,
                });
                rest = after;
            } else {
                return Err(bad(format!(
                    "`{rest}`: a rule is DEFAULT or RULE:pattern/replacement/[LU]"
                )));
            }
            rest = rest.trim_start();
            if let Some(after) = rest.strip_prefix(',') {
                rest = after.trim_start();
            } else if !rest.is_empty() {
                return Err(bad(format!("`{rest}`: rules are separated by commas")));
            }
        }
        if out.is_empty() {
            out.push(Rule::Default);
        }
        Ok(PrincipalMapper { rules: out })
    }

    /// The user a certificate's name maps to; `None` if no rule matches.
    pub fn map(&self, name: &str) -> Option<String> {
        for rule in &self.rules {
            match rule {
                Rule::Default => return Some(name.to_string()),
                Rule::Rule {
                    pattern,
                    replacement,
                    case,
                } => {
                    let Some(captures) = pattern.captures(name) else {
                        continue;
                    };
                    let mut user = String::new();
                    captures.expand(replacement, &mut user);
                    return Some(match case {
                        Some('L') => user.to_lowercase(),
                        Some('U') => user.to_uppercase(),
                        _ => user,
                    });
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principal_mapping_rules_are_kafkas() {
        let m = PrincipalMapper::parse(
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/, RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,\
             RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U, DEFAULT",
        )
        .unwrap();
        assert_eq!(
            m.map("CN=kafka-svc,OU=ServiceUsers,O=Org").as_deref(),
            Some("kafka-svc")
        );
        assert_eq!(
            m.map("CN=Duke,OU=JavaSoft,O=Sun Microsystems,L=Palo Alto,ST=CA,C=US")
                .as_deref(),
            Some("duke@javasoft")
        );
        assert_eq!(m.map("OU=x,CN=adm.in").as_deref(), Some("ADM.IN"));
        assert_eq!(m.map("O=nobody").as_deref(), Some("O=nobody"));
        let strict = PrincipalMapper::parse("RULE:^CN=([^,]*)$/$1/").unwrap();
        assert_eq!(strict.map("CN=alice").as_deref(), Some("alice"));
        assert_eq!(strict.map("CN=alice,O=x"), None);
        // An escaped slash belongs to the pattern.
        let slash = PrincipalMapper::parse("RULE:^CN=a\\/b$/ab/").unwrap();
        assert_eq!(slash.map("CN=a/b").as_deref(), Some("ab"));
        for bad in ["RULE:^CN=(.*$/x/", "RULE:nope", "SOMETHING"] {
            assert!(PrincipalMapper::parse(bad).is_err(), "{bad}");
        }
    }
}
