//! The crate's shape, checked: no two files of `src/` depend on each other, directly or through
//! other files. A cycle means two files that cannot be read, tested or changed apart; shared
//! vocabulary belongs in a file of its own that both import.
//!
//! The layers, checked: every file of `src/` has a layer ([`LAYERS`]) and imports only the layers
//! its own allows — sources and the settle side never a sink, no sink a sibling sink.
//!
//! Three more checks of the shape, at the end of the file: no two public types share a name,
//! every module is named in docs/architecture.md, and no file has more than 800 lines before its
//! unit tests.
//!
//! A file depends on another when it names an item of it: a `use` of `crate::…`, `super::…`,
//! `self::…` or of a child module, or such a path written inline (`crate::a::B::new()`). A path
//! belongs to the deepest *file* it reaches (`crate::table::RowBuilder` is `table/mod.rs`,
//! `crate::table::batch::RowBuilder` is `table/batch.rs`); inline modules (`mod tests { … }`)
//! belong to their file. One kind of `use` is not a dependency: a `pub use` in which a module
//! re-exports items of its own child modules is the module's public face (`table/mod.rs`
//! re-exporting `batch::RowBuilder`), not something it reads.
//!
//! `src/main.rs` is a separate crate (the binary) and only uses the library, so it is left out.
//!
//! The files are scanned token by token (comments and literals dropped) rather than parsed with
//! a parser crate, so the check adds no dependency and no build time; it finds the same edges a
//! full parse does, and also the paths written inside macro calls (`format!`, `assert!`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A file of the library, by its module path (`["table", "batch"]`), with its source text.
struct SourceFile {
    module: Vec<String>,
    name: String,
    text: String,
}

/// Every `.rs` file under `src/` except `main.rs`, with its module path.
fn library_files(src: &Path) -> Vec<SourceFile> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(src, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .filter_map(|path| {
            let rel = path.strip_prefix(src).unwrap();
            let name = rel.to_string_lossy().replace('\\', "/");
            if name == "main.rs" {
                return None;
            }
            let mut module: Vec<String> = rel
                .with_extension("")
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            Some(SourceFile { module, name, text })
        })
        .collect()
}

/// One path a file names: where it is written (the module, inline modules included), the path's
/// segments, and whether it is a `pub use`.
struct Named {
    module: Vec<String>,
    segments: Vec<String>,
    public_use: bool,
}

/// The tokens of Rust source that matter here: identifiers (keywords included) and punctuation,
/// `::` as one token. Comments, string, byte-string, raw-string and character literals are
/// dropped, so a brace or a path inside them is not seen.
fn tokens(text: &str) -> Vec<String> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let ident_start = |ch: char| ch.is_alphabetic() || ch == '_';
    let ident_char = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_string(&c, i + 1);
        } else if (ch == 'r' || ch == 'b') && raw_or_byte_string(&c, i).is_some() {
            i = raw_or_byte_string(&c, i).unwrap();
        } else if ch == '\'' {
            // A character literal ('x', '\n', '\u{7f}', '\''), or a lifetime ('a), which stays.
            if next == Some('\\') {
                // Past the quote, the backslash and the escaped character.
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if ident_start(ch) {
            let start = i;
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
            out.push(c[start..i].iter().collect());
        } else if ch == ':' && next == Some(':') {
            out.push("::".to_string());
            i += 2;
        } else {
            out.push(ch.to_string());
            i += 1;
        }
    }
    out
}

/// The index after a string literal whose body starts at `i`.
fn skip_string(c: &[char], mut i: usize) -> usize {
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// If a raw string (`r"…"`, `r#"…"#`), byte string (`b"…"`, `br#"…"#`) or byte (`b'x'`) starts at
/// `i`, the index after it.
fn raw_or_byte_string(c: &[char], i: usize) -> Option<usize> {
    // `i` starts a token: identifiers are read whole, so this `b` or `r` is not inside one.
    let mut j = i;
    if c[j] == 'b' {
        j += 1;
        match c.get(j) {
            Some('"') => return Some(skip_string(c, j + 1)),
            Some('\'') => {
                let mut k = j + 1;
                if c.get(k) == Some(&'\\') {
                    k += 1;
                }
                k += 1;
                while k < c.len() && c[k] != '\'' {
                    k += 1;
                }
                return Some(k + 1);
            }
            Some('r') => {}
            _ => return None,
        }
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while c.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(j)
}

/// Every path a file names, by scanning its tokens: `use` trees (with their visibility), paths
/// written inline that start with `crate::`, `super::` or `self::`, and the inline modules
/// (`mod tests { … }`) they are written in.
fn named_paths(file_module: &[String], text: &str) -> Vec<Named> {
    let t = tokens(text);
    let mut found = Vec::new();
    let mut module = file_module.to_vec();
    // Brace depth at which each open inline module was entered.
    let mut open_modules: Vec<usize> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < t.len() {
        match t[i].as_str() {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if open_modules.last() == Some(&depth) {
                    open_modules.pop();
                    module.pop();
                }
            }
            "mod" if t.get(i + 2).map(String::as_str) == Some("{") => {
                module.push(t[i + 1].clone());
                open_modules.push(depth);
                depth += 1;
                i += 3;
                continue;
            }
            "use" if i == 0 || !matches!(t[i - 1].as_str(), "::" | ".") => {
                let public_use = is_public(&t, i);
                let end = (i..t.len()).find(|&k| t[k] == ";").unwrap_or(t.len());
                let mut k = i + 1;
                use_tree(&t[..end], &mut k, &mut Vec::new(), &mut |segments| {
                    found.push(Named {
                        module: module.clone(),
                        segments,
                        public_use,
                    })
                });
                i = end + 1;
                continue;
            }
            "crate" | "super" | "self"
                if t.get(i + 1).map(String::as_str) == Some("::")
                    && (i == 0 || t[i - 1] != "::") =>
            {
                let mut segments = vec![t[i].clone()];
                let mut k = i + 1;
                while t.get(k).map(String::as_str) == Some("::")
                    && t.get(k + 1).is_some_and(|s| is_ident(s))
                {
                    segments.push(t[k + 1].clone());
                    k += 2;
                }
                found.push(Named {
                    module: module.clone(),
                    segments,
                    public_use: false,
                });
                i = k;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Whether the `use` at `t[i]` is `pub` or `pub(…)`.
fn is_public(t: &[String], i: usize) -> bool {
    match i.checked_sub(1).map(|k| t[k].as_str()) {
        Some("pub") => true,
        Some(")") => {
            // pub(crate), pub(super), pub(in path)
            let open = (0..i).rev().find(|&k| t[k] == "(");
            open.is_some_and(|k| k > 0 && t[k - 1] == "pub")
        }
        _ => false,
    }
}

/// Reads one use tree from `t[*k..]`, calling `emit` with every path it names (a glob names the
/// path before it; `self` in a group names the group's path).
fn use_tree(
    t: &[String],
    k: &mut usize,
    prefix: &mut Vec<String>,
    emit: &mut dyn FnMut(Vec<String>),
) {
    let depth = prefix.len();
    if t.get(*k).map(String::as_str) == Some("::") {
        *k += 1; // a leading `::` (extern crate path)
    }
    loop {
        match t.get(*k).map(String::as_str) {
            Some("{") => {
                *k += 1;
                while *k < t.len() && t[*k] != "}" {
                    use_tree(t, k, prefix, emit);
                    if t.get(*k).map(String::as_str) == Some(",") {
                        *k += 1;
                    }
                }
                *k += 1;
                break;
            }
            Some("*") => {
                *k += 1;
                emit(prefix.clone());
                break;
            }
            Some(s) if is_ident(s) => {
                let name = s.to_string();
                *k += 1;
                if t.get(*k).map(String::as_str) == Some("::") {
                    prefix.push(name);
                    *k += 1;
                    continue;
                }
                if t.get(*k).map(String::as_str) == Some("as") {
                    *k += 2;
                }
                let mut segments = prefix.clone();
                if name != "self" {
                    segments.push(name);
                }
                emit(segments);
                break;
            }
            _ => break,
        }
    }
    prefix.truncate(depth);
}

/// The file-level dependency graph: file name → (file it depends on → one path that says so).
type Graph = BTreeMap<String, BTreeMap<String, String>>;

fn dependency_graph(files: &[SourceFile]) -> Graph {
    let by_module: BTreeMap<&[String], &str> = files
        .iter()
        .map(|f| (f.module.as_slice(), f.name.as_str()))
        .collect();
    let mut graph = Graph::new();
    for file in files {
        let edges = graph.entry(file.name.clone()).or_default();
        for named in named_paths(&file.module, &file.text) {
            let Some(absolute) = absolute_path(&named, &by_module) else {
                continue;
            };
            let Some(target) = (0..=absolute.len())
                .rev()
                .find_map(|n| by_module.get(&absolute[..n]).copied())
            else {
                continue;
            };
            let own_child =
                absolute.len() > file.module.len() && absolute.starts_with(&file.module);
            if target == file.name || (named.public_use && own_child) {
                continue;
            }
            edges
                .entry(target.to_string())
                .or_insert_with(|| named.segments.join("::"));
        }
    }
    graph
}

/// The path from the crate root, or `None` for paths outside the crate (std, other crates, items
/// of the module itself).
fn absolute_path(named: &Named, modules: &BTreeMap<&[String], &str>) -> Option<Vec<String>> {
    let mut segments = named.segments.iter().peekable();
    let mut base = match segments.peek().map(|s| s.as_str()) {
        Some("crate") => {
            segments.next();
            Vec::new()
        }
        Some("self") | Some("super") => named.module.clone(),
        Some(first) => {
            // A 2018-edition relative path: `use batch::X` inside `table` names `table::batch`.
            let mut child = named.module.clone();
            child.push(first.to_string());
            if !modules.contains_key(child.as_slice()) {
                return None;
            }
            named.module.clone()
        }
        None => return None,
    };
    while let Some(s) = segments.peek() {
        match s.as_str() {
            "self" => {}
            "super" => {
                base.pop()?;
            }
            _ => break,
        }
        segments.next();
    }
    base.extend(segments.cloned());
    Some(base)
}

/// Every cycle of the graph (one per strongly connected component of more than one file), each as
/// `a.rs -> b.rs (via path) -> a.rs`.
fn cycles(graph: &Graph) -> Vec<String> {
    // Tarjan's algorithm, recursive: the graph is small.
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        components: Vec<Vec<&'g str>>,
    }
    fn connect<'g>(s: &mut State<'g>, v: &'g str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flat_map(|e| e.keys()) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                connect(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.components.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            connect(&mut s, v);
        }
    }
    s.components
        .iter()
        .map(|component| describe_cycle(graph, component))
        .collect()
}

/// One concrete cycle through the first file of a component, found by breadth-first search.
fn describe_cycle(graph: &Graph, component: &[&str]) -> String {
    let inside: BTreeSet<&str> = component.iter().copied().collect();
    let start = *inside.iter().next().unwrap();
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in graph[v].keys().map(String::as_str) {
            if !inside.contains(w) || came_from.contains_key(w) {
                continue;
            }
            came_from.insert(w, v);
            if w == start {
                queue.clear();
                break;
            }
            queue.push_back(w);
        }
    }
    let mut hops = vec![start];
    let mut at = came_from[start];
    while at != start {
        hops.push(at);
        at = came_from[at];
    }
    hops.push(start);
    hops.reverse();
    let mut text = hops[0].to_string();
    for pair in hops.windows(2) {
        text.push_str(&format!(
            " -> {} (via {})",
            pair[1], graph[pair[0]][pair[1]]
        ));
    }
    text
}

#[test]
fn no_file_of_src_imports_itself_through_others() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = library_files(&src);
    assert!(files.len() > 40, "found only {} files in src/", files.len());
    let graph = dependency_graph(&files);
    // The graph is real: a file known to depend on another has the edge.
    assert!(
        graph["encode/avro.rs"].contains_key("message.rs"),
        "{:?}",
        graph["encode/avro.rs"]
    );
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "files of src/ that depend on each other (move what both need into a file of its own):\n  {}",
        found.join("\n  ")
    );
}

/// The module-level graph: each file stands for the top-level module it belongs to
/// (`upload/offset.rs` is `upload`, `app.rs` is `app`); an edge is kept with the file-level edge
/// that makes it.
fn module_graph(files: &Graph) -> Graph {
    let top = |file: &str| {
        file.split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string()
    };
    let mut graph = Graph::new();
    for (from, edges) in files {
        let entry = graph.entry(top(from)).or_default();
        for (to, via) in edges {
            if top(to) != top(from) {
                entry
                    .entry(top(to))
                    .or_insert_with(|| format!("{from} -> {to}: {via}"));
            }
        }
    }
    graph
}

#[test]
fn no_module_of_src_imports_one_that_imports_it() {
    // Arrows between the crate's top-level modules run one way: a lower layer (message, upload,
    // telemetry) never names a higher one (sink, settle, app). Two modules that name each other,
    // even through different files, are one module in disguise.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&dependency_graph(&library_files(&src)));
    assert!(graph["sink"].contains_key("upload"), "{:?}", graph["sink"]);
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "modules of src/ that depend on each other (the arrow that runs back up must go):\n  {}",
        found.join("\n  ")
    );
}

/// The files and folders of `src/` that sit above the sources and must not name one: the sinks
/// and what they are built of, the pipeline and the binary. They see a source only through the
/// neutral vocabulary every source shares (the `Source` trait and its events) and the registry.
const ABOVE_SOURCES: [&str; 13] = [
    "sink/",
    "table/",
    "encode/",
    "upload/",
    "durable.rs",
    "app.rs",
    "main.rs",
    "command/",
    "pipeline.rs",
    "connect.rs",
    "input.rs",
    "shape.rs",
    "settle/",
];

#[test]
fn nothing_above_the_sources_names_a_source() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let above = |name: &str| {
        ABOVE_SOURCES
            .iter()
            .any(|a| name == *a || (a.ends_with('/') && name.starts_with(a)))
    };
    let files = library_files(&src);
    let graph = dependency_graph(&files);
    let mut found: Vec<String> = graph
        .iter()
        .filter(|(from, _)| above(from))
        .flat_map(|(from, edges)| {
            edges
                .iter()
                .filter(|(to, _)| to.starts_with("source/"))
                .map(move |(to, via)| format!("{from} -> {to} (via {via})"))
        })
        .collect();
    // `main.rs` is the binary: it names the library as `subsink::…`.
    let main = std::fs::read_to_string(src.join("main.rs")).unwrap();
    let t = tokens(&main);
    for w in t.windows(3) {
        if w[0] == "subsink" && w[1] == "::" && w[2] == "source" {
            found.push("main.rs -> subsink::source".to_string());
            break;
        }
    }
    assert!(
        found.is_empty(),
        "files above the sources that name one (use the registry or the shared vocabulary):\n  {}",
        found.join("\n  ")
    );
}

/// The layers of `src/`, low to high, each with the layers its files may import (its own among
/// them). A file belongs to the layer of the longest prefix below that names it (`cli/values.rs`
/// before `cli/`); a file no prefix names has no layer, and the test says so. Sources and sinks
/// are siblings that never name each other: what both need is in `receipt/` below them.
const LAYERS: [(&str, &[&str], &[&str]); 13] = [
    (
        "foundation",
        &["foundation"],
        &[
            "avro/",
            "batch.rs",
            "checkpoint_file.rs",
            "civil.rs",
            "cli/env.rs",
            "cli/mod.rs",
            "cli/subscription.rs",
            "cli/transforms.rs",
            "cli/values.rs",
            "config/",
            "encode/",
            "filter/",
            "flow.rs",
            "gauth.rs",
            "ids.rs",
            "jsonscan.rs",
            "kafka.rs",
            "message.rs",
            "message/",
            "naming.rs",
            "paths.rs",
            "position.rs",
            "pubsub/",
            "resources.rs",
            "shutdown.rs",
            "summary.rs",
            "table/",
            "telemetry/",
            "transform/",
            "upload/",
        ],
    ),
    // What a source, the settle side and a sink share about a message and its file.
    ("receipts", &["foundation", "receipts"], &["receipt/"]),
    // What every source hands the pipeline, and the run's shaping of a message.
    (
        "source vocabulary",
        &["foundation", "receipts", "source vocabulary"],
        &["input.rs", "shape.rs"],
    ),
    (
        "settle",
        &["foundation", "receipts", "source vocabulary", "settle"],
        &["settle/"],
    ),
    (
        "source seam",
        &[
            "foundation",
            "receipts",
            "source vocabulary",
            "settle",
            "source seam",
        ],
        &["connect.rs"],
    ),
    (
        "sources",
        &[
            "foundation",
            "receipts",
            "source vocabulary",
            "settle",
            "source seam",
            "sources",
        ],
        &["source/"],
    ),
    (
        "source registry",
        &[
            "foundation",
            "receipts",
            "source vocabulary",
            "settle",
            "source seam",
            "sources",
            "source registry",
        ],
        &["registry.rs"],
    ),
    // What every sink shares and answers to: the traits, the open-file lifecycle, the one
    // ordering mechanism, the schema watch, the commit at close, and the registration seam
    // (what a sink's `register.rs` implements), as `connect.rs` is for the sources.
    (
        "sink seam",
        &["foundation", "receipts", "sink seam"],
        &[
            "sink/mod.rs",
            "sink/files.rs",
            "sink/order.rs",
            "sink/chunk.rs",
            "sink/commit_at_close.rs",
            "sink/schema_watch.rs",
            "sink/registry/build_error.rs",
            "sink/registry/claim.rs",
            "sink/registry/options.rs",
            "sink/registry/spec.rs",
            "sink/registry/table.rs",
        ],
    ),
    (
        "sinks",
        &["foundation", "receipts", "sink seam", "sinks"],
        &["sink/"],
    ),
    // The list of sinks, one line each, as `registry.rs` is for the sources.
    (
        "sink registry",
        &[
            "foundation",
            "receipts",
            "sink seam",
            "sinks",
            "sink registry",
        ],
        &["sink/registry/mod.rs"],
    ),
    // What drives a sink: its files made durable, its spec built from a subscription.
    (
        "sink drivers",
        &[
            "foundation",
            "receipts",
            "sink seam",
            "sink registry",
            "sink drivers",
        ],
        &["durable.rs", "cli/destination.rs", "cli/validate.rs"],
    ),
    (
        "pipeline",
        &[
            "foundation",
            "receipts",
            "source vocabulary",
            "settle",
            "source seam",
            "source registry",
            "sink seam",
            "sink registry",
            "sink drivers",
            "pipeline",
        ],
        &["pipeline.rs", "app.rs"],
    ),
    (
        "commands",
        &[
            "foundation",
            "receipts",
            "source vocabulary",
            "settle",
            "source seam",
            "sources",
            "source registry",
            "sink seam",
            "sinks",
            "sink registry",
            "sink drivers",
            "pipeline",
            "commands",
        ],
        &["command/", "serve/", "inspect/"],
    ),
];

/// Edges the layers forbid that are being removed now (each names who removes it); empty when
/// none is. Each entry is `from -> to`.
const KNOWN: [&str; 0] = [];

/// The layer of a file of `src/`: the longest prefix of [`LAYERS`] that names it.
fn layer_of(name: &str) -> Option<&'static str> {
    LAYERS
        .iter()
        .flat_map(|(layer, _, files)| files.iter().map(move |f| (*layer, *f)))
        .filter(|(_, f)| name == *f || (f.ends_with('/') && name.starts_with(f)))
        .max_by_key(|(_, f)| f.len())
        .map(|(layer, _)| layer)
}

#[test]
fn every_module_of_src_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = library_files(&src);
    let without: Vec<&str> = files
        .iter()
        .map(|f| f.name.as_str())
        .filter(|name| *name != "lib.rs" && layer_of(name).is_none())
        .collect();
    assert!(
        without.is_empty(),
        "modules of src/ without a layer (give each one in LAYERS of tests/architecture.rs):\n  {}",
        without.join("\n  ")
    );
    assert_eq!(layer_of("cli/values.rs"), Some("foundation"));
    assert_eq!(layer_of("cli/destination.rs"), Some("sink drivers"));
    assert_eq!(layer_of("source/kafka/settle.rs"), Some("sources"));
}

#[test]
fn nothing_imports_a_module_of_a_layer_it_may_not() {
    // Arrows run down the layers: a source or the settle side never names a sink (they share
    // `receipt/`), a sink never names a source, nothing low names the pipeline.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = dependency_graph(&library_files(&src));
    let may = |from: &str, to: &str| {
        let (Some(a), Some(b)) = (layer_of(from), layer_of(to)) else {
            return true; // a file without a layer fails the test above
        };
        LAYERS
            .iter()
            .find(|(layer, _, _)| *layer == a)
            .is_some_and(|(_, allowed, _)| allowed.contains(&b))
    };
    let mut found = Vec::new();
    for (from, edges) in &graph {
        for (to, via) in edges {
            if may(from, to) {
                continue;
            }
            let edge = format!("{from} -> {to}");
            if KNOWN.contains(&edge.as_str()) {
                continue;
            }
            let (a, b) = (layer_of(from).unwrap(), layer_of(to).unwrap());
            found.push(format!("{edge} (via {via}): {a} may not import {b}"));
        }
    }
    assert!(
        found.is_empty(),
        "files of src/ that import a layer they may not (move the shared part down, e.g. into receipt/):\n  {}",
        found.join("\n  ")
    );
    let edges: BTreeSet<String> = graph
        .iter()
        .flat_map(|(from, edges)| edges.keys().map(move |to| format!("{from} -> {to}")))
        .collect();
    let stale: Vec<&&str> = KNOWN.iter().filter(|k| !edges.contains(**k)).collect();
    assert!(
        stale.is_empty(),
        "KNOWN edges that are gone (drop them): {stale:?}"
    );
    // The check is real: the allow-list refuses a source naming a sink.
    assert!(!may("source/file/mod.rs", "sink/object.rs"));
    assert!(!may("settle/mod.rs", "sink/mod.rs"));
    assert!(may("sink/object.rs", "receipt/ack.rs"));
}

/// The sink a file of `sink/` belongs to (`sink/delta/out.rs` is `delta`), `None` for what the
/// sinks share and the list of them (the layers "sink seam" and "sink registry").
fn sink_of(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("sink/")?;
    if layer_of(name) != Some("sinks") {
        return None;
    }
    Some(rest.split('/').next().unwrap().trim_end_matches(".rs"))
}

#[test]
fn no_sink_imports_a_sibling_sink() {
    // A sink is one folder (or file) of `sink/`; what two sinks share lives in `sink/` itself.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = dependency_graph(&library_files(&src));
    let found: Vec<String> = graph
        .iter()
        .flat_map(|(from, edges)| edges.iter().map(move |(to, via)| (from, to, via)))
        .filter(|(from, to, _)| {
            matches!((sink_of(from), sink_of(to)), (Some(a), Some(b)) if a != b)
                && !KNOWN.contains(&format!("{from} -> {to}").as_str())
        })
        .map(|(from, to, via)| format!("{from} -> {to} (via {via})"))
        .collect();
    assert!(
        found.is_empty(),
        "sinks that import a sibling sink (move what they share into sink/):\n  {}",
        found.join("\n  ")
    );
    assert_eq!(sink_of("sink/delta/out.rs"), Some("delta"));
    assert_eq!(sink_of("sink/files.rs"), None);
}

fn made_up(files: &[(&str, &str)]) -> Vec<SourceFile> {
    files
        .iter()
        .map(|(name, text)| {
            let mut module: Vec<String> = name
                .trim_end_matches(".rs")
                .split('/')
                .map(str::to_string)
                .collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            SourceFile {
                module,
                name: name.to_string(),
                text: text.to_string(),
            }
        })
        .collect()
}

#[test]
fn the_check_finds_cycles_through_use_super_and_inline_paths() {
    let files = made_up(&[
        ("lib.rs", "pub mod a; pub mod b;"),
        ("a/mod.rs", "pub mod x; pub mod y; pub use x::X;"),
        ("a/x.rs", "use super::y::Y; pub struct X;"),
        (
            "a/y.rs",
            r##"pub struct Y; fn f() { let _ = crate::b::g(); let _c = '{'; let _q = '\'';
            let _s = "crate::a::x::X } \" }"; /* crate::a::x::X } */ let _r = r#"}"# ; }
            // crate::a::x::X }
            fn h<'a>(_: &'a str) -> u8 { b'}' }
            mod t { const S: &str = "{"; const C: char = '{'; /* { */ }
            fn after() { let _ = super::Y; }"##,
        ),
        (
            "b.rs",
            "pub(crate) fn g() {} mod tests { use super::*; use crate::a::X; }",
        ),
    ]);
    let graph = dependency_graph(&files);
    assert_eq!(graph["a/x.rs"].keys().collect::<Vec<_>>(), ["a/y.rs"]);
    // `pub use x::X` is a/mod.rs re-exporting its child: no edge.
    assert!(graph["a/mod.rs"].is_empty(), "{:?}", graph["a/mod.rs"]);
    // Paths in literals and comments are not dependencies, nor are their braces braces: a/y.rs
    // names b.rs, and a/mod.rs from `fn after` (outside `mod t`) only.
    assert_eq!(
        graph["a/y.rs"].keys().collect::<Vec<_>>(),
        ["a/mod.rs", "b.rs"]
    );
    // `crate::a::X` ends in a/mod.rs; `use super::*` inside `mod tests` is b.rs itself;
    // `pub(crate)` is no path.
    assert_eq!(graph["b.rs"].keys().collect::<Vec<_>>(), ["a/mod.rs"]);
    assert!(cycles(&graph).is_empty());

    let files = made_up(&[
        ("lib.rs", "pub mod a; pub mod b;"),
        ("a/mod.rs", "pub mod x; pub mod y;"),
        ("a/x.rs", "use super::y::Y; pub struct X;"),
        ("a/y.rs", "pub struct Y; fn f() { crate::b::g(); }"),
        ("b.rs", "pub fn g() { let _ = crate::a::x::X; }"),
    ]);
    assert_eq!(
        cycles(&dependency_graph(&files)),
        ["a/x.rs -> a/y.rs (via super::y::Y) -> b.rs (via crate::b::g) -> a/x.rs (via crate::a::x::X)"]
    );
    // The same files as modules: `a` and `b` name each other.
    assert_eq!(
        cycles(&module_graph(&dependency_graph(&files))),
        ["a -> b (via a/y.rs -> b.rs: crate::b::g) -> a (via b.rs -> a/x.rs: crate::a::x::X)"]
    );
}

/// Every public type of a file: `pub struct`, `enum`, `trait`, `type` or `union`, by name. A type
/// declared `pub(crate)`, `pub(super)` or private is not public, and may share a name.
fn public_types(text: &str) -> Vec<String> {
    let t = tokens(text);
    let mut found = Vec::new();
    for i in 1..t.len() {
        if t[i - 1] != "pub"
            || !matches!(
                t[i].as_str(),
                "struct" | "enum" | "trait" | "type" | "union"
            )
        {
            continue;
        }
        if let Some(name) = t.get(i + 1).filter(|s| is_ident(s)) {
            found.push(name.clone());
        }
    }
    found
}

#[test]
fn no_two_public_types_of_src_share_a_name() {
    // Two public types of one name (`Held` in two modules) read the same in every `use` list,
    // log line and doc page; each public struct, enum, trait or type alias has a name of its own.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in library_files(&src) {
        for name in public_types(&file.text) {
            by_name.entry(name).or_default().push(file.name.clone());
        }
    }
    // The scan is real: a type known to be public is found where it is.
    assert_eq!(by_name["RowBuilder"], ["table/batch/mod.rs"]);
    assert_eq!(
        public_types(
            "pub struct A; pub(crate) enum B {} struct C; pub type D = u8; // pub struct E"
        ),
        ["A", "D"]
    );
    let shared: Vec<String> = by_name
        .iter()
        .filter(|(_, files)| files.len() > 1)
        .map(|(name, files)| format!("{name}: {}", files.join(", ")))
        .collect();
    assert!(
        shared.is_empty(),
        "public types of src/ that share a name (rename one so each says what it is):\n  {}",
        shared.join("\n  ")
    );
}

/// The files of `src/` that hold only unit tests: a module declared `#[cfg(test)] mod name;`
/// (`table/tests.rs`), and every file below such a module.
fn test_only_files(files: &[SourceFile]) -> BTreeSet<String> {
    let mut modules: Vec<Vec<String>> = Vec::new();
    for file in files {
        let t = tokens(&file.text);
        for i in 0..t.len() {
            let declared = t[i] == "mod"
                && t.get(i + 1).is_some_and(|s| is_ident(s))
                && t.get(i + 2).map(String::as_str) == Some(";");
            if !declared {
                continue;
            }
            // The attributes right before `mod`: is one of them `#[cfg(test)]`?
            let mut k = i;
            let mut cfg_test = false;
            while k > 0 && t[k - 1] == "]" {
                let Some(open) = (0..k - 1).rev().find(|&j| t[j] == "[") else {
                    break;
                };
                let attribute = &t[open + 1..k - 1];
                cfg_test |= attribute == ["cfg", "(", "test", ")"];
                k = open.saturating_sub(1);
            }
            if cfg_test {
                let mut module = file.module.clone();
                module.push(t[i + 1].clone());
                modules.push(module);
            }
        }
    }
    files
        .iter()
        .filter(|f| modules.iter().any(|m| f.module.starts_with(m)))
        .map(|f| f.name.clone())
        .collect()
}

/// The lines of a file before its test code: up to the first line that is `#[cfg(test)]`, at the
/// start of the line, before a `mod` or `pub(…) mod` (the whole file when there is none).
fn non_test_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    (0..lines.len())
        .find(|&i| {
            lines[i] == "#[cfg(test)]"
                && lines[i + 1..]
                    .iter()
                    .find(|l| !l.starts_with("#["))
                    .is_some_and(|l| {
                        l.starts_with("mod ") || (l.starts_with("pub") && l.contains(" mod "))
                    })
        })
        .unwrap_or(lines.len())
}

#[test]
fn every_module_of_src_is_named_in_architecture_md() {
    // docs/architecture.md is the map of the crate: every module (every `.rs` file of src/ but
    // `lib.rs`, `main.rs` and the files that are only unit tests) is named in it. A file is
    // named when its path relative to src/ appears in backticks (`table/batch/cells.rs`); a
    // `mod.rs` may also be named by its folder (`table/topic/`).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let files = library_files(&root.join("src"));
    let tests_only = test_only_files(&files);
    assert!(tests_only.contains("table/tests.rs"), "{tests_only:?}");
    assert!(!tests_only.contains("table/batch/mod.rs"), "{tests_only:?}");
    let unnamed: Vec<&str> = files
        .iter()
        .map(|f| f.name.as_str())
        .filter(|name| *name != "lib.rs" && !tests_only.contains(*name))
        .filter(|name| {
            let folder = name.strip_suffix("mod.rs").map(|dir| format!("`{dir}`"));
            !page.contains(&format!("`{name}`"))
                && !folder.is_some_and(|folder| page.contains(&folder))
        })
        .collect();
    assert!(
        unnamed.is_empty(),
        "modules of src/ that docs/architecture.md does not name (add each to its module map):\n  {}",
        unnamed.join("\n  ")
    );
}

#[test]
fn every_file_architecture_md_names_exists() {
    // The reverse of the test above: a file docs/architecture.md names in backticks exists. A
    // path (`table/batch/cells.rs`) is looked up under src/, then the repository root
    // (`tests/util/mod.rs`); a bare file name (`settle.rs`, the file a source folder has) must
    // be the name of some file of src/.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let files = library_files(&root.join("src"));
    let names: BTreeSet<&str> = files
        .iter()
        .map(|f| f.name.rsplit('/').next().unwrap())
        .collect();
    let mut named: BTreeSet<&str> = BTreeSet::new();
    for quoted in page.split('`').skip(1).step_by(2) {
        let path_like = quoted
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_/.-".contains(c));
        if path_like && quoted.ends_with(".rs") {
            named.insert(quoted);
        }
    }
    assert!(named.len() > 100, "found only {} names", named.len());
    let missing: Vec<&str> = named
        .into_iter()
        .filter(|name| {
            if name.contains('/') {
                !root.join("src").join(name).exists() && !root.join(name).exists()
            } else {
                !names.contains(name) && !root.join("src").join(name).exists()
            }
        })
        .collect();
    assert!(
        missing.is_empty(),
        "files docs/architecture.md names that do not exist (fix or drop each row):\n  {}",
        missing.join("\n  ")
    );
}

/// The first line of the code after a file's first test module (`#[cfg(test)]` before an inline
/// `mod … {`), other test modules skipped, blank lines and comments too: `None` when there is
/// none. Code after the tests is code the 800-line check does not count and a reader does not
/// look for.
fn code_after_tests(text: &str) -> Option<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let test_module_at = |i: usize| {
        lines[i] == "#[cfg(test)]"
            && lines[i + 1..]
                .iter()
                .find(|l| !l.starts_with("#["))
                .is_some_and(|l| {
                    (l.starts_with("mod ") || (l.starts_with("pub") && l.contains(" mod ")))
                        && l.ends_with('{')
                })
    };
    let mut i = (0..lines.len()).find(|&i| test_module_at(i))?;
    while i < lines.len() {
        if test_module_at(i) {
            // Its closing brace, at the start of a line (rustfmt).
            i += lines[i..]
                .iter()
                .position(|l| *l == "}")
                .unwrap_or(lines.len())
                + 1;
            continue;
        }
        let l = lines[i].trim();
        if !l.is_empty() && !l.starts_with("//") {
            return Some((i + 1, lines[i].to_string()));
        }
        i += 1;
    }
    None
}

#[test]
fn no_code_comes_after_a_test_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = library_files(&root.join("src"));
    let after: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(root.join("src").join(&f.name)).unwrap();
            code_after_tests(&text).map(|(n, l)| format!("{}:{n}: {l}", f.name))
        })
        .collect();
    assert!(
        after.is_empty(),
        "code after a test module (move it above the tests, or into a module of its own):\n  {}",
        after.join("\n  ")
    );
    // The check finds what it is for.
    let made_up = "fn a() {}\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\n\n#[cfg(test)]\nmod more {\n}\n// done\npub fn late() {}\n";
    assert_eq!(
        code_after_tests(made_up),
        Some((11, "pub fn late() {}".to_string()))
    );
    assert_eq!(
        code_after_tests("fn a() {}\n#[cfg(test)]\nmod tests {\n}\n"),
        None
    );
}

#[test]
fn no_file_of_src_is_longer_than_800_lines_before_its_tests() {
    // A file past 800 lines of code holds more than one concern: split it into a folder of
    // modules. Its unit tests (the `#[cfg(test)]` module at its end) do not count, nor do files
    // that are only tests.
    const MOST: usize = 800;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = library_files(&root);
    let tests_only = test_only_files(&files);
    let mut long: Vec<String> = files
        .iter()
        .filter(|f| !tests_only.contains(&f.name))
        .map(|f| (non_test_lines(&f.text), &f.name))
        .filter(|(n, _)| *n > MOST)
        .map(|(n, name)| format!("{name}: {n} lines"))
        .collect();
    let main = std::fs::read_to_string(root.join("main.rs")).unwrap();
    if non_test_lines(&main) > MOST {
        long.push(format!("main.rs: {} lines", non_test_lines(&main)));
    }
    assert_eq!(
        non_test_lines("fn a() {}\n\n#[cfg(test)]\nmod tests {}\n"),
        2
    );
    assert_eq!(
        non_test_lines("#[cfg(test)]\nfn b() {}\n#[cfg(test)]\npub(crate) mod t {}"),
        2
    );
    assert!(
        long.is_empty(),
        "files of src/ with more than {MOST} lines before their tests (split each by concern):\n  {}",
        long.join("\n  ")
    );
}

/// The functions of `text` (rustfmt's layout: a `fn` line and its closing brace at the same
/// indent), before its unit tests, longer than `most` lines: `(line, name, lines)`.
fn long_functions(text: &str, most: usize) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .iter()
        .position(|l| l.starts_with("#[cfg(test)]"))
        .unwrap_or(lines.len());
    let mut out = Vec::new();
    let mut i = 0;
    while i < end {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        let mut words = line.split_whitespace().peekable();
        let mut is_fn = false;
        for w in words.by_ref() {
            match w {
                "pub" | "async" | "const" | "unsafe" | "extern" | "default" => continue,
                w if w.starts_with("pub(") => continue,
                "fn" => {
                    is_fn = true;
                    break;
                }
                _ => break,
            }
        }
        if !is_fn {
            i += 1;
            continue;
        }
        let name: String = words
            .next()
            .unwrap_or("")
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // A declaration without a body (a trait's required method) ends with `;`.
        let mut j = i;
        while j < end && !lines[j].trim_end().ends_with('{') && !lines[j].trim_end().ends_with(';')
        {
            j += 1;
        }
        if j >= end || lines[j].trim_end().ends_with(';') {
            i = j + 1;
            continue;
        }
        let close = (j..end).find(|&k| {
            let l = lines[k];
            l.len() - l.trim_start().len() == indent && l.trim_start().starts_with('}')
        });
        let Some(close) = close else { break };
        let n = close - i + 1;
        if n > most {
            out.push((i + 1, name, n));
        }
        i = close + 1;
    }
    out
}

#[test]
fn no_function_of_src_is_longer_than_120_lines() {
    // A function past 120 lines does more than one thing: give each its own function. Unit
    // tests (the `#[cfg(test)]` module at a file's end, and files that are only tests) do not
    // count.
    const MOST: usize = 120;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = library_files(&root);
    let tests_only = test_only_files(&files);
    let mut long: Vec<String> = files
        .iter()
        .filter(|f| !tests_only.contains(&f.name))
        .flat_map(|f| {
            long_functions(&f.text, MOST)
                .into_iter()
                .map(move |(line, name, n)| format!("{}:{line} {name}: {n} lines", f.name))
        })
        .collect();
    let main = std::fs::read_to_string(root.join("main.rs")).unwrap();
    long.extend(
        long_functions(&main, MOST)
            .into_iter()
            .map(|(line, name, n)| format!("main.rs:{line} {name}: {n} lines")),
    );
    // Being split now (each names who splits it); empty when none is. A listed function that
    // is no longer long fails the test, so the list only shrinks.
    const KNOWN_LONG: [&str; 1] = [
        // The run's summary moves to one channel (branch `tally`), then `run` is split.
        "app.rs run",
    ];
    let mut stale: Vec<&str> = KNOWN_LONG.to_vec();
    long.retain(|l| {
        let (place, _) = l.split_once(": ").unwrap();
        let (file, name) = place.split_once(' ').unwrap();
        let key = format!("{} {name}", file.split(':').next().unwrap());
        stale.retain(|k| *k != key);
        !KNOWN_LONG.contains(&key.as_str())
    });
    assert!(
        stale.is_empty(),
        "KNOWN_LONG functions that are no longer long (drop them): {stale:?}"
    );
    let sample =
        "fn a() {\n    x();\n}\n\npub(crate) async fn b(\n    y: u8,\n) -> u8 {\n    1\n}\n";
    assert_eq!(long_functions(sample, 3), vec![(5, "b".to_string(), 5)]);
    assert_eq!(
        long_functions("trait T {\n    fn f(&self);\n}\n", 0),
        vec![]
    );
    assert!(
        long.is_empty(),
        "functions of src/ longer than {MOST} lines (split each by what it does):\n  {}",
        long.join("\n  ")
    );
}
