//! The kit against the real reference server on MySQL / MariaDB (a child
//! process with `--database-url mysql://...`, a database of its own on the
//! server named by `IDEM_TEST_MYSQL_URL`): every case that passes on SQLite
//! passes here, none is skipped, and nothing is unsupported.

mod support;

use idem_spec::report::Verdict;

/// The variable naming the MySQL / MariaDB server (as in idem-test-support).
const MYSQL_URL_ENV: &str = "IDEM_TEST_MYSQL_URL";

/// A database of its own on the MySQL server, made and dropped with the
/// `mysql` client (this crate links no database driver), named in
/// `IDEM_TEST_MYSQL_URL` (`mysql://USER@HOST:PORT/DB`).
struct Database {
    host: String,
    port: String,
    user: String,
    name: String,
    url: String,
}

impl Database {
    fn create() -> Option<Self> {
        let Ok(admin_url) = std::env::var(MYSQL_URL_ENV) else {
            let ci = ["IDEM_CI", "CI"]
                .iter()
                .any(|v| std::env::var(v).is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false")));
            assert!(
                !ci,
                "{MYSQL_URL_ENV} is not set, and this is CI: failing instead of skipping"
            );
            eprintln!(
                "\n*** SKIPPED reference_server_on_mysql_conforms: {MYSQL_URL_ENV} is not set ***\n"
            );
            return None;
        };
        let rest = admin_url
            .strip_prefix("mysql://")
            .or_else(|| admin_url.strip_prefix("mariadb://"))
            .expect("a mysql:// URL");
        let (authority, _) = rest.split_once('/').unwrap_or((rest, ""));
        let (user, hostport) = authority.split_once('@').unwrap_or(("root", authority));
        assert!(
            !user.contains(':'),
            "the test's mysql client takes no password: {MYSQL_URL_ENV}"
        );
        let (host, port) = hostport.split_once(':').unwrap_or((hostport, "3306"));
        let name = format!("idem_kit_{}", uuid::Uuid::new_v4().simple());
        let db = Self {
            host: host.to_owned(),
            port: port.to_owned(),
            user: user.to_owned(),
            url: format!("mysql://{authority}/{name}"),
            name,
        };
        db.sql(&format!("CREATE DATABASE {}", db.name));
        Some(db)
    }

    fn sql(&self, statement: &str) {
        let status = std::process::Command::new("mysql")
            .args([
                "-h", &self.host, "-P", &self.port, "-u", &self.user, "-e", statement,
            ])
            .status()
            .expect("the mysql client");
        assert!(status.success(), "mysql -e {statement:?}: {status}");
    }
}

impl Database {
    fn scalar(&self, query: &str) -> i64 {
        let out = std::process::Command::new("mysql")
            .args([
                "-h", &self.host, "-P", &self.port, "-u", &self.user, "-N", "-B", "-e", query,
            ])
            .output()
            .expect("the mysql client");
        assert!(out.status.success(), "mysql -e {query:?}: {}", out.status);
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a number")
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = std::process::Command::new("mysql")
            .args(["-h", &self.host, "-P", &self.port, "-u", &self.user, "-e"])
            .arg(format!("DROP DATABASE IF EXISTS {}", self.name))
            .status();
    }
}

// clause: idem.replay.verbatim, idem.concurrency.single-effect, idem.scope.caller, idem.fingerprint.mismatch, idem.window.expiry, idem.inflight.conflict, idem.claim.atomic
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reference_server_on_mysql_conforms() {
    // A fresh database and server per seed, as on SQLite: the kit's test
    // clock starts from zero with each stack.
    for seed in [1, 2, 3] {
        let Some(db) = Database::create() else {
            return;
        };
        let Some(bin) = support::unflawed_server_bin() else {
            return;
        };
        // The harness starts the server on SQLite; a second --database-url wins.
        let (stack, loaded) = support::start(&bin, &["--database-url", &db.url]).await;
        let r = support::run(&stack, &loaded, seed).await;
        let bad = r.unsettled_cases();
        assert!(
            bad.is_empty(),
            "seed {seed}: {bad:?}\n{}",
            support::show(&r)
        );
        assert_eq!(r.summary.exit_code, 0, "{}", support::show(&r));
        for id in [
            "concurrency.gate",
            "model.sequences",
            "lost.response-dropped",
            "windows.expiry",
            "failure.5xx-not-stored",
            "inflight.conflict",
            "recovery.crash-restart",
            "recovery.lease-takeover",
        ] {
            let c = r.cases.iter().find(|c| c.id == id).expect(id);
            assert_eq!(c.verdict, Verdict::Pass, "{id}\n{}", support::show(&r));
        }
        assert!(r.summary.pass >= 26, "{}", support::show(&r));
        assert_eq!(r.summary.unsupported, 0, "{}", support::show(&r));
        println!("seed {seed}:\n{}", support::show(&r));
        drop(stack);
        // The run really went through MySQL: the keys it sent are in the
        // database's key table.
        let keys = db.scalar(&format!(
            "SELECT COUNT(*) FROM {}.idempotency_keys",
            db.name
        ));
        assert!(
            keys > 0,
            "no keys stored on MySQL: the server ran elsewhere"
        );
    }
}
