//! The size cap of a persistent sandbox's data volume, and what to do with
//! the Docker volume that mounts it.
//!
//! Docker's local volume driver caps nothing by itself (`size=` is a tmpfs
//! option, and tmpfs is not persistent; `--storage-opt size` needs overlay2
//! on XFS with project quotas). What it can do is mount a block device. So
//! each capped volume is an ext4 file system of `--persistent-size` in a
//! sparse file on the Docker host (`DIR/NAME.KEY.img`, below), attached to
//! a loop device by a short privileged job, and the Docker volume is
//! `type=ext4,device=/dev/loopN`: a full volume is the engine's ENOSPC, the
//! host's disk is never touched beyond the file's size.
//!
//! Loop devices are numbered by the kernel, and their numbers do not survive
//! a reboot: `/dev/loop3` may then hold another sandbox's file. So before
//! every container that mounts a capped volume is created the job attaches
//! the file again (or finds it attached) and reports its device, and a
//! Docker volume naming another device is made again ([`judge`]); the data
//! is in the file, not in the Docker volume, which holds only how to mount
//! it.
//!
//! A file is keyed by the Docker volume it serves, not by the volume's
//! name alone: `DIR/NAME.KEY.img`, `KEY` 128 random bits made when the
//! Docker volume is created and kept in its label [`KEY_LABEL`]. A volume
//! lost without its file (`docker volume rm`, a prune, behind sandboxd's
//! back) takes its key with it, so the volume made next under that name
//! (the same sandbox's, or the next holder of the id's) gets a new, empty
//! file, never the old one; and since no live volume names the old file
//! then, the job removes every other file of the name before it makes the
//! new one ([`volume_of`]). A capped volume from before keys has no label
//! and keeps its `DIR/NAME.img`, until it is removed.

use std::collections::HashMap;

/// The file system of a capped volume (the Docker volume's `type` option).
pub const FS_TYPE: &str = "ext4";

/// Mount options of a capped volume (the Docker volume's `o` option).
pub const MOUNT_OPTIONS: &str = "nodev,nosuid";

/// The Docker volume label that names the key of a capped volume's file.
pub(crate) const KEY_LABEL: &str = "io.sandboxd.disk-key";

/// How many hex digits a key has (128 bits).
pub(crate) const KEY_DIGITS: usize = 32;

/// The key the label of an existing capped volume names, if it is a
/// well-formed one (it goes into a file name: anything else is ignored,
/// and the volume is treated as one from before keys).
pub(crate) fn key_of(labels: &HashMap<String, String>) -> Option<&str> {
    labels
        .get(KEY_LABEL)
        .map(String::as_str)
        .filter(|k| is_key(k))
}

fn is_key(k: &str) -> bool {
    k.len() == KEY_DIGITS && k.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The file of the capped volume `volume` whose key is `key` (`None`: a
/// volume from before keys), in the disks directory.
pub(crate) fn file_name(volume: &str, key: Option<&str>) -> String {
    match key {
        Some(key) => format!("{volume}.{key}.img"),
        None => format!("{volume}.img"),
    }
}

/// The volume whose file `file` (a name in the disks directory) is:
/// `NAME` of `NAME.img` or of `NAME.KEY.img`; `None` for anything else.
/// The job applies the same rule in shell when it looks for a name's
/// files (so `NAME.fork.img` is `NAME.fork`'s, never `NAME`'s).
pub(crate) fn volume_of(file: &str) -> Option<&str> {
    let stem = file.strip_suffix(".img")?;
    let volume = match stem.rsplit_once('.') {
        Some((volume, key)) if is_key(key) => volume,
        _ => stem,
    };
    (!volume.is_empty()).then_some(volume)
}

/// What to do with the Docker volume that exists under a capped volume's
/// name, given the loop device its file is attached to now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It mounts that device: use it.
    Use,
    /// It mounts another device (or a file system sandboxd did not make):
    /// remove it and create it again on that device.
    Remake,
    /// A plain volume from before size caps: its data lives in Docker's own
    /// directory, uncapped; used as it is (a new incarnation gets a capped
    /// one).
    Uncapped,
}

/// What to do with an existing Docker volume whose driver options are
/// `options`, when its file is attached to `device` now.
pub(crate) fn judge(options: &HashMap<String, String>, device: &str) -> Verdict {
    if options.is_empty() {
        return Verdict::Uncapped;
    }
    let is = |key: &str, value: &str| options.get(key).map(String::as_str) == Some(value);
    if is("type", FS_TYPE) && is("device", device) && is("o", MOUNT_OPTIONS) {
        Verdict::Use
    } else {
        Verdict::Remake
    }
}

/// The loop device the job reported (its line `device=/dev/loopN`), if
/// its output holds a well-formed one.
pub(crate) fn reported_device(output: &str) -> Option<&str> {
    output.lines().rev().find_map(|line| {
        let device = line.trim().strip_prefix("device=")?;
        let n = device.strip_prefix("/dev/loop")?;
        (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(device)
    })
}

/// The Docker volume's driver options for a file attached to `device`.
pub(crate) fn driver_options(device: &str) -> HashMap<String, String> {
    HashMap::from([
        ("type".to_owned(), FS_TYPE.to_owned()),
        ("device".to_owned(), device.to_owned()),
        ("o".to_owned(), MOUNT_OPTIONS.to_owned()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_volume_is_used_only_when_it_mounts_the_device_its_file_is_on_now() {
        let on = |device: &str| driver_options(device);
        let mut other_fs = on("/dev/loop3");
        other_fs.insert("type".into(), "xfs".into());
        let mut bind = HashMap::new();
        bind.insert("type".to_owned(), "none".to_owned());
        bind.insert("o".to_owned(), "bind".to_owned());
        bind.insert("device".to_owned(), "/".to_owned());
        let cases = [
            (on("/dev/loop3"), "/dev/loop3", Verdict::Use),
            // After a reboot the file came back on another device.
            (on("/dev/loop3"), "/dev/loop7", Verdict::Remake),
            (other_fs, "/dev/loop3", Verdict::Remake),
            (bind, "/dev/loop3", Verdict::Remake),
            (HashMap::new(), "/dev/loop3", Verdict::Uncapped),
        ];
        for (options, device, verdict) in cases {
            assert_eq!(judge(&options, device), verdict, "{options:?} {device}");
        }
    }

    #[test]
    fn a_file_is_a_volumes_only_under_its_exact_name_and_a_well_formed_key() {
        let key = "0123456789abcdef0123456789abcdef";
        let v = "sandboxd.d.a.redis";
        let cases = [
            (format!("{v}.img"), true),
            (format!("{v}.{key}.img"), true),
            (format!("{v}.{key}.img.new"), false),
            (format!("{v}.fork.{key}.img"), false),
            (format!("{v}.fork.img"), false),
            (format!("{v}.{}.img", &key[1..]), false),
            (format!("{v}.{}.img", key.to_uppercase()), false),
            (format!("{v}x.img"), false),
            ("sandboxd.d.ab.redis.img".to_owned(), false),
        ];
        for (file, is) in cases {
            assert_eq!(volume_of(&file) == Some(v), is, "{file}");
        }
        assert_eq!(
            volume_of(&format!("{v}.fork.{key}.img")),
            Some("sandboxd.d.a.redis.fork")
        );
        assert_eq!(volume_of(".img"), None);
        assert_eq!(volume_of("notes"), None);
        assert_eq!(file_name(v, Some(key)), format!("{v}.{key}.img"));
        assert_eq!(file_name(v, None), format!("{v}.img"));
        let labelled = |k: &str| HashMap::from([(KEY_LABEL.to_owned(), k.to_owned())]);
        assert_eq!(key_of(&labelled(key)), Some(key));
        for bad in [
            "",
            "../../etc",
            "0123",
            &key.to_uppercase(),
            &format!("{key}0"),
        ] {
            assert_eq!(key_of(&labelled(bad)), None, "{bad}");
        }
        assert_eq!(key_of(&HashMap::new()), None);
    }

    #[test]
    fn only_a_loop_device_the_job_reported_is_taken() {
        let cases = [
            ("device=/dev/loop0\n", Some("/dev/loop0")),
            ("mke2fs 1.47\ndevice=/dev/loop12", Some("/dev/loop12")),
            ("device=/dev/loop\n", None),
            ("device=/dev/sda1\n", None),
            ("device=/dev/loop1; rm -rf /\n", None),
            ("losetup: cannot find an unused loop device\n", None),
            ("", None),
        ];
        for (output, device) in cases {
            assert_eq!(reported_device(output), device, "{output:?}");
        }
    }
}
