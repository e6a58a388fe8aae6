//! Resource caps applied to every sandbox container.

/// Resource caps for sandbox containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Memory limit in bytes (swap is capped to the same value).
    pub memory_bytes: i64,
    /// CPU limit in billionths of a CPU.
    pub nano_cpus: i64,
    /// Maximum number of processes.
    pub pids: i64,
    /// Size of the tmpfs data directory in bytes.
    pub tmpfs_bytes: i64,
    /// Size of each other tmpfs (`/tmp`, runtime directories) in bytes.
    pub(crate) scratch_bytes: i64,
    /// Added to the kernel's OOM score (-1000..1000): positive, so the
    /// kernel kills sandboxes before the controller, its database or dockerd.
    pub oom_score_adj: i64,
    /// Largest size of one container log file in bytes.
    pub(crate) log_bytes: i64,
    /// Log files kept per container.
    pub(crate) log_files: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 512 * 1024 * 1024,
            nano_cpus: 1_000_000_000,
            pids: 256,
            tmpfs_bytes: 512 * 1024 * 1024,
            scratch_bytes: 16 * 1024 * 1024,
            oom_score_adj: 500,
            log_bytes: 1024 * 1024,
            log_files: 2,
        }
    }
}
