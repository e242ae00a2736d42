//! Whole-file output that is never seen half-written: every file the crate and the
//! `torch-arena` command write (`convert -o`, `synth -o`, plots) goes through [`write()`].
//!
//! The bytes go to a temporary file beside the target (`.NAME.tmp-PID-N`, same folder, so the
//! rename stays on one file system), which is flushed, `fsync`ed and then renamed over the
//! target. Whatever fails before the rename (a write error such as a full disk, a panic in the
//! writer) removes the temporary file and leaves the old target as it was; a process killed
//! before the rename leaves the old target intact and at most a hidden `.NAME.tmp-*` beside it.
//!
//! A target that exists and is not a regular file (`/dev/stdout`, `/dev/null`, a FIFO) cannot be
//! replaced: it is written in place. A symbolic link is followed, so the file it names is
//! replaced and the link kept. A replaced file keeps its permissions.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Temporary files created by this process so far (makes each name unique).
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Removes the temporary file unless the rename happened.
struct TempFile {
    path: PathBuf,
    keep: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Writes `path` through `fill`, atomically: `fill` gets a buffered writer over a temporary file
/// beside `path`; once it returns `Ok` the file is flushed, synced and renamed over `path`. On
/// any error (from `fill`, the flush, the sync or the rename) the temporary file is removed,
/// `path` is left as it was and the error is returned.
pub fn write<T>(path: &Path, fill: impl FnOnce(&mut dyn Write) -> io::Result<T>) -> io::Result<T> {
    // Write through a symbolic link to the file it names (the link itself stays).
    let target = match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => fs::canonicalize(path)
            .ok()
            .filter(|t| fs::metadata(t).is_ok_and(|m| m.is_file()))
            .unwrap_or_else(|| path.to_path_buf()),
        _ => path.to_path_buf(),
    };
    let old = fs::metadata(&target).ok();
    if let Some(m) = &old
        && !m.is_file()
    {
        if m.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                "it is a folder; expected a file name",
            ));
        }
        // A device or a FIFO: there is nothing to replace, write to it directly.
        let mut out = BufWriter::new(OpenOptions::new().write(true).open(&target)?);
        let value = fill(&mut out)?;
        out.flush()?;
        return Ok(value);
    }
    let (file, tmp) = create_temp(&target)?;
    let mut tmp = TempFile {
        path: tmp,
        keep: false,
    };
    let mut out = BufWriter::new(file);
    let value = fill(&mut out)?;
    let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
    if let Some(m) = &old {
        // Best effort: a file we may write but not chmod keeps the default mode.
        let _ = file.set_permissions(m.permissions());
    }
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp.path, &target)?;
    tmp.keep = true;
    // Make the rename itself durable (best effort: not every file system syncs folders).
    if let Ok(d) = File::open(folder_of(&target)) {
        let _ = d.sync_all();
    }
    Ok(value)
}

/// The folder `path` is in (`.` for a bare name).
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates a new temporary file beside `target`, never opening an existing one (a link planted
/// under the name is not followed).
fn create_temp(target: &Path) -> io::Result<(File, PathBuf)> {
    let name = target
        .file_name()
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the path names no file (it ends in '..' or '/')",
            )
        })?
        .to_string_lossy()
        .into_owned();
    // Room for the prefix and suffix within a file name's 255 bytes.
    let mut cut = name.len().min(200);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let name = &name[..cut];
    let dir = folder_of(target);
    let mut tries = 0;
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.tmp-{}-{n}", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((f, tmp)),
            // Left over by a killed process that had our pid: take the next number.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 100 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("torch-arena-atomic-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Everything in `dir` but `keep`.
    fn others(dir: &Path, keep: &str) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != keep)
            .collect()
    }

    #[test]
    fn replaces_the_file_and_leaves_nothing_beside_it() {
        let dir = scratch("ok");
        let p = dir.join("out.txt");
        fs::write(&p, "old").unwrap();
        write(&p, |w| w.write_all(b"new")).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert!(others(&dir, "out.txt").is_empty());
        // A new file too, and a bare relative name's folder is '.'.
        write(&dir.join("fresh.txt"), |w| w.write_all(b"x")).unwrap();
        assert_eq!(fs::read(dir.join("fresh.txt")).unwrap(), b"x");
        assert_eq!(folder_of(Path::new("a.txt")), Path::new("."));
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A writer that fails part-way (as a full disk does) leaves the old file intact and no
    /// temporary file behind.
    #[test]
    fn a_failed_write_keeps_the_old_file_and_removes_the_partial_one() {
        let dir = scratch("fail");
        let p = dir.join("out.trace.gz");
        fs::write(&p, "a good old file").unwrap();
        let e = write(&p, |w| {
            // More than the BufWriter holds, so bytes reach the temporary file first.
            w.write_all(&vec![b'x'; 1 << 20])?;
            Err::<(), _>(io::Error::new(
                io::ErrorKind::StorageFull,
                "No space left on device",
            ))
        })
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert_eq!(fs::read(&p).unwrap(), b"a good old file");
        assert!(
            others(&dir, "out.trace.gz").is_empty(),
            "{:?}",
            others(&dir, "out.trace.gz")
        );
        // A panic in the writer: the same.
        let r = std::panic::catch_unwind(|| {
            let _ = write(&p, |w| -> io::Result<()> {
                w.write_all(&vec![b'y'; 1 << 20])?;
                panic!("writer failed")
            });
        });
        assert!(r.is_err());
        assert_eq!(fs::read(&p).unwrap(), b"a good old file");
        assert!(others(&dir, "out.trace.gz").is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn keeps_permissions_follows_links_and_writes_devices_in_place() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("meta");
        let p = dir.join("script.sh");
        fs::write(&p, "old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o750)).unwrap();
        write(&p, |w| w.write_all(b"new")).unwrap();
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o750
        );
        let link = dir.join("link.sh");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        write(&link, |w| w.write_all(b"through the link")).unwrap();
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read(&p).unwrap(), b"through the link");
        write(Path::new("/dev/null"), |w| w.write_all(b"discarded")).unwrap();
        // A name of 255 bytes (the most a file name may have) still gets a temporary file.
        let long = dir.join("é".repeat(127) + "x");
        write(&long, |w| w.write_all(b"long")).unwrap();
        assert_eq!(fs::read(&long).unwrap(), b"long");
        let e = write(&dir, |w| w.write_all(b"x")).unwrap_err();
        assert!(e.to_string().contains("folder"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
