//! The GEMM algorithms picked by timing, kept on disk beside the compiled kernels.
//!
//! cuBLASLt's candidates for a shape do not all sum in the same order, and the one a start of the
//! server keeps is whichever timed fastest then, so two starts could answer the same question a
//! few thousandths apart. With the winners stored here, every later start on the same GPU model,
//! driver and cuBLASLt runs exactly the algorithms of the first, without timing them again.
//!
//! One small text file per identity (GPU name, compute capability, driver and cuBLASLt versions,
//! and how candidates are timed): a header line holding the identity, then one line per row
//! bucket and shape, `rows in out bf16_out add [epilogue]` and the algorithm's eight words in hex
//! (the epilogue only where the GEMM has one, so files from before epilogues still read). A file that
//! does not parse or belongs to another identity is ignored (and rewritten at the next tuning); an
//! algorithm cuBLASLt no longer accepts for a shape is timed again, as if it were missing.
//!
//! Batch-invariant mode (`CudaOptions::batch_invariant`) keeps its own file: its identity ends in
//! `batch-invariant=v1`, so a file timed without the rule is never read under it (nor the reverse),
//! and it holds one more line per shape, with rows 0: the shape's reference algorithm, which every
//! bucket's winner was checked against.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use std::ffi::c_void;
use std::mem::size_of;

use cudarc::cublaslt::sys;

use super::cache::replace_file;

/// A tuning key: (row bucket, in_dim, out_dim, bf16 output, adds to the output, epilogue tag:
/// `blas::Epilogue::tag`, 0 for none).
pub(crate) type BucketShape = (usize, usize, usize, bool, bool, u8);
/// An algorithm as cuBLASLt stores it (`cublasLtMatmulAlgo_t`'s opaque words).
pub(crate) type AlgoWords = [u64; 8];

const HEADER: &str = "instinct gemm tuning v2";

/// Where one identity's tuning results live.
#[derive(Clone, Debug)]
pub(crate) struct TuningFile {
    path: PathBuf,
    identity: String,
}

impl TuningFile {
    /// The file for `identity` in `dir` (named by a hash of the identity, which the file repeats
    /// in full, so a hash collision reads as a mismatch, not as another GPU's results).
    pub fn new(dir: &Path, identity: &str) -> Self {
        let mut hasher = DefaultHasher::new();
        identity.hash(&mut hasher);
        Self {
            path: dir.join(format!("gemm-tuning-{:016x}.txt", hasher.finish())),
            identity: identity.replace('\n', " "),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stored results; empty when there is no file, or it is damaged or another identity's.
    pub fn load(&self) -> HashMap<BucketShape, AlgoWords> {
        fs::read_to_string(&self.path)
            .ok()
            .and_then(|text| self.parse(&text))
            .unwrap_or_default()
    }

    fn parse(&self, text: &str) -> Option<HashMap<BucketShape, AlgoWords>> {
        let mut lines = text.lines();
        if lines.next()? != format!("{HEADER} {}", self.identity) {
            return None;
        }
        let mut map = HashMap::new();
        for line in lines {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [rows, in_dim, out_dim, bf16_out, add, rest @ ..] = fields.as_slice() else {
                return None;
            };
            let (epilogue, words) = match rest.len() {
                8 => (0, rest),
                9 => (rest[0].parse().ok().filter(|&tag| tag > 0)?, &rest[1..]),
                _ => return None,
            };
            let mut algo = [0u64; 8];
            for (word, text) in algo.iter_mut().zip(words) {
                *word = u64::from_str_radix(text, 16).ok()?;
            }
            let flag = |text: &str| match text {
                "1" => Some(true),
                "0" => Some(false),
                _ => None,
            };
            let shape = (
                rows.parse().ok()?,
                in_dim.parse().ok()?,
                out_dim.parse().ok()?,
                flag(bf16_out)?,
                flag(add)?,
                epilogue,
            );
            map.insert(shape, algo);
        }
        Some(map)
    }

    /// Writes `map` (atomically: a temporary file, then a rename; not synced, it is only a
    /// cache). Lines are sorted, so the same results always make the same file.
    pub fn store(&self, map: &HashMap<BucketShape, AlgoWords>) -> std::io::Result<()> {
        let mut entries: Vec<_> = map.iter().collect();
        entries.sort();
        let mut text = format!("{HEADER} {}\n", self.identity);
        for (&(rows, in_dim, out_dim, bf16_out, add, epilogue), algo) in entries {
            let _ = write!(
                text,
                "{rows} {in_dim} {out_dim} {} {}",
                u8::from(bf16_out),
                u8::from(add)
            );
            if epilogue > 0 {
                let _ = write!(text, " {epilogue}");
            }
            for word in algo {
                let _ = write!(text, " {word:x}");
            }
            text.push('\n');
        }
        replace_file(&self.path, |file| file.write_all(text.as_bytes()))
    }
}

// ---- What a candidate algorithm sums in one pass (the batch-invariant mode's filter) ---------

/// A u32 setting of `algo`'s configuration, if cuBLASLt reports it.
fn config(algo: &sys::cublasLtMatmulAlgo_t, attr: AlgoConfig) -> Option<u32> {
    let (mut value, mut written) = (0u32, 0usize);
    // SAFETY: `algo` is plain data; the attributes read here are u32 (cuBLASLt's API).
    let status = unsafe {
        sys::cublasLtMatmulAlgoConfigGetAttribute(
            algo,
            attr,
            (&mut value) as *mut u32 as *mut c_void,
            size_of::<u32>(),
            &mut written,
        )
    };
    (status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && written == size_of::<u32>())
        .then_some(value)
}

type AlgoConfig = sys::cublasLtMatmulAlgoConfigAttributes_t;

/// Whether `algo` sums each output over the whole of K in one pass (split-K 1, no reduction).
pub(crate) fn splits_no_k(algo: &sys::cublasLtMatmulAlgo_t) -> bool {
    config(algo, AlgoConfig::CUBLASLT_ALGO_CONFIG_SPLITK_NUM) == Some(1)
        && config(algo, AlgoConfig::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)
            == Some(sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32)
}

/// `algo` with split-K 1 and no reduction scheme (its tile, stages and swizzle kept), or `None`
/// where cuBLASLt refuses the setting.
pub(crate) fn without_split(algo: &sys::cublasLtMatmulAlgo_t) -> Option<sys::cublasLtMatmulAlgo_t> {
    let mut unsplit = *algo;
    let none = sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32;
    for (attr, value) in [
        (AlgoConfig::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1u32),
        (AlgoConfig::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, none),
    ] {
        // SAFETY: `unsplit` is plain data owned here; both attributes are u32.
        let status = unsafe {
            sys::cublasLtMatmulAlgoConfigSetAttribute(
                &mut unsplit,
                attr,
                (&value) as *const u32 as *const c_void,
                size_of::<u32>(),
            )
        };
        if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return None;
        }
    }
    splits_no_k(&unsplit).then_some(unsplit)
}

#[cfg(test)]
mod tests {
    use super::super::cache::test_scratch_dir;
    use super::*;

    fn scratch_dir(name: &str) -> PathBuf {
        test_scratch_dir("gemm-tuning", name)
    }

    fn sample() -> HashMap<BucketShape, AlgoWords> {
        let mut map = HashMap::new();
        map.insert(
            (768, 2560, 12352, false, false, 0),
            [1, 2, 3, u64::MAX, 0, 5, 6, 7],
        );
        map.insert((256, 2560, 18432, true, false, 0), [9; 8]);
        map.insert((768, 9216, 2560, false, true, 0), [4; 8]);
        // The vision tower's: fc2 adding bias and product to the residual, fc1 with its GELU.
        map.insert((4096, 4096, 1024, false, true, 1), [5; 8]);
        map.insert((4096, 1024, 4096, true, false, 2), [6; 8]);
        map
    }

    #[test]
    fn results_round_trip_and_the_file_is_the_same_for_the_same_results() {
        let dir = scratch_dir("roundtrip");
        let file = TuningFile::new(&dir, "NVIDIA H200 sm_90 driver 13000 cublasLt 130000");
        assert!(file.load().is_empty(), "no file yet");
        file.store(&sample()).unwrap();
        assert_eq!(file.load(), sample());
        let first = fs::read(file.path()).unwrap();
        file.store(&sample()).unwrap();
        assert_eq!(fs::read(file.path()).unwrap(), first);
        // No temporary file left behind.
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lines_without_an_epilogue_are_plain_gemms_and_a_written_zero_is_damage() {
        let dir = scratch_dir("epilogue");
        fs::create_dir_all(&dir).unwrap();
        let file = TuningFile::new(&dir, "gpu A");
        let header = format!("{HEADER} gpu A");
        let words = "1 2 3 4 5 6 7 8";
        fs::write(
            file.path(),
            format!("{header}\n768 2560 12352 0 0 {words}\n"),
        )
        .unwrap();
        let plain = (768, 2560, 12352, false, false, 0);
        assert_eq!(file.load().get(&plain), Some(&[1, 2, 3, 4, 5, 6, 7, 8]));
        fs::write(
            file.path(),
            format!("{header}\n768 4096 1024 0 1 1 {words}\n"),
        )
        .unwrap();
        assert!(file.load().contains_key(&(768, 4096, 1024, false, true, 1)));
        fs::write(
            file.path(),
            format!("{header}\n768 2560 12352 0 0 0 {words}\n"),
        )
        .unwrap();
        assert!(file.load().is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn another_identity_or_a_damaged_file_reads_as_empty() {
        let dir = scratch_dir("mismatch");
        let file = TuningFile::new(&dir, "gpu A");
        file.store(&sample()).unwrap();
        // The same file under another identity (as after a hash collision) is not used.
        let other = TuningFile {
            path: file.path().to_path_buf(),
            identity: "gpu B".into(),
        };
        assert!(other.load().is_empty());
        assert_ne!(TuningFile::new(&dir, "gpu B").path(), file.path());
        // Damaged: a word that is not hex, a missing word, a truncated line.
        let good = fs::read_to_string(file.path()).unwrap();
        for bad in [
            good.replacen(" 9 9", " 9 z", 1),
            good.replacen(" 9 9", " 9", 1),
            good.replacen(" 1 2 3", " 1", 1),
        ] {
            assert_ne!(bad, good);
            fs::write(file.path(), bad).unwrap();
            assert!(file.load().is_empty());
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
