//! The prompts of a run: a `bench_prompts.py` file (ids checked against its digest) or seeded
//! synthetic ids, as latency rows (one question) and batch rows (a packed batch).

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use instinct_model::forward::BatchLimits;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::BenchArgs;

/// The prompts file format `tools/reference/bench_prompts.py` writes.
pub const PROMPTS_FORMAT: &str = "instinct-bench-prompts/1";

/// One row's prompts: a single question (latency) or a packed batch.
#[derive(Clone, Debug)]
pub struct Row {
    pub name: String,
    pub kind: RowKind,
    pub seqs: Vec<Vec<u32>>,
    /// Where the prompt came from (a fixture id), if known.
    pub source: Option<String>,
    /// The request fields a same-length HTTP request is built from (latency rows).
    pub text: Option<TextSource>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKind {
    Latency,
    Batch,
}

impl RowKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            RowKind::Latency => "latency",
            RowKind::Batch => "batch",
        }
    }
}

impl Row {
    pub(crate) fn tokens(&self) -> usize {
        self.seqs.iter().map(Vec::len).sum()
    }
}

/// The `cua-s1-native` request fields of a fixture (see `bench_prompts.py`).
#[derive(Clone, Debug, Deserialize)]
pub struct TextSource {
    #[serde(default)]
    pub source: Option<String>,
    pub app: String,
    pub task_family: String,
    #[serde(default)]
    pub goal: String,
    pub accessibility_tree: String,
    pub options: Vec<OptionText>,
}

/// One option of a [`TextSource`].
#[derive(Clone, Debug, Deserialize)]
pub struct OptionText {
    pub role: String,
    pub label: String,
    pub action: String,
    #[serde(default)]
    pub entity_id: Option<String>,
}

/// All rows of a run, and where they came from.
pub struct PromptSet {
    pub rows: Vec<Row>,
    pub provenance: Value,
}

#[derive(Deserialize)]
struct PromptsFile {
    format: String,
    sha256: String,
    latency: Vec<LatencyEntry>,
    batches: Vec<BatchEntry>,
    #[serde(default)]
    generator: Option<String>,
    #[serde(default)]
    fixtures: Option<String>,
    #[serde(default)]
    fixtures_run: Option<String>,
    #[serde(default)]
    small: Option<bool>,
}

#[derive(Deserialize)]
struct LatencyEntry {
    name: String,
    #[serde(default)]
    source: Option<String>,
    ids: Vec<u32>,
    #[serde(default)]
    text: Option<TextSource>,
}

#[derive(Deserialize)]
struct BatchEntry {
    name: String,
    prompts: Vec<Vec<u32>>,
}

/// SHA-256 of the ids as `bench_prompts.digest` writes them: one line per row, `latency NAME
/// id,id,…` then `batch NAME id,…;id,…`.
pub fn prompts_digest(rows: &[Row]) -> String {
    let join = |ids: &[u32]| ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let mut hasher = Sha256::new();
    for kind in [RowKind::Latency, RowKind::Batch] {
        for row in rows.iter().filter(|r| r.kind == kind) {
            let ids: Vec<String> = row.seqs.iter().map(|s| join(s)).collect();
            let sep = if kind == RowKind::Latency { "," } else { ";" };
            hasher.update(format!("{} {} {}\n", kind.name(), row.name, ids.join(sep)));
        }
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl PromptSet {
    /// Reads a `bench_prompts.py` file and checks its digest.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let file: PromptsFile = serde_json::from_slice(&bytes)
            .with_context(|| format!("parsing {}", path.display()))?;
        ensure!(
            file.format == PROMPTS_FORMAT,
            "{}: format {:?}, expected {PROMPTS_FORMAT:?}",
            path.display(),
            file.format
        );
        let mut rows: Vec<Row> = file
            .latency
            .into_iter()
            .map(|e| Row {
                name: e.name,
                kind: RowKind::Latency,
                seqs: vec![e.ids],
                source: e.source,
                text: e.text,
            })
            .collect();
        rows.extend(file.batches.into_iter().map(|b| Row {
            name: b.name,
            kind: RowKind::Batch,
            seqs: b.prompts,
            source: None,
            text: None,
        }));
        let digest = prompts_digest(&rows);
        ensure!(
            digest == file.sha256,
            "{}: the ids' SHA-256 is {digest}, the file says {}",
            path.display(),
            file.sha256
        );
        Ok(Self {
            rows,
            provenance: json!({
                "file": path,
                "format": file.format,
                "generator": file.generator,
                "fixtures": file.fixtures,
                "fixtures_run": file.fixtures_run,
                "small": file.small,
                "sha256": digest,
            }),
        })
    }

    /// Seeded random ids below `vocab` (`--lengths`, `--batch-sizes`, `--batch-prompt-tokens`).
    pub fn synthetic(args: &BenchArgs, vocab: usize) -> Result<Self> {
        let lengths = args
            .lengths
            .clone()
            .unwrap_or_else(|| vec![139, 712, 15_446]);
        let sizes = args.batch_sizes.clone().unwrap_or_else(|| vec![8, 32, 128]);
        ensure!(vocab > 0, "the vocabulary is empty");
        let mut rng = SplitMix(args.seed);
        let mut ids = |len: usize| -> Vec<u32> {
            (0..len)
                .map(|_| (rng.next() % vocab as u64) as u32)
                .collect()
        };
        let mut rows = Vec::new();
        for &len in &lengths {
            ensure!(len > 0, "--lengths: a prompt needs at least one token");
            rows.push(Row {
                name: len.to_string(),
                kind: RowKind::Latency,
                seqs: vec![ids(len)],
                source: None,
                text: None,
            });
        }
        for &size in &sizes {
            ensure!(
                size > 0 && args.batch_prompt_tokens > 0,
                "--batch-sizes and --batch-prompt-tokens must be positive"
            );
            rows.push(Row {
                name: format!("{size}x{}", args.batch_prompt_tokens),
                kind: RowKind::Batch,
                seqs: (0..size).map(|_| ids(args.batch_prompt_tokens)).collect(),
                source: None,
                text: None,
            });
        }
        let digest = prompts_digest(&rows);
        Ok(Self {
            rows,
            provenance: json!({
                "synthetic": {
                    "seed": args.seed, "lengths": lengths, "batch_sizes": sizes,
                    "batch_prompt_tokens": args.batch_prompt_tokens,
                    "ids": "uniform over the embedding rows (splitmix64)",
                },
                "sha256": digest,
            }),
        })
    }

    /// Checks every prompt against the limits and the vocabulary; the batch limits of the run.
    pub(crate) fn check(&self, args: &BenchArgs, vocab: usize) -> Result<BatchLimits> {
        ensure!(!self.rows.is_empty(), "no prompts to run");
        let mut need_tokens = 0;
        let mut need_seqs = 1;
        for row in &self.rows {
            ensure!(!row.seqs.is_empty(), "row {}: no prompts", row.name);
            for ids in &row.seqs {
                ensure!(!ids.is_empty(), "row {}: an empty prompt", row.name);
                ensure!(
                    ids.len() <= args.max_prompt_tokens,
                    "row {}: a prompt of {} tokens is longer than --max-prompt-tokens {} (the \
                     longest question the model serves)",
                    row.name,
                    ids.len(),
                    args.max_prompt_tokens
                );
                if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
                    bail!(
                        "row {}: token id {id} is outside the model's vocabulary ({vocab} rows); \
                         were the prompts made for another model?",
                        row.name
                    );
                }
            }
            need_tokens = need_tokens.max(row.tokens());
            need_seqs = need_seqs.max(row.seqs.len());
        }
        let max_tokens = args.max_batch_tokens.unwrap_or(need_tokens);
        for row in &self.rows {
            ensure!(
                row.tokens() <= max_tokens,
                "row {}: {} tokens do not fit in one forward pass of --max-batch-tokens {max_tokens}",
                row.name,
                row.tokens()
            );
        }
        Ok(BatchLimits {
            max_tokens,
            max_seqs: need_seqs,
        })
    }
}

/// splitmix64: a small seeded generator for the synthetic ids (and the vision rows' pixels).
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_matches_bench_prompts_py() {
        // python3 -c 'from bench_prompts import digest;
        //   print(digest([("a", [1, 2, 3])], [("b", [[4, 5], [6]])]))'
        let row = |name: &str, kind, seqs: Vec<Vec<u32>>| Row {
            name: name.into(),
            kind,
            seqs,
            source: None,
            text: None,
        };
        let rows = [
            row("b", RowKind::Batch, vec![vec![4, 5], vec![6]]),
            row("a", RowKind::Latency, vec![vec![1, 2, 3]]),
        ];
        assert_eq!(prompts_digest(&rows), DIGEST_OF_EXAMPLE);
    }

    const DIGEST_OF_EXAMPLE: &str =
        "972810b4a3bb203572b1d50eae6948894f299ec1f8c17e8780861e5566b94d5f";
}
