//! The glue is layered: no file under `src/` imports, directly or through others, a file that
//! imports it back (a folder's `mod.rs` and its own files aside). docs/architecture.md draws the
//! layers; this test keeps the drawing honest.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path of a source file: `src/core/lock.rs` → `core::lock`, `src/commands/mod.rs` →
/// `commands`, `src/lib.rs` → `` (the crate root).
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("file under src/").with_extension("");
    let parts: Vec<String> =
        relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
    let parts = match parts.last().map(String::as_str) {
        Some("mod") | Some("lib") => &parts[..parts.len() - 1],
        _ => &parts[..],
    };
    parts.join("::")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The file's code above its first `#[cfg(test)]`, without comments (unit tests may import
/// anything).
fn code_of(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    code.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Expands one `use` tree (`crate::core::{args::X, lock::{Y, Z}}`) into flat paths.
fn expand(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    match tree.find('{') {
        None => out.push(format!("{prefix}{tree}")),
        Some(open) => {
            let head = &tree[..open];
            let inner = &tree[open + 1..tree.rfind('}').expect("balanced use tree")];
            let mut depth = 0;
            let mut start = 0;
            for (at, ch) in inner.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&inner[start..at], &format!("{prefix}{head}"), out);
                        start = at + 1;
                    }
                    _ => {}
                }
            }
            if !inner[start..].trim().is_empty() {
                expand(&inner[start..], &format!("{prefix}{head}"), out);
            }
        }
    }
}

/// Every `crate::…` or `super::…` path the code names, as written.
fn paths_in(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let boundary = at == 0 || !rest.as_bytes()[at - 1].is_ascii_alphanumeric();
        let tail = &rest[at + 4..];
        let Some(end) = tail.find(';') else { break };
        if boundary {
            expand(&tail[..end].replace('\n', " "), "", &mut paths);
        }
        rest = &tail[end..];
    }
    // Inline paths such as `crate::core::limits::MAX_FENCE` in expressions.
    let bytes = code.as_bytes();
    for keyword in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(found) = code[from..].find(keyword) {
            let start = from + found;
            let mut end = start;
            while end < bytes.len()
                && (bytes[end].is_ascii_alphanumeric() || b"_:".contains(&bytes[end]))
            {
                end += 1;
            }
            paths.push(code[start..end].trim_end_matches(':').to_owned());
            from = end.max(start + keyword.len());
        }
    }
    paths
        .into_iter()
        .filter(|path| path.starts_with("crate::") || path.starts_with("super::"))
        .collect()
}

/// The longest prefix of `path` (resolved from `module`) that is a file of its own.
fn target_of(module: &str, path: &str, modules: &BTreeSet<String>) -> Option<String> {
    let mut parts: Vec<&str> = if let Some(rest) = path.strip_prefix("crate::") {
        rest.split("::").collect()
    } else {
        let mut base: Vec<&str> = module.split("::").filter(|part| !part.is_empty()).collect();
        let mut rest = path;
        while let Some(next) = rest.strip_prefix("super::") {
            base.pop();
            rest = next;
        }
        base.extend(rest.split("::"));
        base
    };
    while !parts.is_empty() {
        let candidate = parts.join("::");
        if modules.contains(&candidate) {
            return Some(candidate);
        }
        parts.pop();
    }
    None
}

/// `a` is a folder's `mod.rs` and `b` one of its own files, or the reverse.
fn same_folder(a: &str, b: &str) -> bool {
    let parent = |module: &str| module.rsplit_once("::").map(|(head, _)| head.to_owned());
    parent(a).as_deref() == Some(b) || parent(b).as_deref() == Some(a)
}

fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|file| module_of(&src, file)).collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let module = module_of(&src, file);
        if module.is_empty() || module.ends_with("_tests") {
            continue; // lib.rs declares everything; test files may import anything
        }
        let text = std::fs::read_to_string(file).expect("read source file");
        let targets: BTreeSet<String> = paths_in(&code_of(&text))
            .iter()
            .filter_map(|path| target_of(&module, path, &modules))
            .filter(|target| {
                *target != module && !target.is_empty() && !same_folder(&module, target)
            })
            .collect();
        graph.insert(module, targets);
    }
    graph
}

/// A cycle through `start`, if any: the modules in order.
fn cycle_from(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_owned(), vec![start.to_owned()])];
    let mut seen = BTreeSet::new();
    while let Some((module, path)) = stack.pop() {
        for next in graph.get(&module).into_iter().flatten() {
            if next == start {
                let mut cycle = path.clone();
                cycle.push(start.to_owned());
                return Some(cycle);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

#[test]
fn no_file_under_src_imports_a_file_that_imports_it_back() {
    let graph = import_graph();
    assert!(graph.contains_key("apply") && graph.contains_key("core::lock"), "graph: {graph:?}");
    assert!(
        graph["commands::acquire"].contains("apply"),
        "the parser must see commands/acquire.rs use apply.rs: {:?}",
        graph["commands::acquire"]
    );
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|module| cycle_from(&graph, module))
        .map(|c| c.join(" → "))
        .collect();
    assert!(cycles.is_empty(), "import cycles among src/ files:\n{}", cycles.join("\n"));
}

#[test]
fn the_pure_core_imports_nothing_from_the_glue_or_redis() {
    let graph = import_graph();
    for (module, targets) in graph.iter().filter(|(module, _)| module.starts_with("core")) {
        for target in targets {
            assert!(target.starts_with("core"), "{module} imports the glue's {target}");
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/core");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    for file in files {
        let code = code_of(&std::fs::read_to_string(&file).expect("read"));
        assert!(!code.contains("redis_module"), "{} names redis_module", file.display());
    }
}

#[test]
fn the_blocked_client_layer_answers_and_counts_but_changes_no_lock() {
    // docs/architecture.md, "a waiter's own end": waiters.rs answers blocked clients, counts,
    // and asks the timer to prune; it reaches neither a lock nor anything that propagates.
    let graph = import_graph();
    let reached = &graph["waiters"];
    assert!(reached.contains("state"), "the parser must see waiters.rs use state.rs: {reached:?}");
    for target in reached {
        assert!(
            ["core", "core::registry", "state", "metrics"].contains(&target.as_str()),
            "waiters.rs reaches {target}"
        );
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/waiters.rs");
    let code = code_of(&std::fs::read_to_string(path).expect("read waiters.rs"));
    for name in [
        "Lock",
        "Step",
        "Transition",
        "open_key",
        "OpenKey",
        "DeleteKey",
        "replicate",
        "Replicate",
        "NotifyKeyspaceEvent",
        "PublishMessage",
        "SignalModifiedKey",
        "Log",
    ] {
        assert!(!code.contains(name), "waiters.rs names {name}");
    }
}

/// The layers of docs/architecture.md, top first: a file may import its own layer or one below,
/// never one above. A new file must be given its layer here.
fn layer_of(module: &str) -> usize {
    const LAYERS: [&[&str]; 4] = [
        // What Redis calls: commands, the timer, server events, the type, INFO, key specs.
        &["commands", "entry", "timer", "events", "datatype", "report", "keyspec"],
        // The one path from a decision to its effects, and the cluster bus.
        &["apply", "cluster"],
        // What the path uses: the index, blocked clients, announcements, counters, settings,
        // module state, the clock.
        &["expiry", "waiters", "notify", "metrics", "config", "state", "clock", "filter", "call"],
        // The pure core.
        &["core"],
    ];
    let top = module.split("::").next().unwrap_or(module);
    LAYERS
        .iter()
        .position(|layer| layer.contains(&top))
        .unwrap_or_else(|| panic!("src/{module}: give it a layer in tests/layers.rs"))
}

#[test]
fn every_import_points_down_the_layers_of_the_architecture_page() {
    let graph = import_graph();
    let mut upward = Vec::new();
    for (module, targets) in &graph {
        for target in targets {
            if layer_of(target) < layer_of(module) {
                upward.push(format!("{module} → {target}"));
            }
        }
    }
    assert!(upward.is_empty(), "imports that point up the layers:\n{}", upward.join("\n"));
    // The check sees what it should: a driver reaching the path, the path reaching the core.
    assert!(layer_of("commands::acquire") < layer_of("apply"));
    assert!(graph["apply"].iter().any(|target| target.starts_with("core")));
}

/// The crates a file's code (above its tests) names in `use` lines, beside `std`, `crate`,
/// `super`, `self` and the file's own submodules (`mod name;`).
fn external_crates(code: &str) -> BTreeSet<String> {
    let submodules: BTreeSet<&str> = code
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            line.strip_prefix("pub mod ").or_else(|| line.strip_prefix("mod "))?.strip_suffix(';')
        })
        .collect();
    code.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let path = line.strip_prefix("pub use ").or_else(|| line.strip_prefix("use "))?;
            let root = path.split("::").next()?.trim_end_matches(';').to_owned();
            let local = ["std", "core", "alloc", "crate", "super", "self"].contains(&root.as_str())
                || submodules.contains(root.as_str());
            (!local).then_some(root)
        })
        .collect()
}

#[test]
fn the_core_and_the_protocol_crate_reach_nothing_but_each_other_and_std() {
    // The core may use the protocol crate (the rules the clients share), and nothing else.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src/core"), &mut files);
    let mut used = BTreeSet::new();
    // Test files (`*_tests.rs`) may use test crates.
    let is_test = |file: &PathBuf| {
        file.file_stem().is_some_and(|stem| stem.to_string_lossy().ends_with("_tests"))
    };
    for file in files.iter().filter(|file| !is_test(file)) {
        for name in external_crates(&code_of(&std::fs::read_to_string(file).expect("read"))) {
            assert_eq!(name, "dlock_proto", "{} uses the crate {name}", file.display());
            used.insert(name);
        }
    }
    assert!(used.contains("dlock_proto"), "the parser must see the core use dlock_proto");
    // The protocol crate has no dependency at all, and no I/O or clock of its own.
    let manifest = std::fs::read_to_string(root.join("proto/Cargo.toml")).expect("read");
    let dependencies = manifest.split("[dependencies]").nth(1).expect("a [dependencies] table");
    let table = dependencies.split("\n[").next().unwrap_or("");
    assert!(
        table.lines().all(|line| line.trim().is_empty() || line.trim().starts_with('#')),
        "proto/Cargo.toml lists dependencies:{table}"
    );
    let mut files = Vec::new();
    rust_files(&root.join("proto/src"), &mut files);
    for file in files {
        let code = code_of(&std::fs::read_to_string(&file).expect("read"));
        for forbidden in ["std::net", "std::fs", "std::io", "std::time", "std::thread", "std::env"]
        {
            assert!(!code.contains(forbidden), "{} names {forbidden}", file.display());
        }
        assert!(external_crates(&code).is_empty(), "{} uses another crate", file.display());
    }
}
