//! Passes run at a padded shape, so that one captured launch sequence (a CUDA graph) serves every
//! batch that fits it.
//!
//! A pass over `rows` tokens in `seqs` sequences may run at a larger [`PassShape`]: the ops get
//! the shape's row and sequence counts, `cu_seqlens` holds the real offsets and then the total
//! again for every padding sequence (each empty). Rows past the total belong to no sequence:
//! row-wise ops compute them (from whatever the buffers hold) and nothing reads them; the
//! sequence ops skip them. So a sequence's answer is the one the unpadded pass gives, as long as
//! each op's result for a row does not depend on the row count (the batch-invariance rule).

/// The (rows, sequences) a pass runs at, and what its sequences carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PassShape {
    pub rows: usize,
    pub seqs: usize,
    pub carry: CarryShape,
}

/// What the sequences of a pass carry, as far as the launches see it: a pass that resumes from
/// prefix states or takes snapshots launches other kernels (and a captured one reads the states
/// from buffers of fixed addresses: the model's carry arena).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CarryShape {
    /// Prefix rows the attention layers are launched for (0: no sequence resumes; else the
    /// prefixes' total, padded up).
    pub prefix_rows: usize,
    /// Snapshots are written (at the sequences' ends, or also at points inside them).
    pub snapshot: bool,
    pub snapshot_inside: bool,
}

impl CarryShape {
    /// Whether any sequence resumes.
    pub fn resumes(&self) -> bool {
        self.prefix_rows > 0
    }

    /// Whether the pass carries anything.
    pub fn carries(&self) -> bool {
        self.resumes() || self.snapshot
    }
}

impl std::fmt::Display for PassShape {
    /// `ROWSxSEQS`, then `+pPREFIX`, `+s` (snapshots) and `+i` (inside) as the pass carries them:
    /// the `bucket` label of the graph metrics.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.rows, self.seqs)?;
        let c = self.carry;
        if c.resumes() {
            write!(f, "+p{}", c.prefix_rows)?;
        }
        if c.snapshot {
            write!(f, "+s")?;
        }
        if c.snapshot_inside {
            write!(f, "+i")?;
        }
        Ok(())
    }
}

/// The largest pass that is padded to a captured shape. A padding row costs what a real one does
/// (the GEMMs are compute-bound from ~300 rows for Qwen3.5-4B on an H100) and a replay saves
/// ~0.5 ms of launches, so shapes are dense and stop where the launches no longer count.
pub const CAPTURED_MAX_ROWS: usize = 1024;

/// Rows of the smallest captured shape.
const CAPTURED_MIN_ROWS: usize = 16;

/// Captured row counts are multiples of this. cuBLASLt's GEMM tiles span multiples of 8 rows (32
/// to 200 in our Nsight Compute profiles, 72, 120 and 200 among them: the second figure of an
/// `nvjet` kernel's tile), so a pass padded to a multiple of 8 needs no tile row more than the
/// pass itself. Padded to 32, a 600-row pass ran 608 rows, one more tile row of
/// 200 and of 120: 11.7-12.0 ms against 10.4-10.6 launched at 600 (H100,
/// docs/benchmarks/gpu-calls/2026-12-06-553662a-h100).
const CAPTURED_ROW_STEP: usize = 8;

/// The rows a captured pass of `rows` rows runs: at least 16, a multiple of 8. `None` above
/// [`CAPTURED_MAX_ROWS`] or for no rows.
fn captured_rows(rows: usize) -> Option<usize> {
    if rows == 0 || rows > CAPTURED_MAX_ROWS {
        return None;
    }
    Some(rows.max(CAPTURED_MIN_ROWS).div_ceil(CAPTURED_ROW_STEP) * CAPTURED_ROW_STEP)
}

/// The captured shape a pass of `rows` tokens in `seqs` sequences pads to: rows as
/// [`captured_rows`] says, sequences to a power of two. `None` above [`CAPTURED_MAX_ROWS`] or
/// for an empty pass.
pub fn captured_shape(rows: usize, seqs: usize) -> Option<PassShape> {
    if seqs == 0 {
        return None;
    }
    Some(PassShape {
        rows: captured_rows(rows)?,
        seqs: seqs.next_power_of_two(),
        carry: CarryShape::default(),
    })
}

/// The most prefix rows a captured pass resumes from, over all its sequences, unless the carry
/// arena is reserved for more (`instinct serve --carry-arena-prefix-tokens`).
pub const CAPTURED_MAX_PREFIX_ROWS: usize = 2048;

/// The prefix rows a captured pass that resumes from `prefix_rows` rows is launched for: a power
/// of two, at least 64 (a snapshot's cut is on the 64-token grid); `None` above `most` (the
/// arena's room).
pub fn captured_prefix_rows(prefix_rows: usize, most: usize) -> Option<usize> {
    let padded = prefix_rows.next_power_of_two().max(64);
    (padded <= most).then_some(padded)
}

/// Offsets (`cu_seqlens`, `cu_prefix`) of a pass of `seqs` sequences: the real ones, then the
/// total once per padding sequence.
pub fn padded_offsets(offsets: &[u32], seqs: usize) -> Vec<u32> {
    let total = offsets.last().copied().unwrap_or(0);
    let mut out = offsets.to_vec();
    out.resize(seqs + 1, total);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_pad_rows_and_sequences_up_and_stop_at_the_limit() {
        let s = |rows, seqs| captured_shape(rows, seqs).map(|p| (p.rows, p.seqs));
        assert_eq!(s(1, 1), Some((16, 1)));
        assert_eq!(s(16, 1), Some((16, 1)));
        assert_eq!(s(17, 3), Some((24, 4)));
        assert_eq!(s(139, 1), Some((144, 1)));
        assert_eq!(s(256, 8), Some((256, 8)));
        assert_eq!(s(257, 5), Some((264, 8)));
        assert_eq!(s(300, 1), Some((304, 1)));
        assert_eq!(s(600, 2), Some((600, 2)));
        assert_eq!(s(1024, 32), Some((1024, 32)));
        assert_eq!(s(1025, 1), None);
        assert_eq!(s(0, 1), None);
        assert_eq!(s(5, 0), None);
        // Every shape holds what it pads, with fewer than 8 rows more (16 at the least), and a
        // tile of any multiple of 8 rows fits it as often as the rows it pads.
        for rows in 1..=CAPTURED_MAX_ROWS {
            let p = captured_shape(rows, 3).unwrap();
            assert!(
                p.rows >= rows && (p.rows - rows < 8 || p.rows == 16),
                "{rows}"
            );
            for tile in [48, 72, 120, 160, 200] {
                assert_eq!(
                    p.rows.div_ceil(tile),
                    rows.div_ceil(tile).max(16_usize.div_ceil(tile))
                );
            }
        }
        let most = CAPTURED_MAX_PREFIX_ROWS;
        assert_eq!(captured_prefix_rows(1, most), Some(64));
        assert_eq!(captured_prefix_rows(64, most), Some(64));
        assert_eq!(captured_prefix_rows(130, most), Some(256));
        assert_eq!(captured_prefix_rows(2048, most), Some(2048));
        assert_eq!(captured_prefix_rows(2049, most), None);
        assert_eq!(captured_prefix_rows(14_336, 16_384), Some(16_384));
        assert_eq!(captured_prefix_rows(16_385, 16_384), None);
        let carried = PassShape {
            carry: CarryShape {
                prefix_rows: 128,
                snapshot: true,
                snapshot_inside: false,
            },
            ..captured_shape(100, 3).unwrap()
        };
        assert_eq!(carried.to_string(), "104x4+p128+s");
        assert_eq!(captured_shape(100, 3).unwrap().to_string(), "104x4");
    }

    #[test]
    fn padding_sequences_are_empty_at_the_end() {
        assert_eq!(padded_offsets(&[0, 5, 9], 4), [0, 5, 9, 9, 9]);
        assert_eq!(padded_offsets(&[0, 5, 9, 12, 20], 4), [0, 5, 9, 12, 20]);
    }
}
