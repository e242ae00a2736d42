//! The docs stay true to the code: every configuration key the parser accepts is in the README's
//! table, and the table names no key the parser would refuse.

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
