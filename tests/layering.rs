//! The layering of the three crates, read from their sources (no compiler: the imports as text,
//! as a reviewer reads them): which file imports which, and which module of a crate imports
//! which other. Two rules, and ARCHITECTURE.md's table held to the code:
//!
//! 1. **No cycle among files.** No file imports a file that imports it back, directly or through
//!    others. A file "imports" another when it names an item through a path that ends in the
//!    other's module (`use crate::arena::Block`, `super::Inner`, `pages::map_run(..)`, a
//!    re-export included: naming `crate::arena::PoolId` depends on `arena/mod.rs`, which names
//!    `pool.rs`). Unit tests (`#[cfg(test)] mod tests { .. }`) are left out: they may reach any
//!    file they test.
//! 2. **Modules import one way.** Between the top-level modules of a crate, and between crates
//!    (cli → lab → plugin, Cargo enforces the crate order), every import goes to a module listed
//!    above it in ARCHITECTURE.md's table, and the table lists exactly what the code imports. On
//!    a mismatch the test prints the table the code has, to paste in after checking it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One crate of the workspace: its name in the table, the name other crates use for it, and the
/// root file of its module tree.
struct CrateSrc {
    table: &'static str,
    extern_name: &'static str,
    root: &'static str,
}

const CRATES: [CrateSrc; 3] = [
    CrateSrc {
        table: "plugin",
        extern_name: "torch_arena",
        root: "src/lib.rs",
    },
    CrateSrc {
        table: "lab",
        extern_name: "torch_arena_lab",
        root: "crates/lab/src/lib.rs",
    },
    CrateSrc {
        table: "cli",
        extern_name: "torch_arena_cli",
        root: "crates/cli/src/main.rs",
    },
];

/// A source file: its crate (index into `CRATES`), module path and text with comments, strings
/// and unit tests removed.
struct File {
    krate: usize,
    module: Vec<String>,
    path: PathBuf,
    code: String,
    children: Vec<String>,
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `code` without comments, string and char literals (their text replaced by nothing), so a
/// path inside a doc comment or a message is not an import.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            j += 1;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            i = j + close.len();
            out.push_str("\"\"");
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): skip only the former.
            if b.get(i + 1) == Some(&b'\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != b'\'' {
                    j += 1;
                }
                i = j + 1;
            } else if b.get(i + 2) == Some(&b'\'') {
                i += 3;
            } else if let Some(ch) = src[i + 1..].chars().next()
                && src[i + 1 + ch.len_utf8()..].starts_with('\'')
            {
                i += 2 + ch.len_utf8();
            } else {
                out.push('\'');
                i += 1;
            }
        } else {
            let ch = src[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// `code` without `#[cfg(test)] mod NAME { ... }` blocks.
fn without_unit_tests(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        let after = rest[at + "#[cfg(test)]".len()..].trim_start();
        let is_mod = after.starts_with("mod ") || after.starts_with("pub mod ");
        let open = after.find('{');
        let semi = after.find(';');
        match (is_mod, open) {
            (true, Some(open)) if semi.is_none_or(|s| s > open) => {
                out.push_str(&rest[..at]);
                let body = &after[open..];
                let mut depth = 0usize;
                let mut end = body.len();
                for (k, ch) in body.char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &body[end..];
            }
            (true, _) if semi.is_some() => {
                // `#[cfg(test)] mod tests;`: a unit-test file, left out as inline ones are.
                out.push_str(&rest[..at]);
                rest = &after[semi.unwrap() + 1..];
            }
            _ => {
                out.push_str(&rest[..at + 1]);
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The modules a file declares (`mod x;`, `pub mod x;`, `pub(crate) mod x;`), not inline ones.
fn declared_modules(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for stmt in code.split([';', '{', '}']) {
        let words: Vec<&str> = stmt.split_whitespace().collect();
        if let Some(k) = words.iter().position(|w| *w == "mod")
            && k + 2 == words.len()
            && words[..k]
                .iter()
                .all(|w| w.starts_with("pub") || w.starts_with('#'))
        {
            out.push(words[k + 1].to_string());
        }
    }
    // `mod x {` (inline) also ends in `{`: keep only those followed by `;` in the text.
    out.retain(|m| {
        code.contains(&format!("mod {m};"))
            || code.contains(&format!("mod {m} ;"))
            || code.contains(&format!("mod {m}\n;"))
    });
    out
}

/// Reads the module tree of every crate.
fn read_tree() -> Vec<File> {
    let mut files = Vec::new();
    for (k, c) in CRATES.iter().enumerate() {
        let mut todo = vec![(Vec::<String>::new(), repo().join(c.root))];
        while let Some((module, path)) = todo.pop() {
            let src = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            let code = without_unit_tests(&strip(&src));
            let children = declared_modules(&code);
            let name = path.file_name().unwrap().to_str().unwrap();
            let dir = if matches!(name, "mod.rs" | "lib.rs" | "main.rs") {
                path.parent().unwrap().to_path_buf()
            } else {
                path.with_extension("")
            };
            for child in &children {
                let flat = dir.join(format!("{child}.rs"));
                let nested = dir.join(child).join("mod.rs");
                let file = if flat.exists() { flat } else { nested };
                assert!(
                    file.exists(),
                    "{} declares `mod {child}` but neither {child}.rs nor {child}/mod.rs exists",
                    path.display()
                );
                let mut m = module.clone();
                m.push(child.clone());
                todo.push((m, file));
            }
            files.push(File {
                krate: k,
                module,
                path,
                code,
                children,
            });
        }
    }
    files
}

/// Expands a use tree (`a::{b, c::{self, d}}`) into paths; `as` aliases dropped.
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    fn split_top(s: &str) -> Vec<&str> {
        let (mut depth, mut start, mut parts) = (0, 0, Vec::new());
        for (i, c) in s.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&s[start..]);
        parts
    }
    fn go(prefix: &[String], s: &str, out: &mut Vec<Vec<String>>) {
        let s = s.trim();
        if s.is_empty() {
            return;
        }
        if let Some(open) = s.find('{') {
            let head: Vec<String> = s[..open]
                .split("::")
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect();
            let inner = &s[open + 1..s.rfind('}').unwrap_or(s.len())];
            let mut p = prefix.to_vec();
            p.extend(head);
            for part in split_top(inner) {
                go(&p, part, out);
            }
        } else {
            let s = s.split(" as ").next().unwrap().trim();
            let mut p = prefix.to_vec();
            let at_start = p.is_empty();
            p.extend(
                s.split("::")
                    .map(str::trim)
                    .filter(|x| !x.is_empty() && (at_start || *x != "self"))
                    .map(String::from),
            );
            out.push(p);
        }
    }
    let mut out = Vec::new();
    go(&[], tree, &mut out);
    out
}

/// Every path a file names: from its `use` statements and from `a::b::c` in its code.
fn paths_named(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let mut rest_code = String::new();
    let mut i = 0;
    while i < b.len() {
        let at_word = i == 0 || !is_ident_byte(b[i - 1]);
        if at_word
            && code[i..].starts_with("use")
            && b.get(i + 3).is_some_and(|c| c.is_ascii_whitespace())
        {
            let end = code[i..].find(';').map_or(b.len(), |e| i + e);
            out.extend(expand_use(&code[i + 3..end]));
            i = end + 1;
        } else {
            let ch = code[i..].chars().next().unwrap();
            rest_code.push(ch);
            i += ch.len_utf8();
        }
    }
    let r = rest_code.as_bytes();
    let mut i = 0;
    while i < r.len() {
        if is_ident_byte(r[i]) && (i == 0 || !is_ident_byte(r[i - 1]) && r[i - 1] != b':') {
            let mut j = i;
            let mut segs = Vec::new();
            loop {
                let s = j;
                while j < r.len() && is_ident_byte(r[j]) {
                    j += 1;
                }
                segs.push(rest_code[s..j].to_string());
                if rest_code[j..].starts_with("::")
                    && r.get(j + 2).is_some_and(|&c| is_ident_byte(c))
                {
                    j += 2;
                } else {
                    break;
                }
            }
            if segs.len() > 1 {
                out.push(segs);
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// The file a path names, from `file`: the deepest module the path walks through.
fn resolve(
    files: &[File],
    index: &HashMap<(usize, Vec<String>), usize>,
    from: usize,
    path: &[String],
) -> Option<usize> {
    let f = &files[from];
    let first = path.first()?;
    let (krate, mut module, rest) = if first == "crate" {
        (f.krate, Vec::new(), &path[1..])
    } else if first == "super" || first == "self" {
        let mut m = f.module.clone();
        let mut k = 0;
        while path.get(k).is_some_and(|s| s == "super" || s == "self") {
            if path[k] == "super" {
                m.pop()?;
            }
            k += 1;
        }
        (f.krate, m, &path[k..])
    } else if let Some(c) = CRATES.iter().position(|c| c.extern_name == first) {
        (c, Vec::new(), &path[1..])
    } else if f.children.contains(first) {
        (f.krate, f.module.clone(), path)
    } else {
        return None;
    };
    for seg in rest {
        let mut m = module.clone();
        m.push(seg.clone());
        if index.contains_key(&(krate, m.clone())) {
            module = m;
        } else {
            break;
        }
    }
    index.get(&(krate, module)).copied()
}

/// Every file's imports, as file indexes.
fn file_graph(files: &[File]) -> Vec<BTreeSet<usize>> {
    let index: HashMap<(usize, Vec<String>), usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| ((f.krate, f.module.clone()), i))
        .collect();
    (0..files.len())
        .map(|i| {
            paths_named(&files[i].code)
                .iter()
                .filter_map(|p| resolve(files, &index, i, p))
                .filter(|&j| j != i)
                .collect()
        })
        .collect()
}

/// The strongly connected components of more than one file (Tarjan).
fn cycles(graph: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct T<'a> {
        g: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(t: &mut T, v: usize) {
        t.index[v] = Some(t.next);
        t.low[v] = t.next;
        t.next += 1;
        t.stack.push(v);
        t.on[v] = true;
        for &w in t.g[v].iter() {
            match t.index[w] {
                None => {
                    visit(t, w);
                    t.low[v] = t.low[v].min(t.low[w]);
                }
                Some(iw) if t.on[w] => t.low[v] = t.low[v].min(iw),
                _ => {}
            }
        }
        if Some(t.low[v]) == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let n = graph.len();
    let mut t = T {
        g: graph,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            visit(&mut t, v);
        }
    }
    t.out
}

fn rel(p: &Path) -> String {
    p.strip_prefix(repo()).unwrap_or(p).display().to_string()
}

/// The top-level module a file belongs to, as the table names it (`arena`, `lib` for a crate
/// root's own code).
fn top(f: &File) -> String {
    f.module.first().cloned().unwrap_or_else(|| "root".into())
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let files = read_tree();
    let graph = file_graph(&files);
    let mut msg = String::new();
    for comp in cycles(&graph) {
        let set: BTreeSet<usize> = comp.iter().copied().collect();
        writeln!(msg, "a cycle of {} files:", comp.len()).unwrap();
        for &v in &set {
            for &w in graph[v].iter().filter(|w| set.contains(w)) {
                writeln!(msg, "  {} -> {}", rel(&files[v].path), rel(&files[w].path)).unwrap();
            }
        }
    }
    assert!(msg.is_empty(), "{msg}");
    assert!(files.len() > 60, "only {} files read", files.len());
}

/// The table the code has: per crate, each top-level module and what it imports (modules of its
/// own crate, then `plugin::`/`lab::` modules of the crates below), leaves first.
fn code_table(
    files: &[File],
    graph: &[BTreeSet<usize>],
) -> BTreeMap<(usize, String), BTreeSet<String>> {
    let mut table: BTreeMap<(usize, String), BTreeSet<String>> = BTreeMap::new();
    for (i, f) in files.iter().enumerate() {
        let me = top(f);
        let entry = table.entry((f.krate, me.clone())).or_default();
        for &j in &graph[i] {
            let g = &files[j];
            let them = top(g);
            if g.krate == f.krate {
                if them != me && them != "root" {
                    entry.insert(them);
                }
            } else {
                // A crate root's own items are its re-exports (`torch_arena::TorchArena`).
                let them = if them == "root" {
                    "lib".to_string()
                } else {
                    them
                };
                entry.insert(format!("{}::{them}", CRATES[g.krate].table));
            }
        }
    }
    table
}

/// ARCHITECTURE.md's table: the fenced block after the line `<!-- layering table -->`, one
/// line per module, `CRATE MODULE  IMPORTS  (comment)`; IMPORTS comma-separated or `nothing`.
fn doc_table() -> Vec<(String, String, BTreeSet<String>)> {
    let text = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    let at = text
        .find("<!-- layering table -->")
        .expect("ARCHITECTURE.md has no `<!-- layering table -->` marker before its import table");
    let block = text[at..]
        .split("```")
        .nth(1)
        .expect("a fenced block after the marker");
    let mut rows = Vec::new();
    for line in block.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let line = line.split(" (").next().unwrap();
        let mut words = line.splitn(3, char::is_whitespace).map(str::trim);
        let krate = words.next().unwrap().to_string();
        let rest = line[krate.len()..].trim_start();
        let (module, imports) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        let imports = imports.trim();
        let set = if imports == "nothing" || imports.is_empty() {
            BTreeSet::new()
        } else {
            imports.split(',').map(|s| s.trim().to_string()).collect()
        };
        rows.push((krate, module.to_string(), set));
    }
    rows
}

#[test]
fn modules_import_one_way_as_architecture_md_lists() {
    let files = read_tree();
    let graph = file_graph(&files);
    let code = code_table(&files, &graph);
    let doc = doc_table();
    let mut msg = String::new();
    // The table the code has, in the table's order where it has one, so a mismatch can be
    // pasted in once checked.
    let mut expected = String::new();
    let mut seen = BTreeSet::new();
    let mut above: BTreeSet<String> = BTreeSet::new();
    for (krate, module, imports) in &doc {
        let Some(k) = CRATES.iter().position(|c| c.table == krate) else {
            writeln!(
                msg,
                "table row `{krate} {module}`: no crate `{krate}` (plugin, lab, cli)"
            )
            .unwrap();
            continue;
        };
        let Some(real) = code.get(&(k, module.clone())) else {
            writeln!(
                msg,
                "table row `{krate} {module}`: the crate has no such top-level module"
            )
            .unwrap();
            continue;
        };
        seen.insert((k, module.clone()));
        if real != imports {
            writeln!(
                msg,
                "`{krate} {module}`: the table says it imports {imports:?}, the code imports {real:?}"
            )
            .unwrap();
        }
        for m in real {
            let q = if m.contains("::") {
                m.clone()
            } else {
                format!("{krate}::{m}")
            };
            // A crate's re-exports sit below all its modules (Cargo orders the crates).
            if !above.contains(&q) && !q.ends_with("::lib") {
                writeln!(
                    msg,
                    "`{krate} {module}` imports {m}, which is not above it in the table"
                )
                .unwrap();
            }
        }
        above.insert(format!("{krate}::{module}"));
        let list: Vec<&str> = real.iter().map(String::as_str).collect();
        writeln!(
            expected,
            "{krate:<7}{module:<16}{}",
            if list.is_empty() {
                "nothing".to_string()
            } else {
                list.join(", ")
            }
        )
        .unwrap();
    }
    for ((k, module), real) in &code {
        if module != "root" && !seen.contains(&(*k, module.clone())) {
            let list: Vec<&str> = real.iter().map(String::as_str).collect();
            writeln!(
                msg,
                "`{} {module}` is missing from the table",
                CRATES[*k].table
            )
            .unwrap();
            writeln!(
                expected,
                "{:<7}{module:<16}{}",
                CRATES[*k].table,
                list.join(", ")
            )
            .unwrap();
        }
    }
    assert!(msg.is_empty(), "{msg}\nthe code's table:\n{expected}");
}

#[test]
fn the_reader_sees_imports_written_every_way() {
    let code = strip(
        "use crate::a::{b, c::{self, D}};\n// crate::zz::x in a comment\nlet s = \"crate::yy\";\n\
         let c = '\"'; super::e::f(); pages::g(); r#\"crate::q\"#;\n",
    );
    let paths = paths_named(&code);
    let has = |p: &[&str]| paths.iter().any(|x| x == p);
    assert!(has(&["crate", "a", "b"]), "{paths:?}");
    assert!(has(&["crate", "a", "c"]), "{paths:?}");
    assert!(has(&["crate", "a", "c", "D"]), "{paths:?}");
    assert!(has(&["super", "e", "f"]), "{paths:?}");
    assert!(has(&["pages", "g"]), "{paths:?}");
    assert!(
        !paths
            .iter()
            .flatten()
            .any(|s| s == "zz" || s == "yy" || s == "q"),
        "{paths:?}"
    );
    let t = without_unit_tests(
        "fn a() {}\n#[cfg(test)]\nmod tests {\n use crate::x::y; { }\n}\nfn b() {}",
    );
    assert!(!t.contains("crate::x") && t.contains("fn b"), "{t}");
    let t = without_unit_tests("mod a;\n#[cfg(test)]\nmod tests;\nmod b;");
    assert_eq!(declared_modules(&t), ["a", "b"], "{t}");
    // A two-file cycle is found; a chain is not.
    let g = vec![
        BTreeSet::from([1]),
        BTreeSet::from([0]),
        BTreeSet::from([0]),
    ];
    assert_eq!(cycles(&g).len(), 1);
    let g = vec![BTreeSet::from([1]), BTreeSet::from([2]), BTreeSet::new()];
    assert!(cycles(&g).is_empty());
}

/// The plugin's files stay small enough to read whole: none over 800 lines, and the arena's
/// `mod.rs` (its types and the state behind the lock) at most 600.
#[test]
fn plugin_files_stay_short() {
    let files = read_tree();
    let mut long = Vec::new();
    for f in files.iter().filter(|f| f.krate == 0) {
        let lines = std::fs::read_to_string(&f.path).unwrap().lines().count();
        let limit = if rel(&f.path) == "src/arena/mod.rs" {
            600
        } else {
            800
        };
        if lines > limit {
            long.push(format!(
                "{} has {lines} lines (at most {limit})",
                rel(&f.path)
            ));
        }
    }
    assert!(long.is_empty(), "{}", long.join("\n"));
}

/// The arena's statistics change in one file: `accounting.rs` holds every update (`count_alloc`,
/// `count_free`, `count_created`, ...); the other files call it, and read `stats` at most.
#[test]
fn arena_statistics_change_only_in_accounting() {
    let dir = repo().join("src/arena");
    let mut found = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name == "accounting.rs" || !name.ends_with(".rs") {
            continue;
        }
        let code = without_unit_tests(&strip(&std::fs::read_to_string(&path).unwrap()));
        // `stats.<field>.increase(` and the like, `stats.<field> += 1`, `stats.reset_...(`.
        let flat: String = code.split_whitespace().collect::<Vec<_>>().join("");
        let mut rest = flat.as_str();
        while let Some(at) = rest.find("stats.") {
            let tail = &rest[at + "stats.".len()..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                .unwrap_or(tail.len());
            let path_part = &tail[..end];
            let next = &tail[end..];
            let mutating = [
                "increase",
                "decrease",
                "transfer",
                "reset_peak",
                "reset_accumulated",
            ]
            .iter()
            .any(|m| path_part.ends_with(m))
                || next.starts_with("+=")
                || next.starts_with("-=")
                || (next.starts_with('=') && !next.starts_with("=="));
            if mutating {
                found.push(format!(
                    "{name}: stats.{path_part}{}",
                    &next[..next.len().min(2)]
                ));
            }
            rest = &tail[end..];
        }
    }
    assert!(
        found.is_empty(),
        "stats updated outside accounting.rs:\n{}",
        found.join("\n")
    );
}
