//! Secrets out of every report: the client check shows the command it ran,
//! its output and what it sent, so whatever in them is a credential is
//! replaced by [`REDACTED`] before anything is printed or written.
//!
//! A [`Redactor`] collects the secret *values* from three places: the
//! command line (an `Authorization:`-like header, a bearer token, a
//! `--user`/`--password`/`--token`-like option, a `token=`-like assignment,
//! a URL's user information), the environment the command inherits
//! (variables whose names look secret) and every recorded request header
//! whose name looks secret (`authorization`, `cookie`, `x-api-key`, ...).
//! It then replaces each value wherever it occurs, so a token the SDK
//! echoes to its stderr is caught as well as the one in the command.

use std::sync::LazyLock;

use idem_spec::report::Report;
use regex::Regex;

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// The shortest value taken from the command line or a header: anything
/// shorter would blank ordinary words of the report.
const MIN_SECRET: usize = 4;
/// The shortest value taken from the environment, whose secret-looking
/// names also hold short flags (`AUTH_MODE=none`).
const MIN_ENV_SECRET: usize = 8;

/// Whether a header, option, variable or parameter name looks like it holds
/// a credential. Idempotency keys are not secrets: the report shows them.
pub fn secret_name(name: &str) -> bool {
    let n = name.trim_start_matches('-').to_ascii_lowercase();
    if n.contains("idempot") {
        return false;
    }
    const WORDS: &[&str] = &[
        "auth",
        "token",
        "secret",
        "passw",
        "pwd",
        "cookie",
        "session",
        "credential",
        "signature",
        "private",
        "apikey",
        "api_key",
        "api-key",
        "access_key",
        "access-key",
    ];
    WORDS.iter().any(|w| n.contains(w)) || n.ends_with("key") || n == "u" || n == "user"
}

/// An authentication scheme word, not itself secret.
fn scheme(word: &str) -> bool {
    ["bearer", "basic", "token", "digest", "apikey", "key"]
        .iter()
        .any(|s| word.eq_ignore_ascii_case(s))
}

/// A shell variable or command substitution: the *value* it stands for is
/// what is secret, and the environment supplies that.
fn reference(v: &str) -> bool {
    v.contains('$') || v.contains('`')
}

static HEADER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"([A-Za-z0-9_-]+)[ \t]*:[ \t]*([^"'\r\n]+)"#).expect("valid regex")
});
static BEARER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:bearer|basic|token)\s+([A-Za-z0-9._~+/=:-]{4,})").expect("valid regex")
});
static OPTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?:^|\s)(--?[A-Za-z0-9_-]+)(?:=|\s+)(?:"([^"]*)"|'([^']*)'|([^\s"']+))"#)
        .expect("valid regex")
});
static ASSIGN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"([A-Za-z0-9_.-]+)=(?:"([^"]*)"|'([^']*)'|([^\s&"';]+))"#).expect("valid regex")
});
static JSON_MEMBER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"\\?"([A-Za-z0-9_-]+)\\?"\s*:\s*\\?"([^"\\]*)\\?""#).expect("valid regex")
});
static USERINFO: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"://([^/\s:@]+):([^/\s@]+)@").expect("valid regex"));

/// The secret values found in text and headers; replaces them everywhere.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    /// A redactor for `command`, its environment included.
    pub fn for_command(command: &str) -> Self {
        let mut r = Self::default();
        r.add_command(command);
        r.add_env(std::env::vars());
        r
    }

    fn add(&mut self, value: &str, min: usize) {
        let v = value.trim().trim_matches(|c| c == '"' || c == '\'');
        if v.len() >= min && !reference(v) && !self.secrets.iter().any(|s| s == v) {
            self.secrets.push(v.to_owned());
            // Longest first, so a token inside a longer secret is not
            // replaced first, leaving the rest of the longer one readable.
            self.secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }

    /// A header-like value: the whole of it, and each word but the scheme
    /// (`Bearer`), so the bare token is caught where it is echoed alone.
    fn add_value(&mut self, value: &str) {
        self.add(value, MIN_SECRET);
        for word in value.split_whitespace().filter(|w| !scheme(w)) {
            self.add(word, MIN_SECRET);
            // user:password: the password alone, too.
            if let Some((_, pass)) = word.split_once(':') {
                self.add(pass, MIN_SECRET);
            }
        }
    }

    /// Collects the secrets of a command line.
    pub fn add_command(&mut self, command: &str) {
        let mut found = Vec::new();
        for c in HEADER.captures_iter(command) {
            if secret_name(&c[1]) && c[1].len() > 1 {
                found.push(c[2].to_owned());
            }
        }
        for c in BEARER.captures_iter(command) {
            found.push(c[1].to_owned());
        }
        for re in [&*OPTION, &*ASSIGN] {
            for c in re.captures_iter(command) {
                if secret_name(&c[1]) {
                    let v = c
                        .get(2)
                        .or(c.get(3))
                        .or(c.get(4))
                        .map_or("", |m| m.as_str());
                    found.push(v.to_owned());
                }
            }
        }
        for c in JSON_MEMBER.captures_iter(command) {
            if secret_name(&c[1]) {
                found.push(c[2].to_owned());
            }
        }
        for c in USERINFO.captures_iter(command) {
            found.push(format!("{}:{}", &c[1], &c[2]));
        }
        for v in found {
            self.add_value(&v);
        }
    }

    /// Collects the values of environment variables whose names look secret.
    pub fn add_env(&mut self, vars: impl IntoIterator<Item = (String, String)>) {
        for (name, value) in vars {
            if secret_name(&name) && name != "IDEM_BASE_URL" {
                self.add(&value, MIN_ENV_SECRET);
            }
        }
    }

    /// Collects the values of recorded request headers whose names look
    /// secret (`Authorization`, `Cookie`, `X-Api-Key`, ...).
    pub fn add_headers<'a>(&mut self, headers: impl IntoIterator<Item = &'a (String, String)>) {
        for (name, value) in headers {
            if secret_name(name) {
                self.add_value(value);
            }
        }
    }

    /// How many secret values it knows.
    pub fn len(&self) -> usize {
        self.secrets.len()
    }

    /// Whether it knows none.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// `text` with every known secret replaced by [`REDACTED`].
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        out
    }

    /// Redacts every string of a report, whatever field holds it, so no
    /// renderer (console, JSON, HTML, JUnit) can show a secret.
    pub fn report(&self, report: &mut Report) {
        if self.is_empty() {
            return;
        }
        let Ok(mut value) = serde_json::to_value(&*report) else {
            return;
        };
        self.walk(&mut value);
        if let Ok(r) = serde_json::from_value(value) {
            *report = r;
        }
    }

    fn walk(&self, v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) => *s = self.redact(s),
            serde_json::Value::Array(a) => a.iter_mut().for_each(|x| self.walk(x)),
            serde_json::Value::Object(o) => o.values_mut().for_each(|x| self.walk(x)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_a_command_line_are_found_and_replaced() {
        // (command, secrets that must go, words that must stay)
        let table: &[(&str, &[&str], &[&str])] = &[
            (
                r#"curl -H "Authorization: Bearer sk_live_4711abc" "$IDEM_BASE_URL/p""#,
                &["sk_live_4711abc"],
                &["Authorization", "IDEM_BASE_URL"],
            ),
            (
                r#"curl -H 'X-Api-Key: k3y-0f-mine' -H "Idempotency-Key: $(uuidgen)" -d '{}' x"#,
                &["k3y-0f-mine"],
                &["Idempotency-Key", "uuidgen"],
            ),
            (
                "curl --user alice:s3cr3tpw https://x",
                &["alice:s3cr3tpw", "s3cr3tpw"],
                &["curl", "https://x"],
            ),
            (
                "pay --password=hunter22 --token tok_9999 --amount 10",
                &["hunter22", "tok_9999"],
                &["--amount 10"],
            ),
            (
                "python pay.py 'https://api.example/x?api_key=AKIAXYZ123&n=1'",
                &["AKIAXYZ123"],
                &["n=1", "pay.py"],
            ),
            (
                "STRIPE_API_KEY=sk_test_51abc node pay.js",
                &["sk_test_51abc"],
                &["node pay.js"],
            ),
            (
                r#"sdk pay -d '{"amount":1,"client_secret":"cs_abc_999"}'"#,
                &["cs_abc_999"],
                &["amount"],
            ),
            (
                "curl https://bob:pa55word@host/x",
                &["bob:pa55word", "pa55word"],
                &["host/x"],
            ),
            (
                r#"curl -H "Cookie: session=abcdef123" x"#,
                &["session=abcdef123", "abcdef123"],
                &["Cookie"],
            ),
        ];
        for (cmd, gone, kept) in table {
            let mut r = Redactor::default();
            r.add_command(cmd);
            let out = r.redact(cmd);
            for g in *gone {
                assert!(!out.contains(g), "{cmd}: {g} left in {out}");
            }
            for k in *kept {
                assert!(out.contains(k), "{cmd}: {k} lost from {out}");
            }
            assert!(out.contains(REDACTED), "{out}");
        }
    }

    #[test]
    fn variable_references_and_plain_commands_are_left_alone() {
        for cmd in [
            r#"curl -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" x"#,
            "cargo run -q -p idem-client-zoo -- --client conforming",
            r#"curl -sf --max-time 3 -X POST -d '{"amount":1}' "$IDEM_BASE_URL/payments""#,
        ] {
            let mut r = Redactor::default();
            r.add_command(cmd);
            assert_eq!(r.redact(cmd), cmd, "{r:?}");
        }
    }

    #[test]
    fn secret_env_values_and_recorded_headers_are_caught_wherever_echoed() {
        let mut r = Redactor::default();
        r.add_env([
            ("PAY_API_TOKEN".to_owned(), "env-secret-123456".to_owned()),
            ("AUTH_MODE".to_owned(), "none".to_owned()),
            ("HOME".to_owned(), "/home/someone".to_owned()),
        ]);
        r.add_headers(&[
            ("authorization".to_owned(), "Bearer hdr-tok-777".to_owned()),
            ("X-Api-Key".to_owned(), "apikey-888".to_owned()),
            ("Idempotency-Key".to_owned(), "k-1".to_owned()),
        ]);
        let text = "stderr: sent hdr-tok-777 and apikey-888 with env-secret-123456; key k-1, \
                    mode none, home /home/someone";
        let out = r.redact(text);
        for g in ["hdr-tok-777", "apikey-888", "env-secret-123456"] {
            assert!(!out.contains(g), "{out}");
        }
        for k in ["k-1", "mode none", "/home/someone"] {
            assert!(out.contains(k), "{out}");
        }
    }
}
