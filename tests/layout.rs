//! The size rule of the source tree (decision 105): no Rust source file under `src`, `crates`,
//! `tests`, `cli`, `backends`, `tools` or `examples` has more than [`MAX_LINES`] lines. A file
//! that grows past it is split by what its parts do, not cut at a line number.

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 900;
const ROOTS: [&str; 7] = [
    "src", "crates", "tests", "cli", "backends", "tools", "examples",
];

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() && !path.ends_with("target") {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn no_source_file_is_longer_than_the_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ROOTS {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "found only {} files", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|path| {
            let lines = std::fs::read_to_string(path).ok()?.lines().count();
            let name = path.strip_prefix(root).unwrap_or(path).display();
            (lines > MAX_LINES).then(|| format!("{name}: {lines} lines"))
        })
        .collect();
    assert!(long.is_empty(), "longer than {MAX_LINES} lines: {long:?}");
}
