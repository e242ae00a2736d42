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
