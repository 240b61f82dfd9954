//! What a process costs, read from `/proc` (Linux only): CPU time and
//! resident memory of the servers and of the database's processes.
//!
//! CPU comes in clock ticks (`utime + stime` of the whole process, all its
//! threads; usually 100 per second), so a cell needs a few hundred
//! milliseconds of CPU before its per-request figure is good to 1 %.

use std::collections::BTreeMap;

/// Clock ticks per second of `/proc/*/stat` CPU times.
pub fn ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second()
}

/// The fields of `/proc/PID/stat` after the command name (which may hold
/// spaces and parentheses, so split after its last `)`).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// User plus system CPU of `pid` so far, in clock ticks; `None` once the
/// process is gone.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let f = stat_fields(pid)?;
    // After the name: state(0) ppid(1) ... utime(11) stime(12).
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn parent(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// CPU ticks of `root` and every process whose parent is `root` (a
/// PostgreSQL postmaster and its backends and helpers), by pid.
pub fn tree_ticks(root: u32) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    if let Some(t) = cpu_ticks(root) {
        out.insert(root, t);
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != root
            && parent(pid) == Some(root)
            && let Some(t) = cpu_ticks(pid)
        {
            out.insert(pid, t);
        }
    }
    out
}

/// Ticks spent between two [`tree_ticks`] snapshots: processes present in
/// both count their difference, processes born since count all of theirs
/// (processes that ended in between are lost: short-lived, and not ours).
pub fn tree_delta(before: &BTreeMap<u32, u64>, after: &BTreeMap<u32, u64>) -> u64 {
    after
        .iter()
        .map(|(pid, t)| t.saturating_sub(before.get(pid).copied().unwrap_or(0)))
        .sum()
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Resident memory now (`VmRSS`), KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// The most resident memory the process ever had (`VmHWM`), KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// `nproc` and the CPU model, for the result's machine line.
pub fn machine() -> (usize, String) {
    let n = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    (n, model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_memory_and_is_its_own_tree_root() {
        let me = std::process::id();
        // Burn a little CPU so the counter cannot be zero by luck.
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(50) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        assert!(cpu_ticks(me).is_some());
        assert!(rss_kib(me).is_some_and(|k| k > 0));
        assert!(peak_rss_kib(me) >= rss_kib(me));
        assert!(tree_ticks(me).contains_key(&me));
        assert!(ticks_per_second() > 0);
    }
}
