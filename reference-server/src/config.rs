//! The command line (and the configuration it amounts to).
//!
//! Every flag has a default that makes `cargo run -p idem-server` work with
//! no arguments. Child-process users (the conformance kit, the multi-process
//! tests) pass `--listen 127.0.0.1:0` and read the first stdout line,
//! `listening on http://ADDR`, to learn the port.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use idem_spec::Profile;
use idem_spec::policy;

use axum_idempotency::EngineConfig;

use crate::error::{Error, Result};
use crate::flaws::Flaws;

/// The library's default completer grace, in the flag's unit (one number,
/// defined by the library).
const DEFAULT_COMPLETER_GRACE_MS: u64 =
    axum_idempotency::engine::DEFAULT_COMPLETER_GRACE.as_millis() as u64;

/// The demo callers served when no token is configured: two, so per-caller
/// scoping can be seen with curl.
pub const DEMO_TOKENS: [(&str, &str); 2] = [("demo-alice", "alice"), ("demo-bob", "bob")];

/// `idem-server` command-line flags.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "idem-server",
    version,
    about = "The idemkit reference server: Idempotency-Key done right, on SQLite or PostgreSQL.",
    long_about = "The idemkit reference server: an idempotency engine on SQLite (default), \
PostgreSQL or MySQL/MariaDB, with an example bank API: POST /v1/transfers (one transaction) and POST /v1/payments \
(multi-step, through an external payment processor).\n\n\
The first line printed on stdout is `listening on http://ADDR` (machine-readable; use \
--listen 127.0.0.1:0 to let the OS pick a free port). GET /healthz (liveness) answers 200 while \
the process serves; GET /readyz (readiness) answers 200 when the database answers too and 503 \
when it does not. While the database is unreachable, locked, full or read-only, idempotent \
requests are answered 503 upstream_unavailable with Retry-After within --store-timeout-ms; \
nothing runs without its claim.\n\n\
Callers authenticate with `Authorization: Bearer TOKEN`. Without --token/--tokens-file the demo \
tokens demo-alice (caller alice) and demo-bob (caller bob) are served.\n\n\
POST /v1/payments (the multi-step example) charges a card at the payment processor given by \
--processor-url (e.g. `cargo run -p idem-fake-processor -- --listen 127.0.0.1:9090 --db \
processor.db`); without it that route answers 503 upstream_unavailable explaining so. Background \
jobs: the completer finishes abandoned multi-step requests, the enqueuer delivers staged jobs, \
the reaper deletes keys past retention.\n\n\
--test-hooks adds unauthenticated test routes (/_test/clock, /_test/reap, /_test/complete, \
/_test/enqueue, /_test/failpoints) and honours the Idem-Failpoint request header \
(crash-after=charge_created, pause-before=finished, ...). Never in production."
)]
pub struct Cli {
    /// Address to listen on; port 0 picks a free port (see the first stdout line).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,

    /// Seconds a client has to send a complete request head: from accept
    /// on a new connection, from the head's first byte on a kept-alive one.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout_secs: u64,

    /// Seconds a client has to send a request body, from its head.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_read_timeout_secs: u64,

    /// Seconds a connection may stay open with no request in progress and
    /// no bytes moving.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_secs: u64,

    /// Client connections open at once (default: three quarters of the
    /// open-file limit, at most 10000). At the cap, new clients wait and
    /// quiet connections are closed to make room.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_client_connections: Option<u64>,

    /// sqlite://PATH (created if missing, WAL mode), postgres://USER@HOST/DB
    /// or mysql://USER@HOST:PORT/DB (MySQL 8.0+ or MariaDB 10.6+). For
    /// PostgreSQL, `?options=-c%20search_path%3DNAME` selects a schema.
    /// Given twice, the last one wins (so a harness that starts the server
    /// with its default database can point it at another).
    #[arg(
        long,
        default_value = "sqlite://idem.db",
        overrides_with = "database_url"
    )]
    pub database_url: String,

    /// Status codes and error codes to answer with: reference, ietf-draft, stripe or resend.
    #[arg(long, default_value = "reference", value_parser = parse_profile)]
    pub profile: Profile,

    /// A bearer token and the caller it authenticates, as TOKEN=CALLER
    /// (repeatable). Visible to every local user in `ps`: for real secrets
    /// use --tokens-file or the IDEM_TOKENS environment variable.
    #[arg(long = "token", value_name = "TOKEN=CALLER")]
    pub tokens: Vec<String>,

    /// A TOML file with a `[tokens]` table mapping each token to its caller
    /// (keep it readable by the server's user only). Tokens can also come
    /// from IDEM_TOKENS: whitespace-separated TOKEN=CALLER pairs.
    #[arg(long, value_name = "PATH")]
    pub tokens_file: Option<PathBuf>,

    /// How long a completed key is replayed, from its first request.
    #[arg(long, default_value_t = policy::DEFAULT_REPLAY_WINDOW_SECS)]
    pub replay_window_secs: u64,

    /// How long key records are kept before the reaper deletes them.
    #[arg(long, default_value_t = policy::DEFAULT_RETENTION_SECS)]
    pub retention_secs: u64,

    /// Lease on an in-flight key. A live multi-step request renews it every
    /// third of it (processor calls included); a crashed holder's key can be
    /// taken over once it runs out. Also the longest a single-phase request
    /// may run.
    #[arg(long, default_value_t = policy::DEFAULT_LEASE_SECS)]
    pub lease_secs: u64,

    /// Retry-After (seconds) on 409 idempotency_key_in_use.
    #[arg(long, default_value_t = policy::DEFAULT_IN_USE_RETRY_AFTER_SECS)]
    pub retry_after_secs: u64,

    /// Upper bound on `Prefer: wait=N`.
    #[arg(long, default_value_t = policy::DEFAULT_MAX_WAIT_SECS)]
    pub max_wait_secs: u64,

    /// How often the reaper deletes records past retention (in batches of
    /// at most 1,000 per transaction, one summary log line per pass).
    #[arg(long, default_value_t = 60)]
    pub reaper_interval_secs: u64,

    /// Largest request body on idempotent endpoints (413 above).
    #[arg(long, default_value_t = 64 * 1024)]
    pub max_body_bytes: usize,

    /// How often the enqueuer delivers staged jobs, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub enqueuer_interval_ms: u64,

    /// How often the completer looks for abandoned multi-step requests
    /// (in flight, lease expired) and finishes them, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub completer_interval_ms: u64,

    /// How long after a lease ends the completer leaves the key to its
    /// client's own retry (which the 409's Retry-After points at the lease's
    /// end), in milliseconds.
    #[arg(long, default_value_t = DEFAULT_COMPLETER_GRACE_MS)]
    pub completer_grace_ms: u64,

    /// Base URL of the payment processor POST /v1/payments calls
    /// (an idem-fake-processor). Without it, /v1/payments answers 503.
    #[arg(long, value_name = "URL")]
    pub processor_url: Option<String>,

    /// Timeout of one call to the payment processor.
    #[arg(long, default_value_t = 10)]
    pub processor_timeout_secs: u64,

    /// Longest a `pause-...` failpoint stalls a request (with --test-hooks).
    #[arg(long, default_value_t = 120)]
    pub failpoint_max_pause_secs: u64,

    /// Database connection pool size.
    #[arg(long, default_value_t = 10)]
    pub max_connections: u32,

    /// Longest wait, in milliseconds, for a database connection or for
    /// SQLite's write lock; past it a request is answered 503
    /// upstream_unavailable with Retry-After (and /readyz 503), never held.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub store_timeout_ms: u64,

    /// Longest one PostgreSQL statement may run, in milliseconds
    /// (statement_timeout); keep it below the lease.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    pub statement_timeout_ms: u64,

    /// How SQLite flushes a commit: `normal` (WAL's recommended setting: a
    /// commit survives the process crashing; a power loss may roll back the
    /// last ones, whole) or `full` (an fsync per commit, which survives a
    /// power loss too). SQLite only; PostgreSQL takes its server's settings.
    #[arg(long, value_enum, default_value_t = SqliteSynchronous::Normal)]
    pub sqlite_synchronous: SqliteSynchronous,

    /// Expose the /_test/* routes and honour the Idem-Failpoint header. Never in production.
    #[arg(long)]
    pub test_hooks: bool,

    /// Start the test clock this many seconds ahead of the wall clock (with
    /// --test-hooks): a harness that restarts the server after moving its
    /// clock passes the offset back, so stored leases and windows keep
    /// their meaning across the restart.
    #[arg(long, default_value_t = 0, requires = "test_hooks")]
    pub test_clock_offset_secs: u64,

    /// Write the OpenAPI document this server would serve at /openapi.json
    /// (with these flags) to PATH, `-` for stdout, and exit without serving.
    #[arg(long, value_name = "PATH")]
    pub write_openapi: Option<PathBuf>,

    /// Switch on a deliberate flaw (conformance-kit teeth; repeatable).
    #[cfg(feature = "flaws")]
    #[arg(long = "flaw", value_enum, value_name = "NAME")]
    pub flaws: Vec<crate::flaws::Flaw>,
}

/// `--sqlite-synchronous`: SQLite's `synchronous` pragma, as the store offers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SqliteSynchronous {
    /// `synchronous = NORMAL`.
    Normal,
    /// `synchronous = FULL`.
    Full,
}

fn parse_profile(s: &str) -> std::result::Result<Profile, String> {
    Profile::from_name(s).ok_or_else(|| {
        format!("unknown profile {s:?}; expected reference, ietf-draft, stripe or resend")
    })
}

/// The environment variable read for bearer tokens: whitespace-separated
/// `TOKEN=CALLER` pairs. Unlike `--token`, it does not show in `ps`.
pub const TOKENS_ENV: &str = "IDEM_TOKENS";

/// `TOKEN=CALLER`, split at the last `=`: a caller name has no `=`, while a
/// token may (base64 padding).
fn split_token(pair: &str) -> Option<(&str, &str)> {
    pair.rsplit_once('=')
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    tokens: BTreeMap<String, String>,
}

impl Cli {
    /// Parses flags from an argument list (the first item is the program name).
    pub fn from_args<I, T>(args: I) -> std::result::Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        <Self as clap::Parser>::try_parse_from(args)
    }

    /// Token → caller, from the tokens file, the [`TOKENS_ENV`] variable
    /// and the flags (a later source wins for the same token), or the demo
    /// tokens when none gives any.
    pub fn token_map(&self) -> Result<BTreeMap<String, String>> {
        let env = std::env::var(TOKENS_ENV).ok();
        self.token_map_with_env(env.as_deref())
    }

    /// [`token_map`](Self::token_map) with `env` standing for the value of
    /// [`TOKENS_ENV`] (tests cannot set a process's environment safely).
    pub fn token_map_with_env(&self, env: Option<&str>) -> Result<BTreeMap<String, String>> {
        let mut map = BTreeMap::new();
        if let Some(path) = &self.tokens_file {
            let text = std::fs::read_to_string(path)?;
            let file: TokensFile = toml::from_str(&text)
                .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
            map.extend(file.tokens);
        }
        // Tokens are visible ASCII (no spaces), so whitespace separates pairs.
        for t in env.unwrap_or_default().split_whitespace() {
            let (token, caller) = split_token(t).ok_or_else(|| {
                // Never echo the value: it holds secrets.
                Error::Config(format!("{TOKENS_ENV}: expected TOKEN=CALLER pairs"))
            })?;
            map.insert(token.to_owned(), caller.to_owned());
        }
        for t in &self.tokens {
            let (token, caller) = split_token(t)
                .ok_or_else(|| Error::Config("--token: expected TOKEN=CALLER".into()))?;
            map.insert(token.to_owned(), caller.to_owned());
        }
        if map.is_empty() {
            map.extend(
                DEMO_TOKENS
                    .iter()
                    .map(|(t, c)| ((*t).to_owned(), (*c).to_owned())),
            );
        }
        for (token, caller) in &map {
            if token.is_empty() || !token.bytes().all(|b| (0x21..=0x7E).contains(&b)) {
                return Err(Error::Config(format!(
                    "token for caller {caller:?} must be visible ASCII"
                )));
            }
            let ok = !caller.is_empty()
                && caller.len() <= 64
                && caller.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                });
            if !ok {
                return Err(Error::Config(format!(
                    "caller name {caller:?} must be 1-64 characters of a-z, 0-9, _ or -"
                )));
            }
        }
        Ok(map)
    }

    /// The engine settings these flags ask for.
    pub fn engine_config(&self) -> Result<EngineConfig> {
        if self.retention_secs < self.replay_window_secs {
            return Err(Error::Config(
                "--retention-secs must be at least --replay-window-secs".into(),
            ));
        }
        Ok(EngineConfig {
            replay_window: Duration::from_secs(self.replay_window_secs),
            retention: Duration::from_secs(self.retention_secs),
            lease: Duration::from_secs(self.lease_secs),
            retry_after_secs: self.retry_after_secs,
            max_wait: Duration::from_secs(self.max_wait_secs),
            max_body_bytes: self.max_body_bytes,
            profile: self.profile,
            completer_grace: Duration::from_millis(self.completer_grace_ms),
            ..EngineConfig::default()
        })
    }

    /// The policy the server publishes (OpenAPI `x-idempotency`): what these
    /// flags promise, whatever a deliberate flaw does to the engine.
    pub fn published_policy(&self) -> idem_spec::Policy {
        EngineConfig {
            replay_window: Duration::from_secs(self.replay_window_secs),
            retention: Duration::from_secs(self.retention_secs),
            lease: Duration::from_secs(self.lease_secs),
            retry_after_secs: self.retry_after_secs,
            max_wait: Duration::from_secs(self.max_wait_secs),
            ..EngineConfig::default()
        }
        .policy()
    }

    /// The pool settings these flags ask for (the library refuses
    /// `--sqlite-synchronous full` with another store's URL).
    pub fn store_options(&self) -> axum_idempotency::StoreOptions {
        let sync = match self.sqlite_synchronous {
            SqliteSynchronous::Normal => axum_idempotency::SqliteSync::Normal,
            SqliteSynchronous::Full => axum_idempotency::SqliteSync::Full,
        };
        axum_idempotency::StoreOptions::default()
            .max_connections(self.max_connections)
            .acquire_timeout(Duration::from_millis(self.store_timeout_ms))
            .statement_timeout(Duration::from_millis(self.statement_timeout_ms))
            .sqlite_synchronous(sync)
    }

    /// The connection-level limits these flags ask for.
    pub fn connection_limits(&self) -> crate::serve::Limits {
        crate::serve::Limits {
            header_read: Duration::from_secs(self.header_read_timeout_secs),
            body_read: Duration::from_secs(self.body_read_timeout_secs),
            idle: Duration::from_secs(self.idle_timeout_secs),
            max_connections: self
                .max_client_connections
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or_else(crate::serve::default_max_connections),
        }
    }

    /// The flaws switched on (always none without the `flaws` feature).
    pub fn flaw_set(&self) -> Flaws {
        #[cfg(feature = "flaws")]
        {
            Flaws::from_list(self.flaws.clone())
        }
        #[cfg(not(feature = "flaws"))]
        {
            Flaws::none()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_arguments_means_the_documented_defaults() {
        let cli = Cli::from_args(["idem-server"]).expect("parse");
        assert_eq!(cli.listen, "127.0.0.1:8080");
        assert_eq!(cli.database_url, "sqlite://idem.db");
        assert_eq!(cli.profile, Profile::Reference);
        assert!(!cli.test_hooks, "test hooks are off by default");
        assert_eq!(cli.processor_url, None, "payments are off by default");
        assert_eq!(cli.completer_interval_ms, 5000);
        assert_eq!(cli.enqueuer_interval_ms, 1000);
        let limits = cli.connection_limits();
        assert_eq!(limits.header_read, Duration::from_secs(10));
        assert_eq!(limits.body_read, Duration::from_secs(30));
        assert_eq!(limits.idle, Duration::from_secs(60));
        assert_eq!(
            limits.max_connections,
            crate::serve::default_max_connections()
        );
        assert!(Cli::from_args(["idem-server", "--idle-timeout-secs", "0"]).is_err());
        let tokens = cli.token_map_with_env(None).expect("tokens");
        assert_eq!(tokens.get("demo-alice").map(String::as_str), Some("alice"));
        assert_eq!(tokens.get("demo-bob").map(String::as_str), Some("bob"));
        let policy = cli.engine_config().expect("config").policy();
        assert_eq!(policy, idem_spec::Policy::default());
        assert_eq!(cli.published_policy(), policy);
    }

    #[test]
    fn sqlite_synchronous_is_normal_unless_asked() {
        let cli = Cli::from_args(["idem-server"]).expect("parse");
        assert_eq!(
            cli.store_options().sqlite_synchronous,
            axum_idempotency::SqliteSync::Normal
        );
        let cli = Cli::from_args(["idem-server", "--sqlite-synchronous", "full"]).expect("parse");
        assert_eq!(
            cli.store_options().sqlite_synchronous,
            axum_idempotency::SqliteSync::Full
        );
        assert!(Cli::from_args(["idem-server", "--sqlite-synchronous", "off"]).is_err());
    }

    #[test]
    fn a_clock_offset_needs_test_hooks() {
        assert!(Cli::from_args(["idem-server", "--test-clock-offset-secs", "60"]).is_err());
        let cli = Cli::from_args([
            "idem-server",
            "--test-hooks",
            "--test-clock-offset-secs",
            "60",
        ])
        .expect("parse");
        assert_eq!(cli.test_clock_offset_secs, 60);
    }

    #[test]
    fn tokens_from_flags_and_file_replace_the_demo_ones() {
        let path = std::env::temp_dir().join(format!("idem-tokens-{}.toml", uuid::Uuid::new_v4()));
        std::fs::write(&path, "[tokens]\n\"s3cret\" = \"carol\"\n").expect("write");
        let cli = Cli::from_args([
            "idem-server",
            "--token",
            "t1=dave",
            "--tokens-file",
            path.to_str().expect("utf-8 path"),
        ])
        .expect("parse");
        let tokens = cli.token_map_with_env(None).expect("tokens");
        let _ = std::fs::remove_file(&path);
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens["t1"], "dave");
        assert_eq!(tokens["s3cret"], "carol");
        let bad = Cli::from_args(["idem-server", "--token", "t=Not Valid"]).expect("parse");
        assert!(bad.token_map_with_env(None).is_err());
        assert!(Cli::from_args(["idem-server", "--profile", "nope"]).is_err());
        let short = Cli::from_args(["idem-server", "--retention-secs", "10"]).expect("parse");
        assert!(
            short.engine_config().is_err(),
            "retention shorter than the window"
        );
    }

    #[test]
    fn tokens_from_the_environment_join_the_flags_and_are_never_echoed() {
        let cli = Cli::from_args(["idem-server", "--token", "t1=dave"]).expect("parse");
        let tokens = cli
            .token_map_with_env(Some("  s3cret=carol\n\tb64tok+/===erin  "))
            .expect("tokens");
        assert_eq!(tokens.len(), 3, "{tokens:?}");
        assert_eq!(tokens["s3cret"], "carol");
        assert_eq!(tokens["b64tok+/=="], "erin", "split at the last '='");
        assert_eq!(tokens["t1"], "dave");
        // The environment alone replaces the demo tokens.
        let bare = Cli::from_args(["idem-server"]).expect("parse");
        let only_env = bare.token_map_with_env(Some("x=zoe")).expect("tokens");
        assert_eq!(only_env.keys().collect::<Vec<_>>(), ["x"]);
        // An empty variable is no tokens at all: the demo ones stay.
        assert!(
            bare.token_map_with_env(Some(" "))
                .expect("tokens")
                .contains_key("demo-alice")
        );
        // A malformed pair is refused without repeating the secret.
        let err = bare
            .token_map_with_env(Some("no-caller-here"))
            .expect_err("malformed")
            .to_string();
        assert!(
            err.contains(TOKENS_ENV) && !err.contains("no-caller-here"),
            "{err}"
        );
        let err = Cli::from_args(["idem-server", "--token", "hunter2"])
            .expect("parse")
            .token_map_with_env(None)
            .expect_err("malformed")
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[cfg(not(feature = "flaws"))]
    #[test]
    fn flaws_do_not_exist_in_a_normal_build() {
        assert!(Cli::from_args(["idem-server", "--flaw", "global-keys"]).is_err());
    }
}
