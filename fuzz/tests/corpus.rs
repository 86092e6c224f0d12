//! Replays every committed corpus file (`fuzz/corpus/<target>/`) and every regression input
//! (`fuzz/regressions/<target>/`, the inputs of fixed crashes) through its target, so `cargo test`
//! checks each target's invariants on them.

use std::path::{Path, PathBuf};

use instinct_fuzz::TARGETS;

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn replay(kind: &str, minimum: usize) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(kind);
    instinct_fuzz::init();
    for (name, target) in TARGETS {
        let inputs = files(&root.join(name));
        assert!(
            inputs.len() >= minimum,
            "{kind}/{name} has {} inputs, expected at least {minimum}",
            inputs.len()
        );
        for path in inputs {
            let data = std::fs::read(&path).expect("reading an input");
            // Name the input before a failing invariant panics.
            eprintln!("{}", path.display());
            target(&data);
        }
    }
    // Directories that name no target would be silently skipped.
    for dir in files_and_dirs(&root) {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            instinct_fuzz::target(&name).is_some(),
            "{} names no target",
            dir.display()
        );
    }
}

fn files_and_dirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.expect("directory entry").path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn corpus_passes_every_target() {
    replay("corpus", 5);
}

#[test]
fn regressions_pass_every_target() {
    replay("regressions", 0);
}
