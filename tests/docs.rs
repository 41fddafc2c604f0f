//! `docs/commands/*.md`, `COMMAND DOCS` and the key specs of `COMMAND INFO` say the same thing,
//! so none of them can drift; docs/operations.md describes every field of `INFO dlock`.

use std::collections::BTreeMap;

use dlock_testkit::*;

const COMMANDS: [&str; 15] = [
    "dlock.acquire",
    "dlock.renew",
    "dlock.release",
    "dlock.acquireall",
    "dlock.renewall",
    "dlock.releaseall",
    "dlock.revoke",
    "dlock.fencecheck",
    "dlock.info",
    "dlock.list",
    "dlock.top",
    "dlock.fenced",
    "dlock.setlease",
    "dlock.endlease",
    "dlock.setfence",
];

fn text(value: &redis::Value) -> String {
    match value {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

/// A flat `[name, value, …]` reply as a map.
fn pairs(value: &redis::Value) -> BTreeMap<String, redis::Value> {
    match value {
        redis::Value::Array(items) => {
            items.chunks(2).map(|pair| (text(&pair[0]), pair[1].clone())).collect()
        }
        redis::Value::Map(items) => items.iter().map(|(k, v)| (text(k), v.clone())).collect(),
        other => panic!("expected pairs, got {other:?}"),
    }
}

/// The syntax line Redis's own pages would print for these `COMMAND DOCS` arguments.
fn syntax(name: &str, arguments: Option<&redis::Value>) -> String {
    let mut line = name.to_uppercase();
    if let Some(redis::Value::Array(arguments)) = arguments {
        for argument in arguments {
            line.push(' ');
            line.push_str(&argument_syntax(argument));
        }
    }
    line
}

/// One argument as a syntax line shows it: `token name`, a block's parts in order, a one-of's
/// choices joined by ` | `, in brackets when optional (in angle brackets when a choice is
/// required).
fn argument_syntax(argument: &redis::Value) -> String {
    let fields = pairs(argument);
    let arg_name = text(&fields["name"]);
    let flags = fields.get("flags").map(|f| format!("{f:?}")).unwrap_or_default();
    let kind = fields.get("type").map(text).unwrap_or_default();
    let inner = |separator: &str| match fields.get("arguments") {
        Some(redis::Value::Array(parts)) => {
            parts.iter().map(argument_syntax).collect::<Vec<_>>().join(separator)
        }
        other => panic!("{arg_name}: no sub-arguments: {other:?}"),
    };
    let body = match kind.as_str() {
        "block" => inner(" "),
        "oneof" => inner(" | "),
        _ => arg_name.clone(),
    };
    let mut part = match fields.get("token") {
        Some(token) if kind == "pure-token" => text(token),
        Some(token) => format!("{} {body}", text(token)),
        None => body,
    };
    if flags.contains("multiple") {
        part = format!("{part} [{arg_name} ...]");
    }
    if flags.contains("optional") {
        part = format!("[{part}]");
    } else if kind == "oneof" {
        part = format!("<{part}>");
    }
    part
}

/// Every argument's name as its page documents it (a keyword alone by its keyword), nested
/// ones included, with the version that added it when it is later than its command's.
fn documented_names(arguments: &[redis::Value], out: &mut Vec<(String, Option<String>)>) {
    for argument in arguments {
        let fields = pairs(argument);
        match fields.get("arguments") {
            Some(redis::Value::Array(parts)) => {
                if fields.contains_key("token") {
                    out.push((text(&fields["token"]), fields.get("since").map(text)));
                }
                documented_names(parts, out);
            }
            _ => {
                let name = match fields.get("type").map(text).as_deref() {
                    Some("pure-token") => text(&fields["token"]),
                    _ => text(&fields["name"]),
                };
                out.push((name, fields.get("since").map(text)));
            }
        }
    }
}

/// The flags of a command's one key spec in `COMMAND INFO` (`RW`, `insert`, …); `None`: no key.
fn key_spec_flags(con: &mut redis::Connection, command: &str) -> Option<Vec<String>> {
    let reply: redis::Value =
        redis::cmd("COMMAND").arg("INFO").arg(command).query(con).expect("COMMAND INFO");
    let redis::Value::Array(commands) = reply else { panic!("COMMAND INFO: {reply:?}") };
    let Some(redis::Value::Array(info)) = commands.first() else {
        panic!("{command}: {commands:?}")
    };
    // Element 8 of a command's entry lists its key specs.
    let Some(redis::Value::Array(specs)) = info.get(8) else { panic!("{command}: {info:?}") };
    let spec = specs.first()?;
    match pairs(spec).get("flags") {
        Some(redis::Value::Array(flags)) => Some(flags.iter().map(text).collect()),
        other => panic!("{command} key spec flags: {other:?}"),
    }
}

/// What an ACL selector must grant on the key for these key spec flags, as Redis's ACL checks
/// it: the logical flags count (`access` needs read; `insert`, `update`, `delete` need write),
/// the `RO`/`RW`/`OW` flags do not.
fn acl_permission(flags: &[String]) -> &'static str {
    let read = flags.iter().any(|f| f == "access");
    let write = flags.iter().any(|f| matches!(f.as_str(), "insert" | "update" | "delete"));
    match (read, write) {
        (true, true) => "read and write",
        (true, false) => "read",
        (false, true) => "write",
        (false, false) => "none",
    }
}

/// The backquoted flags in the first parenthesis of a "Key access" line.
fn documented_flags(line: &str) -> Vec<String> {
    let inside = line.split_once('(').and_then(|(_, rest)| rest.split_once(')'));
    inside
        .map(|(flags, _)| flags.split(", ").map(|f| f.trim_matches('`').to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn every_key_access_line_matches_the_key_spec_and_the_acl_permission_it_implies() {
    let server = Server::start();
    let mut con = server.client();
    let docs_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/commands");
    for command in COMMANDS {
        let path = docs_dir.join(format!("{command}.md"));
        let page =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let line = field(&page, "Key access").unwrap_or_else(|| panic!("{command}: no Key access"));
        let Some(mut flags) = key_spec_flags(&mut con, command) else {
            assert!(line.starts_with("none"), "{command} takes no key: {line}");
            continue;
        };
        let mut documented = documented_flags(line);
        flags.sort();
        documented.sort();
        assert_eq!(documented, flags, "{command} key spec flags");
        let permission = acl_permission(&flags);
        assert!(
            line.contains(&format!("; ACL key permission: {permission}")),
            "{command} needs {permission}: {line}"
        );
    }
}

fn field<'a>(page: &'a str, label: &str) -> Option<&'a str> {
    page.lines().find_map(|line| line.strip_prefix(&format!("- **{label}:** ")))
}

#[test]
fn every_command_page_matches_command_docs() {
    let server = Server::start();
    let mut con = server.client();
    let docs_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/commands");
    for command in COMMANDS {
        let reply: redis::Value =
            redis::cmd("COMMAND").arg("DOCS").arg(command).query(&mut con).expect("DOCS");
        let docs = pairs(&reply);
        let docs = pairs(&docs[command]);
        let path = docs_dir.join(format!("{command}.md"));
        let page =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            field(&page, "Summary"),
            Some(text(&docs["summary"]).as_str()),
            "{command} summary"
        );
        assert_eq!(field(&page, "Since"), Some(text(&docs["since"]).as_str()), "{command} since");
        assert_eq!(
            field(&page, "Time complexity"),
            Some(text(&docs["complexity"]).as_str()),
            "{command} complexity"
        );
        let first_block = page.split("```").nth(1).map(str::trim).unwrap_or_default();
        assert_eq!(first_block, syntax(command, docs.get("arguments")), "{command} syntax");
        let arguments_section = page.split("## Arguments").nth(1).unwrap_or_default();
        if let Some(redis::Value::Array(arguments)) = docs.get("arguments") {
            let mut names = Vec::new();
            documented_names(arguments, &mut names);
            for (name, since) in names {
                assert!(
                    arguments_section.contains(&format!("`{name}`")),
                    "{command} documents `{name}`"
                );
                // An argument a later version added says so where it is documented.
                if let Some(since) = since {
                    // Its entry: the bullet whose first backquoted words name it.
                    let entry = arguments_section
                        .lines()
                        .find(|line| {
                            line.strip_prefix("- `")
                                .and_then(|rest| rest.split('`').next())
                                .is_some_and(|head| head.split(' ').any(|word| word == name))
                        })
                        .unwrap_or_default();
                    assert!(
                        entry.contains(&format!("since {since}")),
                        "{command}: `{name}` was added in {since}; its entry says so: {entry}"
                    );
                }
            }
        }
        assert_eq!(text(&docs["group"]), "module");
    }
}

/// Every test that docs/guarantees.md names exists (a `*` at the end stands for any ending), so
/// no row of the guarantee table leans on a test that was renamed or removed.
#[test]
fn every_test_the_guarantee_table_names_exists() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/guarantees.md")).expect("guarantees.md");
    let mut sources = String::new();
    let mut dirs = vec![
        root.join("tests"),
        root.join("src"),
        root.join("client/tests"),
        root.join("python/tests"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs" || ext == "py") {
                // A Python test is a `def name(`: read as `fn name(` here.
                let source = std::fs::read_to_string(&path).expect("read source");
                sources.push_str(&source.replace("def test_", "fn test_"));
            }
        }
    }
    let named: Vec<&str> = page
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| {
            name.matches('_').count() >= 3
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_*".contains(c))
        })
        .collect();
    assert!(named.len() > 20, "the table names its tests: {named:?}");
    for name in named {
        let found = match name.strip_suffix('*') {
            Some(prefix) => sources.contains(&format!("fn {prefix}")),
            None => sources.contains(&format!("fn {name}(")),
        };
        assert!(found, "docs/guarantees.md names `{name}`, which no test defines");
    }
}

/// Every field `INFO dlock` prints has its row in the table of docs/operations.md: by its name,
/// or, for a latency histogram's fields, by the row that names its `_count` and its suffix.
#[test]
fn every_info_dlock_field_has_its_row_in_operations_md() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/operations.md")).expect("operations.md");
    let rows: Vec<&str> = page.lines().filter(|line| line.starts_with("| `")).collect();
    let server = Server::start();
    let fields = dlock_counters(&mut server.client());
    assert!(fields.len() > 30, "{fields:?}");
    for name in fields.keys() {
        let named = |row: &&str| row.contains(&format!("`{name}`"));
        let histogram = |row: &&str| {
            ["count", "p50", "p95", "p99", "max"].iter().any(|suffix| {
                name.strip_suffix(suffix).and_then(|prefix| prefix.strip_suffix('_')).is_some_and(
                    |prefix| {
                        row.contains(&format!("`{prefix}_count`"))
                            && (*suffix == "count" || row.contains(&format!("`_{suffix}`")))
                    },
                )
            })
        };
        assert!(
            rows.iter().any(|row| named(row) || histogram(row)),
            "INFO dlock prints dlock_{name}, which docs/operations.md does not describe"
        );
    }
}
