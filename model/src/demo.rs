//! The built-in demo model: the tiny random-weight Qwen3.5 checkpoint of `model/assets/tiny` (made
//! by `tools/reference/make_tiny.py` with transformers), embedded in the binary so that
//! `instinct serve` works with no download. Its answers are meaningless; it exists to try the API.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! asset {
    ($name:literal) => {
        (
            $name,
            include_bytes!(concat!("../assets/tiny/", $name)) as &[u8],
        )
    };
}

/// Files of the demo snapshot, by path relative to its root.
const FILES: &[(&str, &[u8])] = &[
    asset!("config.json"),
    asset!("model.safetensors.index.json"),
    asset!("model-00001-of-00002.safetensors"),
    asset!("model-00002-of-00002.safetensors"),
    asset!("tokenizer.json"),
    asset!("tokenizer_config.json"),
    asset!("chat_template.jinja"),
    asset!("adapter-text/adapter_config.json"),
    asset!("adapter-text/adapter_model.safetensors"),
    asset!("adapter-multimodal/adapter_config.json"),
    asset!("adapter-multimodal/adapter_model.safetensors"),
];

static WRITES: AtomicU64 = AtomicU64::new(0);

/// Where the demo snapshot lives once written out.
pub struct DemoSnapshot {
    /// The base snapshot directory.
    pub model_dir: PathBuf,
    /// Its random text adapter (real Cua-S1 adapter config, random weights).
    pub text_adapter_dir: PathBuf,
    /// Its random multimodal adapter (real Cua-S1 multimodal config, random weights).
    pub multimodal_adapter_dir: PathBuf,
}

/// Writes the embedded demo snapshot under `root` (once per content: the directory name carries a
/// hash of the files) and returns its paths. Files are written to a temporary name and renamed, so
/// concurrent starts never see a half-written file.
pub fn materialize(root: &Path) -> std::io::Result<DemoSnapshot> {
    let dir = root.join(format!("instinct-demo-{:016x}", content_hash()));
    for (name, bytes) in FILES {
        let path = dir.join(name);
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64) {
            continue;
        }
        let parent = path.parent().expect("asset paths have a parent");
        std::fs::create_dir_all(parent)?;
        // Unique per writer (process and call), so concurrent writers never share a temporary file.
        let n = WRITES.fetch_add(1, Ordering::Relaxed);
        let tmp = parent.join(format!(
            ".{}.{n}.{}.tmp",
            std::process::id(),
            file_name(name)
        ));
        std::fs::File::create(&tmp)?.write_all(bytes)?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(DemoSnapshot {
        text_adapter_dir: dir.join("adapter-text"),
        multimodal_adapter_dir: dir.join("adapter-multimodal"),
        model_dir: dir,
    })
}

/// The demo's language model with its text adapter merged, on `backend` (the snapshot written
/// under the system's temporary directory first): what tests and tools load to run the demo.
pub fn load_text<B: instinct_kernels::Backend>(
    backend: B,
    limits: crate::forward::BatchLimits,
) -> anyhow::Result<crate::decider::LoadedText<B>> {
    let demo = materialize(&std::env::temp_dir())?;
    crate::decider::load_text(
        backend,
        &demo.model_dir,
        Some(&demo.text_adapter_dir),
        limits,
    )
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// FNV-1a over names and contents: enough to tell two builds' assets apart.
fn content_hash() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, bytes) in FILES {
        for &b in name.as_bytes().iter().chain(bytes.iter()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn materializes_every_file_once() {
        let root = std::env::temp_dir().join(format!("instinct-demo-test-{}", std::process::id()));
        let snap = materialize(&root).unwrap();
        for (name, bytes) in FILES {
            assert_eq!(
                std::fs::read(snap.model_dir.join(name)).unwrap(),
                *bytes,
                "{name}"
            );
        }
        assert!(snap.text_adapter_dir.join("adapter_config.json").is_file());
        // A second call finds everything in place.
        let again = materialize(&root).unwrap();
        assert_eq!(again.model_dir, snap.model_dir);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
