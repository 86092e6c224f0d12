//! Disk cache of compiled kernels, so start-up compiles each kernel file once per (source,
//! options, NVRTC version).
//!
//! A file's name is a 64-bit hash of its key; the file also stores the whole key and a lookup
//! compares it, so a hash collision is a miss, never a wrong kernel. Files are written to a
//! temporary name and renamed into place, so a reader never sees a partial file.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 16] = b"instinct-cubin/1";

/// What a cached kernel depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheKey {
    material: Vec<u8>,
}

impl CacheKey {
    pub fn new(source: &str, options: &[String], nvrtc_version: (i32, i32)) -> Self {
        let mut material = Vec::with_capacity(source.len() + 256);
        let mut field = |bytes: &[u8]| {
            material.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            material.extend_from_slice(bytes);
        };
        field(format!("nvrtc {}.{}", nvrtc_version.0, nvrtc_version.1).as_bytes());
        for option in options {
            field(option.as_bytes());
        }
        field(source.as_bytes());
        Self { material }
    }

    /// The file name of this key's entry.
    pub fn file_name(&self) -> String {
        format!("{:016x}.cubin", fnv1a64(&self.material))
    }
}

/// 64-bit FNV-1a: a fixed, documented hash (std's hasher may change between Rust releases).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A directory of compiled kernels.
#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: PathBuf,
}

impl KernelCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// `$XDG_CACHE_HOME/instinct/kernels`, else `$HOME/.cache/instinct/kernels`; `None` when
    /// neither variable is set.
    pub fn default_dir() -> Option<PathBuf> {
        let env_dir = |var: &str| {
            std::env::var_os(var)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let base =
            env_dir("XDG_CACHE_HOME").or_else(|| env_dir("HOME").map(|h| h.join(".cache")))?;
        Some(base.join("instinct").join("kernels"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cached CUBIN for `key`, if there is a complete entry for exactly this key.
    pub fn load(&self, key: &CacheKey) -> Option<Vec<u8>> {
        let data = fs::read(self.dir.join(key.file_name())).ok()?;
        let rest = data.strip_prefix(MAGIC.as_slice())?;
        let (len, rest) = rest.split_first_chunk::<8>()?;
        let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
        if rest.len() < len || rest[..len] != key.material[..] {
            return None;
        }
        let cubin = &rest[len..];
        (!cubin.is_empty()).then(|| cubin.to_vec())
    }

    /// Stores `cubin` for `key` (atomically: temporary file, then rename).
    pub fn store(&self, key: &CacheKey, cubin: &[u8]) -> std::io::Result<()> {
        replace_file(&self.dir.join(key.file_name()), |file| {
            file.write_all(MAGIC)?;
            file.write_all(&(key.material.len() as u64).to_le_bytes())?;
            file.write_all(&key.material)?;
            file.write_all(cubin)?;
            file.sync_all()
        })
    }
}

/// Replaces `path` (creating its directory) with what `write` puts into a fresh file, atomically:
/// the file is written under a temporary name beside it, unique per process and call so that
/// concurrent writers never share one, then renamed into place, so a reader sees the old file or
/// the whole new one. On an error the temporary file is removed.
pub(super) fn replace_file(
    path: &Path,
    write: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map_or_else(Default::default, |n| n.to_string_lossy());
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let written = fs::File::create(&tmp)
        .and_then(|mut file| write(&mut file))
        .and_then(|()| fs::rename(&tmp, path));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// An empty scratch directory for a file-writing test of this module or its neighbours, unique to
/// the test (`what`, `name`) and process.
#[cfg(test)]
pub(super) fn test_scratch_dir(what: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("instinct-{what}-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(source: &str) -> CacheKey {
        CacheKey::new(source, &["--gpu-architecture=sm_90a".into()], (13, 0))
    }

    fn scratch_dir(name: &str) -> PathBuf {
        test_scratch_dir("kernel-cache", name)
    }

    #[test]
    fn round_trip_and_key_sensitivity() {
        let dir = scratch_dir("roundtrip");
        let cache = KernelCache::new(&dir);
        let k = key("__global__ void f() {}");
        assert_eq!(cache.load(&k), None);
        cache.store(&k, b"\x7fELF cubin bytes").unwrap();
        assert_eq!(cache.load(&k).as_deref(), Some(&b"\x7fELF cubin bytes"[..]));
        // Any part of the key changing is a miss.
        assert_eq!(cache.load(&key("__global__ void g() {}")), None);
        let other_version = CacheKey::new(
            "__global__ void f() {}",
            &["--gpu-architecture=sm_90a".into()],
            (13, 1),
        );
        assert_eq!(cache.load(&other_version), None);
        let other_arch = CacheKey::new(
            "__global__ void f() {}",
            &["--gpu-architecture=sm_80".into()],
            (13, 0),
        );
        assert_eq!(cache.load(&other_arch), None);
        // Only the entry is left behind, no temporary file.
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(k.file_name())]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_entry_for_another_key_under_the_same_name_is_a_miss() {
        let dir = scratch_dir("collision");
        let cache = KernelCache::new(&dir);
        let (a, b) = (key("a"), key("b"));
        cache.store(&a, b"cubin-a").unwrap();
        // Simulate a hash collision: a's entry sits where b's would be.
        fs::rename(dir.join(a.file_name()), dir.join(b.file_name())).unwrap();
        assert_eq!(cache.load(&b), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn truncated_entry_is_a_miss() {
        let dir = scratch_dir("truncated");
        let cache = KernelCache::new(&dir);
        let k = key("source");
        cache.store(&k, b"cubin").unwrap();
        let path = dir.join(k.file_name());
        let full = fs::read(&path).unwrap();
        fs::write(&path, &full[..full.len() - 5]).unwrap();
        assert_eq!(cache.load(&k), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fnv_matches_the_published_test_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
