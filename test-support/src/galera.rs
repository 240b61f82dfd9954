//! A throwaway Galera cluster (MariaDB Cluster) of a test's own: several
//! `mariadbd` nodes on loopback, every one accepting writes, for tests of
//! what the MySQL store does when the same keys arrive through two nodes at
//! once.
//!
//! Each node gets its own data directory, client port and the three Galera
//! ports (group communication, incremental and full state transfer). The
//! first node bootstraps the cluster (`--wsrep-new-cluster`); the others
//! join one at a time by a full state transfer over rsync, so when
//! [`Galera::start`] returns every node is `Synced` in one primary
//! component. All nodes are killed (SIGKILL) and the directory removed on
//! drop.
//!
//! Run as root (as CI does), the nodes run as the `mysql` user: the joiner's
//! rsync daemon drops to `nobody` when started by root and could not write
//! a root-owned data directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::TempDir;

/// The wsrep provider of Debian's `galera-4` package.
pub const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

/// How long one node may take to start and reach `Synced` (a join copies
/// the donor's whole data directory).
const NODE_DEADLINE: Duration = Duration::from_secs(90);

/// One node's ports.
#[derive(Debug, Clone, Copy)]
struct Ports {
    sql: u16,
    gmcast: u16,
    ist: u16,
    sst: u16,
}

/// A running Galera cluster, killed and removed on drop.
#[derive(Debug)]
pub struct Galera {
    dir: TempDir,
    ports: Vec<Ports>,
    children: Mutex<Vec<Child>>,
    as_mysql_user: bool,
}

fn which(program: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"]
        .iter()
        .map(|d| PathBuf::from(d).join(program))
        .find(|p| p.exists())
}

/// Free loopback ports for a cluster's nodes, from *below* the kernel's
/// ephemeral range: a port taken with `bind(127.0.0.1:0)` and released
/// comes from that range, where any outgoing connection of a busy machine
/// (another test, a build) may take it before mysqld binds it, and Galera
/// then aborts with "Address already in use". Below the range only an
/// explicit bind can collide; each port is checked bindable, held until
/// all are chosen, and never handed out twice in this process.
fn free_ports(n: usize) -> Vec<u16> {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u16>().ok())
        })
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(10_001));
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let given = given.get_or_insert_with(HashSet::new);
    let mut held = Vec::new();
    let mut ports = Vec::new();
    // Bounded: a crowded range fails the test with a message, not a hang.
    for _ in 0..(n * 200) {
        if ports.len() == n {
            break;
        }
        let r = u16::from_le_bytes(
            uuid::Uuid::new_v4().as_bytes()[..2]
                .try_into()
                .unwrap_or([0, 0]),
        );
        let port = low + r % (high - low);
        if given.contains(&port) || ports.contains(&port) {
            continue;
        }
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
            ports.push(port);
        }
    }
    assert_eq!(ports.len(), n, "no {n} free ports in {low}..{high}");
    given.extend(&ports);
    ports
}

impl Galera {
    /// Starts a cluster of `nodes` (at least 2) nodes and waits until every
    /// one is `Synced`, or `None` (after a loud SKIPPED line naming `test`;
    /// a failure in CI, see [`crate::skip_without`]) when MariaDB, the
    /// Galera provider or rsync is not installed.
    ///
    /// # Panics
    /// When the components exist but a node cannot be installed, started
    /// or synced within 90 s.
    pub fn start(test: &str, nodes: usize) -> Option<Self> {
        assert!(nodes >= 2, "a cluster needs two nodes at least");
        let (Some(_), Some(install), Some(_)) = (
            which("mariadbd"),
            which("mariadb-install-db"),
            which("rsync"),
        ) else {
            crate::skip_without(
                test,
                "no mariadbd / mariadb-install-db / rsync (Debian mariadb-server, rsync)",
            );
            return None;
        };
        if !Path::new(PROVIDER).exists() {
            crate::skip_without(test, "no Galera provider (Debian galera-4)");
            return None;
        }
        let dir = TempDir::new("idem-galera");
        let as_mysql_user = is_root(dir.path());
        let all = free_ports(4 * nodes);
        let ports: Vec<Ports> = all
            .chunks(4)
            .map(|c| Ports {
                sql: c[0],
                gmcast: c[1],
                ist: c[2],
                sst: c[3],
            })
            .collect();
        let cluster = Self {
            dir,
            ports,
            children: Mutex::new(Vec::new()),
            as_mysql_user,
        };
        for i in 0..nodes {
            let data = cluster.node_dir(i).join("data");
            // A temp directory per node: two installs (or servers) sharing
            // /tmp can collide on their temporary tables' file names.
            let tmp = cluster.node_dir(i).join("tmp");
            for d in [&data, &tmp] {
                std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
            }
            cluster.chown(&cluster.node_dir(i));
            let out = Command::new(&install)
                .arg("--no-defaults")
                .arg(format!("--datadir={}", data.display()))
                .arg(format!("--tmpdir={}", tmp.display()))
                .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
                .arg(format!("--user={}", cluster.user()))
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("mariadb-install-db: {e}"));
            assert!(
                out.status.success(),
                "mariadb-install-db failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            cluster.chown(&cluster.node_dir(i));
            cluster.spawn(i, i == 0);
            cluster.wait_synced(i);
            if i == 0 {
                // Replicated to every node that joins later.
                cluster.root_sql(
                    0,
                    "CREATE DATABASE IF NOT EXISTS test; CREATE USER IF NOT EXISTS 'app'@'%'; \
                     GRANT ALL ON test.* TO 'app'@'%'; CREATE USER IF NOT EXISTS 'app'@'localhost'; \
                     GRANT ALL ON test.* TO 'app'@'localhost'",
                );
            }
        }
        let size = cluster.status(0, "wsrep_cluster_size");
        assert_eq!(size, nodes.to_string(), "cluster size after every join");
        Some(cluster)
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.ports.len()
    }

    /// `mysql://app@127.0.0.1:PORT/test` of node `i`: what an application
    /// connects to (`app` has no SUPER).
    pub fn url(&self, i: usize) -> String {
        format!("mysql://app@127.0.0.1:{}/test", self.ports[i].sql)
    }

    /// Runs `statements` as root on node `i`.
    ///
    /// # Panics
    /// When the client fails.
    pub fn root_sql(&self, i: usize, statements: &str) {
        let out = self.client(i, statements);
        assert!(
            out.status.success(),
            "node {i}: mysql -e {statements:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The value of global status variable `name` on node `i` (empty when
    /// the node does not answer).
    pub fn status(&self, i: usize, name: &str) -> String {
        let out = self.client(i, &format!("SHOW GLOBAL STATUS LIKE '{name}'"));
        String::from_utf8_lossy(&out.stdout)
            .split('\t')
            .nth(1)
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// The sum of global status counter `name` over every node.
    pub fn status_sum(&self, name: &str) -> u64 {
        (0..self.nodes())
            .map(|i| self.status(i, name).parse::<u64>().unwrap_or(0))
            .sum()
    }

    fn client(&self, i: usize, statements: &str) -> std::process::Output {
        Command::new("mysql")
            .args(["-h", "127.0.0.1", "-P", &self.ports[i].sql.to_string()])
            .args(["-u", "root", "-N", "--connect-timeout=2", "-e", statements])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("mysql client: {e}"))
    }

    fn node_dir(&self, i: usize) -> PathBuf {
        self.dir.join(&format!("n{i}"))
    }

    fn user(&self) -> &'static str {
        if self.as_mysql_user { "mysql" } else { "" }
    }

    fn chown(&self, path: &Path) {
        if !self.as_mysql_user {
            return;
        }
        let st = Command::new("chown")
            .args(["-R", "mysql:mysql"])
            .arg(path)
            .status()
            .unwrap_or_else(|e| panic!("chown: {e}"));
        assert!(st.success(), "chown -R mysql {}", path.display());
    }

    fn spawn(&self, i: usize, bootstrap: bool) {
        let d = self.node_dir(i);
        let p = self.ports[i];
        let peers: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.gmcast))
            .collect();
        let mut cmd = Command::new(which("mariadbd").unwrap_or_else(|| PathBuf::from("mariadbd")));
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--tmpdir={}", d.join("tmp").display()))
            .arg(format!("--socket={}", d.join("s").display()))
            .arg(format!("--pid-file={}", d.join("pid").display()))
            .arg(format!("--log-error={}", d.join("err.log").display()))
            .arg(format!("--port={}", p.sql))
            .args([
                "--bind-address=127.0.0.1",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
                "--wsrep-on=ON",
                "--binlog-format=ROW",
                "--innodb-autoinc-lock-mode=2",
                "--wsrep-sst-method=rsync",
                "--wsrep-node-address=127.0.0.1",
            ])
            .arg(format!("--wsrep-provider={PROVIDER}"))
            .arg(format!("--wsrep-node-name=n{i}"))
            .arg(format!(
                "--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{};\
                 ist.recv_addr=127.0.0.1:{};gcache.size=32M",
                p.gmcast, p.ist
            ))
            .arg(format!("--wsrep-sst-receive-address=127.0.0.1:{}", p.sst))
            .arg(format!(
                "--wsrep-cluster-address=gcomm://{}",
                peers.join(",")
            ));
        if self.as_mysql_user {
            cmd.arg("--user=mysql");
        }
        if bootstrap {
            cmd.arg("--wsrep-new-cluster");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("mariadbd: {e}"));
        self.children
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(child);
    }

    fn wait_synced(&self, i: usize) {
        let deadline = Instant::now() + NODE_DEADLINE;
        while self.status(i, "wsrep_local_state_comment") != "Synced" {
            assert!(
                Instant::now() < deadline,
                "Galera node {i} not Synced within {NODE_DEADLINE:?}: {}",
                std::fs::read_to_string(self.node_dir(i).join("err.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Whether this process runs as root (it then owns what it creates as uid 0).
fn is_root(created: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(created).is_ok_and(|m| m.uid() == 0)
}

impl Drop for Galera {
    fn drop(&mut self) {
        let mut children = self
            .children
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for child in children.iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
