//! The shape of the repo, as docs/architecture.md states it: the product apart from the
//! lab, mmkd's modules importing one way, files one sitting long, nothing pointing outside
//! the repo, and results on the results page only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The repo's files under `dir` (relative to the root), leaving out build output, git's
/// and the editor's hidden folders.
fn files_under(dir: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root().join(dir)];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || name == "target" || name == "__pycache__" {
                continue;
            }
            let path = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(t) if t.is_file() => out.push(path),
                _ => {}
            }
        }
    }
    out.sort();
    out
}

fn relative(p: &Path) -> String {
    p.strip_prefix(root())
        .unwrap_or(p)
        .to_string_lossy()
        .into_owned()
}

fn has_ext(p: &Path, exts: &[&str]) -> bool {
    p.extension()
        .is_some_and(|e| exts.contains(&e.to_string_lossy().as_ref()))
}

/// A source file's lines that are code: comments and what follows `#[cfg(test)]` left out.
fn code_lines(text: &str) -> Vec<&str> {
    text.lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect()
}

/// mmkd's layers, top to bottom: a module imports only from its own layer or below, and
/// no two modules import each other, directly or around a loop.
const LAYERS: &[&[&str]] = &[
    &["lib", "server", "config"],
    &["grpc", "metrics", "k8s"],
    &["node"],
    &[
        "store", "runner", "mps", "ksched", "backend", "learn", "joblog", "cgroup", "disk",
        "asuser", "auth", "tcp", "error", "slo",
    ],
    &["os", "job"],
];

/// The mmkd modules a file imports through `crate::`.
fn crate_imports(code: &[&str]) -> BTreeSet<String> {
    let text = code.join("\n");
    let mut found = BTreeSet::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                found.insert(name);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.insert(name);
        }
    }
    found
}

#[test]
fn mmkd_modules_import_one_way() {
    let layer_of: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, l)| l.iter().map(move |m| (*m, i)))
        .collect();
    let src = root().join("mmkd/src");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut upward = Vec::new();
    for file in files_under("mmkd/src")
        .into_iter()
        .filter(|p| has_ext(p, &["rs"]))
    {
        let rel = file.strip_prefix(&src).expect("under mmkd/src");
        if rel.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let top = rel
            .components()
            .next()
            .map(|c| {
                c.as_os_str()
                    .to_string_lossy()
                    .trim_end_matches(".rs")
                    .to_owned()
            })
            .expect("a module");
        let Some(&mine) = layer_of.get(top.as_str()) else {
            panic!("mmkd module {top} is in no layer: add it to LAYERS and docs/architecture.md");
        };
        let text = std::fs::read_to_string(&file).expect("read");
        for import in crate_imports(&code_lines(&text)) {
            if import == top {
                continue;
            }
            let Some(&theirs) = layer_of.get(import.as_str()) else {
                continue; // an item of lib.rs, such as `crate::Carried`
            };
            if theirs < mine {
                upward.push(format!("{} imports {import}", relative(&file)));
            }
            edges.entry(top.clone()).or_default().insert(import);
        }
    }
    assert!(
        upward.is_empty(),
        "imports up the layers (docs/architecture.md): {upward:#?}"
    );
    // No loop among the modules.
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if let Some(i) = path.iter().position(|p| p == n) {
            panic!("mmkd modules import each other: {:?}", &path[i..]);
        }
        if done.contains(n) {
            return;
        }
        path.push(n.to_owned());
        for d in edges.get(n).into_iter().flatten() {
            visit(d, edges, path, done);
        }
        path.pop();
        done.insert(n.to_owned());
    }
    let mut done = BTreeSet::new();
    for n in edges.keys() {
        visit(n, &edges, &mut Vec::new(), &mut done);
    }
}

/// The workspace's members, from its Cargo.toml.
fn members() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let line = text
        .lines()
        .find(|l| l.starts_with("members = ["))
        .expect("a members line");
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_product_depends_on_nothing_of_the_lab() {
    let lab_crates = ["mmk-lab", "mmk-simulator"];
    let product: Vec<String> = members()
        .into_iter()
        .filter(|m| m != "lab" && !m.starts_with("lab/"))
        .collect();
    assert!(product.len() > 10, "{product:?}");
    for m in &product {
        let manifest = std::fs::read_to_string(root().join(m).join("Cargo.toml")).expect("read");
        // The package's own dependency tables (the workspace's list is not one).
        let mut section = "";
        for line in manifest
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
        {
            if line.starts_with('[') {
                section = line;
                continue;
            }
            if !section.contains("dependencies") || section.contains("workspace") {
                continue;
            }
            let name = line.split(['.', ' ', '=']).next().unwrap_or("");
            assert!(
                !lab_crates.contains(&name) && !line.contains("\"lab/") && !line.contains("../lab"),
                "{m}/Cargo.toml depends on the lab: {line}"
            );
        }
    }
    // No product source or test reads a file of the lab.
    let mut reads = Vec::new();
    for m in &product {
        let dir = if m == "." { "src" } else { m.as_str() };
        let mut files = files_under(dir);
        if m == "." {
            files.extend(files_under("tests"));
            files.extend(files_under("benches"));
        }
        for f in files.into_iter().filter(|p| has_ext(p, &["rs"])) {
            let text = std::fs::read_to_string(&f).expect("read");
            for l in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
                if l.contains("\"lab/") || l.contains("../lab") || l.contains("/lab/") {
                    reads.push(format!("{}: {}", relative(&f), l.trim()));
                }
            }
        }
    }
    // This file names the lab to look for it.
    reads.retain(|l| !l.starts_with("tests/e2e/house.rs"));
    assert!(
        reads.is_empty(),
        "product code that reads the lab: {reads:#?}"
    );
}

#[test]
fn no_source_file_is_over_900_lines() {
    let mut long = Vec::new();
    for f in files_under(".").into_iter().filter(|p| has_ext(p, &["rs"])) {
        let rel = relative(&f);
        if rel.starts_with("tests/") || rel.contains("/tests/") || rel.ends_with("/tests.rs") {
            continue;
        }
        let n = std::fs::read_to_string(&f).expect("read").lines().count();
        if n > 900 {
            long.push(format!("{rel}: {n} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "files past one sitting (900 lines): {long:#?}"
    );
}

/// Whether a line names the notes that sit beside a clone (a path that starts with the
/// folder `shared`, or goes up to it), rather than a file of the repo.
fn points_outside(line: &str) -> bool {
    const FOLDER: &str = "shared/";
    line.contains(&format!("../{FOLDER}"))
        || line.contains("beside the repo")
        || line.match_indices(FOLDER).any(|(i, _)| {
            line[..i]
                .chars()
                .next_back()
                .is_none_or(|c| c.is_whitespace() || "`(\"'[".contains(c))
        })
}

#[test]
fn nothing_refers_to_a_path_outside_the_repo() {
    let mut found = Vec::new();
    for f in files_under(".").into_iter().filter(|p| {
        has_ext(
            p,
            &["rs", "md", "toml", "sh", "py", "yaml", "yml", "proto", "cu"],
        )
    }) {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for (n, l) in text.lines().enumerate() {
            if points_outside(l) {
                found.push(format!("{}:{}: {}", relative(&f), n + 1, l.trim()));
            }
        }
    }
    // This file names them to look for them.
    found.retain(|l| !l.starts_with("tests/e2e/house.rs"));
    assert!(found.is_empty(), "references outside the repo: {found:#?}");
}

#[test]
fn measured_results_live_on_the_results_page() {
    let mut found = Vec::new();
    for f in files_under("docs")
        .into_iter()
        .filter(|p| has_ext(p, &["md"]))
    {
        let rel = relative(&f);
        if rel == "docs/results.md" {
            continue;
        }
        let text = std::fs::read_to_string(&f).expect("read");
        for (n, l) in text.lines().enumerate() {
            let dated = l.as_bytes().windows(10).any(|w| {
                w.iter().enumerate().all(|(i, b)| match i {
                    4 | 7 => *b == b'-',
                    _ => b.is_ascii_digit(),
                }) && w.starts_with(b"20")
            });
            if dated || l.contains("lab/runs/") {
                found.push(format!("{rel}:{}: {}", n + 1, l.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "dated results or run records outside docs/results.md: {found:#?}"
    );
    assert!(
        root().join("docs/results.md").is_file(),
        "docs/results.md is the results page"
    );
}
