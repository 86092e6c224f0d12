//! Memory-mapped safetensors files behind one name → tensor index: a single file, or a sharded
//! set tied together by a `*.safetensors.index.json` (`weight_map`). Tensors are read on demand
//! and converted to f32 (`HostTensor`); bf16, f16, f32 and f64 are accepted.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use memmap2::Mmap;
use rayon::prelude::*;
pub use safetensors::Dtype;
use safetensors::SafeTensors;
use serde::Deserialize;

use crate::weights::HostTensor;

/// File name of an unsharded checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// File name of the shard index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One mapped safetensors file.
struct MappedFile {
    path: PathBuf,
    mmap: Mmap,
    /// Byte offset of the data section (8-byte length prefix + JSON header).
    data_start: usize,
}

/// Where one tensor lives.
struct TensorEntry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range inside the file's data section.
    begin: usize,
    end: usize,
}

/// A read-only set of named tensors backed by memory-mapped safetensors files.
pub struct TensorStore {
    files: Vec<MappedFile>,
    tensors: BTreeMap<String, TensorEntry>,
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

impl TensorStore {
    /// Maps one safetensors file.
    pub fn open_file(path: impl AsRef<Path>) -> Result<Self> {
        let mut store = Self {
            files: Vec::new(),
            tensors: BTreeMap::new(),
        };
        let names = store.add_file(path.as_ref())?;
        for (name, entry) in names {
            store.tensors.insert(name, entry);
        }
        Ok(store)
    }

    /// Maps the weights of a snapshot directory as transformers saves them: `model.safetensors`
    /// when present (transformers looks for it first), otherwise `model.safetensors.index.json`
    /// and the shards its `weight_map` names.
    pub fn open_snapshot_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let single = dir.join(SINGLE_FILE);
        if single.is_file() {
            return Self::open_file(&single);
        }
        let index = dir.join(INDEX_FILE);
        if index.is_file() {
            return Self::open_sharded(&index);
        }
        bail!(
            "{}: neither {SINGLE_FILE} nor {INDEX_FILE} found (only safetensors checkpoints are supported)",
            dir.display()
        )
    }

    /// Maps the shards listed by an index file. Every tensor of the `weight_map` must be in the
    /// shard it names, and every tensor of a shard must be listed, so a stale or mixed-up index
    /// is caught here rather than as a wrong weight later.
    pub fn open_sharded(index_path: impl AsRef<Path>) -> Result<Self> {
        let index_path = index_path.as_ref();
        let text = std::fs::read_to_string(index_path)
            .with_context(|| format!("reading {}", index_path.display()))?;
        let index: ShardIndex = serde_json::from_str(&text)
            .with_context(|| format!("parsing {}", index_path.display()))?;
        let dir = index_path.parent().unwrap_or(Path::new("."));

        let mut store = Self {
            files: Vec::new(),
            tensors: BTreeMap::new(),
        };
        let shard_names: BTreeSet<&String> = index.weight_map.values().collect();
        for shard in shard_names {
            ensure_plain_relative(shard).with_context(|| {
                format!("{}: weight_map names shard {shard:?}", index_path.display())
            })?;
            let shard_path = dir.join(shard);
            let entries = store.add_file(&shard_path)?;
            for (name, entry) in entries {
                match index.weight_map.get(&name) {
                    Some(listed) if listed == shard => {}
                    Some(listed) => bail!(
                        "{}: tensor `{name}` is in shard {shard} but weight_map says {listed}",
                        index_path.display()
                    ),
                    None => bail!(
                        "{}: tensor `{name}` of shard {shard} is not listed in weight_map",
                        index_path.display()
                    ),
                }
                if store.tensors.insert(name.clone(), entry).is_some() {
                    bail!("tensor `{name}` is stored in more than one shard");
                }
            }
        }
        for (name, shard) in &index.weight_map {
            ensure!(
                store.tensors.contains_key(name),
                "{}: weight_map puts tensor `{name}` in {shard}, which does not contain it",
                index_path.display()
            );
        }
        Ok(store)
    }

    /// Maps `path`, checks its header and returns its tensors (not yet inserted).
    fn add_file(&mut self, path: &Path) -> Result<Vec<(String, TensorEntry)>> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: the mapping is read-only; like every mmap-based loader we rely on the
        // checkpoint file not being truncated or rewritten while the process runs.
        let mmap = unsafe { Mmap::map(&file) }
            .with_context(|| format!("memory-mapping {}", path.display()))?;
        let (header_len, metadata) = SafeTensors::read_metadata(&mmap)
            .map_err(|e| anyhow::anyhow!("{}: invalid safetensors file: {e}", path.display()))?;
        let file_index = self.files.len();
        let entries = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| {
                let (begin, end) = info.data_offsets;
                let entry = TensorEntry {
                    file: file_index,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    begin,
                    end,
                };
                (name, entry)
            })
            .collect();
        self.files.push(MappedFile {
            path: path.to_path_buf(),
            mmap,
            data_start: 8 + header_len,
        });
        Ok(entries)
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Shape as stored in the file.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|e| e.shape.as_slice())
    }

    /// Element type as stored in the file.
    pub fn dtype(&self, name: &str) -> Option<Dtype> {
        self.tensors.get(name).map(|e| e.dtype)
    }

    /// The file a tensor is stored in.
    pub fn file_of(&self, name: &str) -> Option<&Path> {
        self.tensors
            .get(name)
            .map(|e| self.files[e.file].path.as_path())
    }

    /// Reads a tensor with the shape it has in the file, converted to f32.
    pub fn read_f32(&self, name: &str) -> Result<HostTensor> {
        self.read_rows(name, 1, None)
    }

    /// Reads a tensor that must have exactly `expected` as its shape.
    pub fn read_f32_expect(&self, name: &str, expected: &[usize]) -> Result<HostTensor> {
        self.check_shape(name, expected)?;
        self.read_f32(name)
    }

    /// As [`read_f32_expect`](Self::read_f32_expect), calling `then(first_row, rows)` on each run
    /// of whole rows (a row: the values of one index of the first axis) right after it is
    /// decoded, while it is still in cache: a change to every value costs no second pass over
    /// memory.
    pub fn read_f32_expect_then(
        &self,
        name: &str,
        expected: &[usize],
        then: &OnRows,
    ) -> Result<HostTensor> {
        self.check_shape(name, expected)?;
        let row_len = expected.iter().skip(1).product::<usize>();
        self.read_rows(name, row_len, Some(then))
    }

    /// Decodes tensor `name` to f32 in runs of whole rows of `row_len` values, each handed to
    /// `then` (if any) once decoded.
    fn read_rows(&self, name: &str, row_len: usize, then: Option<&OnRows>) -> Result<HostTensor> {
        let entry = self
            .tensors
            .get(name)
            .with_context(|| format!("tensor `{name}` is missing"))?;
        let file = &self.files[entry.file];
        let bytes = &file.mmap[file.data_start + entry.begin..file.data_start + entry.end];
        let data = to_f32_rows(bytes, entry.dtype, row_len, then)
            .with_context(|| format!("tensor `{name}` in {}", file.path.display()))?;
        Ok(HostTensor::new(entry.shape.clone(), data))
    }

    fn check_shape(&self, name: &str, expected: &[usize]) -> Result<()> {
        let Some(found) = self.shape(name) else {
            bail!("tensor `{name}` is missing (expected shape {expected:?})");
        };
        ensure!(
            found == expected,
            "tensor `{name}` has shape {found:?}, expected {expected:?}"
        );
        Ok(())
    }
}

/// Shard names must stay inside the snapshot directory.
fn ensure_plain_relative(name: &str) -> Result<()> {
    let path = Path::new(name);
    ensure!(
        !name.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_))),
        "not a plain relative file name"
    );
    Ok(())
}

/// What [`TensorStore::read_f32_expect_then`] calls on each decoded run of whole rows: the index
/// of its first row, and the run.
pub type OnRows<'a> = dyn Fn(usize, &mut [f32]) + Sync + 'a;

/// Values each parallel decoding task converts.
const DECODE_CHUNK: usize = 1 << 20;

/// Little-endian element bytes to f32. safetensors validated that the byte length matches the
/// shape and dtype; byte-wise decoding avoids any alignment assumption on the mapping. Large
/// tensors decode on every core, into memory that may be backed by huge pages: with the rounding
/// back to bf16 at upload, this is most of the host work of loading a snapshot (4.2 G values for
/// the 4B model). Each task is a run of whole rows of `row_len` values, handed to `then` (with the
/// index of its first row) once decoded.
fn to_f32_rows(
    bytes: &[u8],
    dtype: Dtype,
    row_len: usize,
    then: Option<&OnRows>,
) -> Result<Vec<f32>> {
    let (width, decode): (usize, fn(&[u8]) -> f32) = match dtype {
        Dtype::F32 => (4, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        Dtype::BF16 => (2, |c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        Dtype::F16 => (2, |c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
        Dtype::F64 => (8, |c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            f64::from_le_bytes(b) as f32
        }),
        other => bail!("unsupported dtype {other:?} (expected BF16, F16, F32 or F64)"),
    };
    let mut out = vec![0f32; bytes.len() / width];
    advise_huge_pages(&out);
    let row_len = row_len.max(1);
    let rows_per_task = (DECODE_CHUNK / row_len).max(1);
    let task = rows_per_task * row_len;
    out.par_chunks_mut(task)
        .zip(bytes.par_chunks(task * width))
        .enumerate()
        .for_each(|(t, (dst, src))| {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(width)) {
                *d = decode(c);
            }
            if let Some(then) = then {
                then(t * rows_per_task, dst);
            }
        });
    Ok(out)
}

/// Asks the kernel to back `buf`'s whole 2 MiB pages with transparent huge pages, before they are
/// first written. A large zeroed `Vec` is fresh, untouched memory; written through 4 KiB pages, the
/// 4B model's 16.8 GB of f32 weights take some four million page faults, which cost more than the
/// decoding itself (1 G values: 1.6 s with 4 KiB pages, 0.55-0.75 s with huge pages, on two
/// cores: docs/benchmarks/load-cpu). Advice only: without transparent huge pages it changes
/// nothing.
fn advise_huge_pages(buf: &[f32]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let begin = buf.as_ptr() as usize;
        let start = begin.next_multiple_of(HUGE);
        let end = (begin + std::mem::size_of_val(buf)) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside `buf`'s allocation and madvise(MADV_HUGEPAGE) changes
            // no contents; its result is ignored, as the advice is optional.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With whole rows a task, each run reaches `then` once, with the index of its first row,
    /// after it is decoded; the runs cover the tensor.
    #[test]
    fn runs_of_whole_rows_reach_then_decoded_with_their_first_row() {
        let row_len = 1000;
        let rows = 2 * DECODE_CHUNK / row_len + 7;
        // Integers up to 256: exact in bf16.
        let values: Vec<f32> = (0..rows * row_len).map(|i| (i % 251) as f32).collect();
        let bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let seen = std::sync::Mutex::new(Vec::new());
        let then = |first_row: usize, run: &mut [f32]| {
            assert_eq!(run.len() % row_len, 0, "whole rows");
            // Decoded already: the run holds the tensor's values from its first row on.
            assert_eq!(run[0], values[first_row * row_len]);
            run[0] = -1.0;
            seen.lock().unwrap().push((first_row, run.len() / row_len));
        };
        let out = to_f32_rows(&bytes, Dtype::BF16, row_len, Some(&then)).unwrap();
        let mut seen = seen.into_inner().unwrap();
        seen.sort_unstable();
        assert!(seen.len() > 2, "several runs: {seen:?}");
        let mut next = 0;
        for &(first, count) in &seen {
            assert_eq!(
                first, next,
                "runs in order, none missing or twice: {seen:?}"
            );
            assert_eq!(out[first * row_len], -1.0, "then's change kept");
            next += count;
        }
        assert_eq!(next, rows);
    }

    /// Tensors larger than one decoding task split over several; every value lands in its place.
    #[test]
    fn parallel_decoding_matches_value_by_value_decoding() {
        let n = 2 * DECODE_CHUNK + 12_345;
        let values: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 100.0).collect();
        let bf16_bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let want: Vec<f32> = values
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect();
        assert_eq!(
            to_f32_rows(&bf16_bytes, Dtype::BF16, 1, None).unwrap(),
            want
        );
        let f32_bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            to_f32_rows(&f32_bytes, Dtype::F32, 1, None).unwrap(),
            values
        );
        let f64_bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| f64::from(v).to_le_bytes())
            .collect();
        assert_eq!(
            to_f32_rows(&f64_bytes, Dtype::F64, 1, None).unwrap(),
            values
        );
        assert!(to_f32_rows(&[0u8; 4], Dtype::I32, 1, None).is_err());
    }
}
