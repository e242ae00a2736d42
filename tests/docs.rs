//! The docs stay true to the code: every configuration key the parser accepts is in the README's
//! table, and the table names no key the parser would refuse; every shipped snapshot is in
//! NOTICE; every section of a document that a code comment cites exists; every link of the
//! top-level documents resolves.

use torch_arena::config::{Config, accepted_keys};

const README: &str = include_str!("../README.md");

fn readme_keys() -> Vec<String> {
    let start = README
        .find("## Configuration")
        .expect("README has a Configuration section");
    let section = &README[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |e| e + 3);
    section[..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn readme_lists_every_configuration_key() {
    let documented = readme_keys();
    for (key, _) in accepted_keys() {
        assert!(
            documented.iter().any(|d| d == key),
            "README's configuration table lacks '{key}'"
        );
    }
    for key in &documented {
        // "???" is a bad value for most keys and a valid path for `trace`; either way the key
        // itself must be known.
        if let Err(e) = Config::parse(&format!("{key}:???")) {
            let err = e.to_string();
            assert!(
                !err.contains("unknown key"),
                "README documents '{key}', which the parser refuses: {err}"
            );
        }
    }
}

/// The snapshot corpus ships with its provenance: every file `index.csv` lists is in the folder and
/// has a NOTICE entry naming its source repository, commit and license as the index gives them, and
/// the folder holds no snapshot the index does not list.
#[test]
fn every_shipped_snapshot_has_its_source_and_license_in_notice() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/snapshots");
    let notice = std::fs::read_to_string(dir.join("NOTICE")).expect("traces/snapshots/NOTICE");
    let index = std::fs::read_to_string(dir.join("index.csv")).expect("traces/snapshots/index.csv");
    let mut rows = index.lines();
    let header: Vec<&str> = rows.next().expect("a header row").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (file, repo, commit, path, license) = (
        col("file"),
        col("repo"),
        col("commit"),
        col("path"),
        col("license"),
    );
    let mut listed = Vec::new();
    for row in rows.filter(|r| !r.is_empty()) {
        let f = csv_fields(row);
        let name = f[file].as_str();
        assert!(dir.join(name).is_file(), "index.csv lists {name}, missing");
        let entry = format!(
            "{name}\n  source:  {} @ {} : {}\n",
            f[repo], f[commit], f[path]
        );
        let at = notice
            .find(&entry)
            .unwrap_or_else(|| panic!("NOTICE lacks the entry for {name}: {entry:?}"));
        let lic_line = notice[at + entry.len()..].lines().next().unwrap_or("");
        assert!(
            lic_line.strip_prefix("  license: ") == Some(f[license].as_str()),
            "NOTICE gives {name} the license {lic_line:?}"
        );
        listed.push(name.to_string());
    }
    assert!(
        listed.len() >= 100,
        "only {} snapshots indexed",
        listed.len()
    );
    for e in std::fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if name.contains(".pickle") {
            assert!(listed.contains(&name), "{name} is not in index.csv");
        }
    }
}

/// The fields of one CSV row (quoted fields may hold commas; the index has no escaped quotes).
fn csv_fields(row: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let (mut cur, mut quoted) = (String::new(), false);
    for c in row.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    fields.push(cur);
    fields
}

/// Comment text of a source file: runs of comment lines (`//`, `///`, `//!`, `#`, ` * ` in C)
/// joined with spaces, so a citation broken over lines reads whole.
fn comment_runs(src: &str) -> Vec<String> {
    let mut runs = Vec::new();
    let mut cur = String::new();
    for line in src.lines() {
        let t = line.trim_start();
        let body = ["//!", "///", "//", "# ", "* "]
            .iter()
            .find_map(|m| t.strip_prefix(m))
            .or_else(|| (t == "#" || t == "*").then_some(""));
        match body {
            Some(b) => {
                cur.push(' ');
                cur.push_str(b.trim());
            }
            None if !cur.is_empty() => runs.push(std::mem::take(&mut cur)),
            None => {}
        }
    }
    if !cur.is_empty() {
        runs.push(cur);
    }
    runs
}

/// Every source file of the repository that code comments live in.
fn source_files() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut todo: Vec<std::path::PathBuf> = [
        "src", "crates", "tests", "python", "benches", "bench", "cpp_shim", "scripts",
    ]
    .iter()
    .map(|d| root.join(d))
    .collect();
    while let Some(p) = todo.pop() {
        if p.is_dir() {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name == "target" || name == "results" || name.starts_with('.') {
                continue;
            }
            for e in std::fs::read_dir(&p).unwrap() {
                todo.push(e.unwrap().path());
            }
        } else if p
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| ["rs", "py", "c", "cpp", "h"].contains(&e))
            || p.parent().is_some_and(|d| d.ends_with("scripts"))
        {
            out.push(p);
        }
    }
    out
}

/// A code comment that cites a section of one of the repository's documents
/// (`BENCHMARKS.md, "Drift"`, `docs/python.md, "Hunting leaks"`) cites one that exists: some
/// heading of that document contains the quoted words, or a bold label starts with them. Documents outside the repository
/// (`reference/...`, DESIGN.md) are not checked.
#[test]
fn every_section_a_code_comment_cites_exists() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    let mut missing = Vec::new();
    for file in source_files() {
        let Ok(src) = std::fs::read_to_string(&file) else {
            continue;
        };
        for run in comment_runs(&src) {
            let mut rest = run.as_str();
            while let Some(at) = rest.find(".md") {
                let before = &rest[..at];
                let start = before
                    .rfind(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c)))
                    .map_or(0, |i| i + 1);
                let doc = format!("{}.md", &before[start..]);
                let after = rest[at + 3..].trim_start_matches([',', ':']).trim_start();
                rest = &rest[at + 3..];
                let Some(quoted) = after.strip_prefix('"') else {
                    continue;
                };
                let Some(end) = quoted.find('"') else {
                    continue;
                };
                let section = &quoted[..end];
                let path = root.join(&doc);
                if doc.is_empty() || !path.is_file() {
                    continue;
                }
                checked += 1;
                let text = std::fs::read_to_string(&path).unwrap();
                // A heading, or a bold run-in label (`- **Growth steps, measured.** ...`).
                let found = text.lines().any(|l| {
                    (l.starts_with('#') && l.contains(section))
                        || l.contains(&format!("**{section}"))
                });
                if !found {
                    missing.push(format!(
                        "{} cites {doc}, \"{section}\": no heading of {doc} has those words",
                        file.strip_prefix(root).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    // The reader finds the citations (a dozen are known): it is not passing by reading none.
    assert!(checked >= 10, "only {checked} citations found");
}

/// GitHub's anchor for a heading: lower case, spaces to hyphens, punctuation other than `-` and
/// `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// Every relative link of README.md, ARCHITECTURE.md and BENCHMARKS.md names a file of the
/// repository, and every `#anchor` one of its headings: the status table and the docs index
/// point somewhere.
#[test]
fn every_link_of_the_top_level_docs_resolves() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    let mut broken = Vec::new();
    for doc in ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md"] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let Some(end) = tail.find(')') else { break };
            let target = &tail[..end];
            rest = &tail[end..];
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() {
                root.join(doc)
            } else {
                root.join(file)
            };
            checked += 1;
            if !path.exists() {
                broken.push(format!("{doc}: link to {target}: no file {file}"));
                continue;
            }
            if !frag.is_empty() {
                let linked = std::fs::read_to_string(&path).unwrap_or_default();
                let found = linked
                    .lines()
                    .filter_map(|l| l.strip_prefix('#'))
                    .map(|h| anchor(h.trim_start_matches('#')))
                    .any(|a| a == frag);
                if !found {
                    broken.push(format!(
                        "{doc}: link to {target}: no heading with that anchor"
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    assert!(checked >= 20, "only {checked} links found");
}
