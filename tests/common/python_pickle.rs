//! Pickles written by CPython itself, for tests of the restricted unpickler on real bytes.

/// Pickle bytes written by CPython: `code` builds `obj` (plain data; `collections` is imported).
pub fn python_pickle(code: &str, protocol: u32) -> Vec<u8> {
    let script = format!(
        "import collections, pickle, sys\n{code}\nsys.stdout.buffer.write(pickle.dumps(obj, {protocol}))\n"
    );
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("python3 is needed to write test pickles (CI has it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
