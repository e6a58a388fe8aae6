//! What the benchmark reads off the machine: this process's CPU time and
//! resident memory (the controller runs in it), the Docker calls the
//! controller made, and a container's memory as the kernel charges it.

use bollard::query_parameters::StatsOptionsBuilder;
use bollard::Docker;
use futures::StreamExt;

/// CPU seconds (user + system) this process has used.
pub fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat (11 and 12 after the name).
    // In USER_HZ, which Linux fixes at 100 for user space on every
    // architecture it exposes /proc/<pid>/stat on.
    (ticks(11) + ticks(12)) / 100.0
}

/// A `kB` field of /proc/self/status, in bytes.
fn status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kb| kb * 1024)
}

/// Resident memory of this process now.
pub fn rss_bytes() -> u64 {
    status_bytes("VmRSS:")
}

/// The most resident memory this process has had.
pub fn peak_rss_bytes() -> u64 {
    status_bytes("VmHWM:")
}

/// Docker API calls timed so far, from a `/metrics` text
/// (`sandboxd_docker_api_seconds_count`, every call kind).
pub fn docker_calls(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("sandboxd_docker_api_seconds_count"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The container's memory as `docker stats` shows it: the cgroup's usage
/// without its inactive file cache. tmpfs data counts (it is shared
/// memory the container cannot give back).
pub async fn container_memory(docker: &Docker, id: &str) -> Option<u64> {
    let options = StatsOptionsBuilder::default()
        .stream(false)
        .one_shot(true)
        .build();
    let stats = docker.stats(id, Some(options)).next().await?.ok()?;
    let memory = stats.memory_stats?;
    let usage = memory.usage?;
    let stats = memory.stats.unwrap_or_default();
    // cgroup v1 says total_inactive_file, v2 inactive_file.
    let inactive = stats
        .get("total_inactive_file")
        .or_else(|| stats.get("inactive_file"))
        .copied()
        .unwrap_or(0);
    Some(usage.saturating_sub(inactive))
}
