//! File helpers that never leave a half-written file behind and never replace what they
//! should not: atomic writes, the run directory's lock, and checks of output paths.

use anyhow::{anyhow, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The directory `path` is in (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// The prefix of the temporary files [`write_atomic_with`] makes for `name`; the writer's
/// process id follows it.
fn temp_prefix(name: &str) -> String {
    format!(".{name}.tmp-")
}

/// An error unless `path` is absent or a regular file (not a directory, a device, a FIFO or
/// a symbolic link): only those may be replaced by a rename.
pub fn check_replaceable(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_file() => Err(io::Error::new(io::ErrorKind::InvalidInput, "it exists and is not a regular file; it is never replaced")),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Opens `path` (after symbolic links) for reading if it is a regular file. Anything else is
/// refused before it is opened: opening a FIFO waits for a writer, a device such as
/// /dev/zero never ends, and a directory is not a file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let meta = fs::metadata(path)?;
    if !meta.is_file() {
        let what = if meta.is_dir() { "a directory" } else { "not a regular file (a FIFO, a socket or a device is never read)" };
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("it is {what}")));
    }
    File::open(path)
}

/// The whole content of the regular file `path` (see [`open_regular`]).
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = open_regular(path)?;
    let mut bytes = Vec::with_capacity(file.metadata().map_or(0, |m| m.len() as usize));
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The whole content of the regular file `path` as UTF-8 text (see [`open_regular`]).
pub fn read_regular_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read_regular(path)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("it is not valid UTF-8 (invalid byte at offset {})", e.utf8_error().valid_up_to())))
}

/// Writes `path` atomically with `fill`, which writes the whole content: a temporary file in
/// the same directory is written through a buffer and fsynced, renamed over `path`, and the
/// directory is fsynced. A crash at any moment leaves either the old file or the new one,
/// never a mix; a failure removes the temporary file. `path` must be absent or a regular file.
pub fn write_atomic_with(path: &Path, fill: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
    check_replaceable(path)?;
    let dir = parent_dir(path);
    let tmp = temp_path(path).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let result = (|| {
        let mut f = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        fill(&mut f)?;
        let f = f.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The temporary file this process writes `path` through (see [`write_atomic_with`]):
/// `.NAME.tmp-PID` beside it; `None` for a path without a file name.
pub fn temp_path(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    Some(parent_dir(path).join(format!("{}{}", temp_prefix(&name.to_string_lossy()), std::process::id())))
}

/// Writes `bytes` to `path` atomically (see [`write_atomic_with`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(path, |w| w.write_all(bytes))
}

/// Removes the temporary files a killed writer of `path` left (see [`write_atomic_with`]),
/// other than this process's own. Only call it while holding the directory's [`RunLock`]:
/// then no other writer of `path` is alive.
pub fn remove_stale_temps(path: &Path) -> io::Result<usize> {
    let Some(name) = path.file_name() else { return Ok(0) };
    let prefix = temp_prefix(&name.to_string_lossy());
    let own = format!("{prefix}{}", std::process::id());
    let mut removed = 0;
    for entry in fs::read_dir(parent_dir(path))? {
        let entry = entry?;
        let file = entry.file_name().to_string_lossy().into_owned();
        let is_temp = file.strip_prefix(&prefix).is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
        if is_temp && file != own && entry.file_type()?.is_file() {
            fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Name of the lock file [`RunLock`] holds in a run directory.
pub const LOCK_FILE: &str = "train.lock";

/// An exclusive lock on a run directory (`DIR/train.lock`, holding the owner's process id),
/// held while the value lives. The kernel releases it when the process dies, however it dies,
/// so no stale lock outlives a killed run.
pub struct RunLock {
    _file: File,
}

impl RunLock {
    /// Locks `dir` (which must exist), or says which process holds it.
    pub fn acquire(dir: &Path) -> Result<RunLock> {
        let path = dir.join(LOCK_FILE);
        check_replaceable(&path).map_err(|e| anyhow!("cannot lock {}: {e}", path.display()))?;
        let mut file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(|e| anyhow!("cannot open {}: {e}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let who = if holder.is_empty() { "another process".to_string() } else { format!("process {holder}") };
                return Err(anyhow!("{} is in use by {who} (it holds {}); wait for that run to end or choose another --out", dir.display(), path.display()));
            }
            Err(fs::TryLockError::Error(e)) => return Err(anyhow!("cannot lock {}: {e}", path.display())),
        }
        let write_pid = |f: &mut File| -> io::Result<()> {
            f.set_len(0)?;
            f.rewind()?;
            writeln!(f, "{}", std::process::id())
        };
        write_pid(&mut file).map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
        Ok(RunLock { _file: file })
    }
}

/// `path` made absolute with its directory resolved (symbolic links, `..`), so that two
/// spellings of one file compare equal whether or not the file exists yet.
pub fn resolved(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    match (parent_dir(path).canonicalize(), path.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => path.to_path_buf(),
    }
}

/// Whether `a` and `b` name the same file (existing or not).
pub fn same_file(a: &Path, b: &Path) -> bool {
    resolved(a) == resolved(b)
}

/// An error if one of `outputs` (a flag and the file it names, if given) is the same file as
/// one of `taken` (what the run reads or writes otherwise, by how errors name it) or as an
/// earlier output.
pub fn check_outputs_distinct<'a>(mut taken: Vec<(&'a str, &'a Path)>, outputs: &[(&'a str, Option<&'a Path>)]) -> Result<()> {
    for &(flag, path) in outputs {
        let Some(path) = path else { continue };
        if let Some((other, _)) = taken.iter().find(|(_, p)| same_file(p, path)) {
            return Err(anyhow!("{flag} {} is the same file as {other}; choose another file", path.display()));
        }
        taken.push((flag, path));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("alpha-fsutil-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn atomic_writes_replace_regular_files_only() {
        let d = dir("replace");
        let file = d.join("a.txt");
        write_atomic(&file, b"one").unwrap();
        write_atomic(&file, b"two").unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"two");
        let sub = d.join("sub");
        fs::create_dir(&sub).unwrap();
        assert!(write_atomic(&sub, b"x").unwrap_err().to_string().contains("not a regular file"));
        assert!(sub.is_dir());
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&file, d.join("link")).unwrap();
            assert!(write_atomic(&d.join("link"), b"x").is_err());
            assert!(write_atomic(Path::new("/dev/null"), b"x").is_err());
            assert_eq!(fs::read(&file).unwrap(), b"two");
        }
        // A failed fill leaves the old file and no temporary file.
        let err = write_atomic_with(&file, |w| {
            w.write_all(b"partial")?;
            Err(io::Error::other("disk on fire"))
        });
        assert!(err.is_err());
        assert_eq!(fs::read(&file).unwrap(), b"two");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 3);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn stale_temporary_files_are_removed_and_nothing_else() {
        let d = dir("stale");
        let target = d.join("ckpt.safetensors");
        for name in
            [".ckpt.safetensors.tmp-123", ".ckpt.safetensors.tmp-9", ".ckpt.safetensors.tmp-", ".ckpt.safetensors.tmp-12x", "ckpt.safetensors", ".other.tmp-5"]
        {
            fs::write(d.join(name), b"x").unwrap();
        }
        assert_eq!(remove_stale_temps(&target).unwrap(), 2);
        let mut left: Vec<String> = fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, [".ckpt.safetensors.tmp-", ".ckpt.safetensors.tmp-12x", ".other.tmp-5", "ckpt.safetensors"]);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_locked_directory_names_its_holder() {
        let d = dir("lock");
        let held = RunLock::acquire(&d).unwrap();
        assert_eq!(fs::read_to_string(d.join(LOCK_FILE)).unwrap().trim(), std::process::id().to_string());
        let err = RunLock::acquire(&d).err().unwrap().to_string();
        assert!(err.contains("is in use by process") && err.contains(&std::process::id().to_string()), "{err}");
        drop(held);
        let again = RunLock::acquire(&d);
        assert!(again.is_ok());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn two_spellings_of_one_path_are_the_same_file() {
        let d = dir("same");
        fs::create_dir(d.join("x")).unwrap();
        assert!(same_file(&d.join("x/../new.txt"), &d.join("new.txt")));
        assert!(!same_file(&d.join("a.txt"), &d.join("b.txt")));
        fs::remove_dir_all(&d).unwrap();
    }
}
