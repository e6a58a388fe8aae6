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
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 512 * 1024 * 1024,
            nano_cpus: 1_000_000_000,
            pids: 256,
            tmpfs_bytes: 512 * 1024 * 1024,
        }
    }
}
