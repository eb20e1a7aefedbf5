//! The crate's shape, checked: no two files of `src/` depend on each other, directly or through
//! other files. A cycle means two files that cannot be read, tested or changed apart; shared
//! vocabulary belongs in a file of its own that both import.
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

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

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

struct Collector {
    module: Vec<String>,
    found: Vec<Named>,
}

impl Collector {
    fn use_tree(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>, public_use: bool) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix, public_use);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.push(prefix, Some(n.ident.to_string()), public_use),
            syn::UseTree::Rename(r) => self.push(prefix, Some(r.ident.to_string()), public_use),
            syn::UseTree::Glob(_) => self.push(prefix, None, public_use),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(tree, prefix, public_use);
                }
            }
        }
    }

    fn push(&mut self, prefix: &[String], last: Option<String>, public_use: bool) {
        let mut segments = prefix.to_vec();
        // `use super::{self, X}`: `self` names the module itself.
        segments.extend(last.filter(|l| l != "self"));
        self.found.push(Named {
            module: self.module.clone(),
            segments,
            public_use,
        });
    }
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.module.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.module.pop();
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let public_use = !matches!(u.vis, syn::Visibility::Inherited);
        self.use_tree(&u.tree, &mut Vec::new(), public_use);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if matches!(
            segments.first().map(String::as_str),
            Some("crate" | "super" | "self")
        ) {
            self.found.push(Named {
                module: self.module.clone(),
                segments,
                public_use: false,
            });
        }
        syn::visit::visit_path(self, p);
    }
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
        let ast = syn::parse_file(&file.text)
            .unwrap_or_else(|e| panic!("src/{} does not parse: {e}", file.name));
        let mut collector = Collector {
            module: file.module.clone(),
            found: Vec::new(),
        };
        collector.visit_file(&ast);
        let edges = graph.entry(file.name.clone()).or_default();
        for named in collector.found {
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
        ("a/y.rs", "pub struct Y; fn f() { let _ = crate::b::g(); }"),
        (
            "b.rs",
            "pub fn g() {} mod tests { use super::*; use crate::a::X; }",
        ),
    ]);
    let graph = dependency_graph(&files);
    assert_eq!(graph["a/x.rs"].keys().collect::<Vec<_>>(), ["a/y.rs"]);
    // `pub use x::X` is a/mod.rs re-exporting its child: no edge.
    assert!(graph["a/mod.rs"].is_empty(), "{:?}", graph["a/mod.rs"]);
    // `crate::a::X` ends in a/mod.rs; `use super::*` inside `mod tests` is b.rs itself.
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
}
