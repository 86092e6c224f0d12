//! Passes run at a padded shape, so that one captured launch sequence (a CUDA graph) serves every
//! batch that fits it.
//!
//! A pass over `rows` tokens in `seqs` sequences may run at a larger [`PassShape`]: the ops get
//! the shape's row and sequence counts, `cu_seqlens` holds the real offsets and then the total
//! again for every padding sequence (each empty). Rows past the total belong to no sequence:
//! row-wise ops compute them (from whatever the buffers hold) and nothing reads them; the
//! sequence ops skip them. So a sequence's answer is the one the unpadded pass gives, as long as
//! each op's result for a row does not depend on the row count (the batch-invariance rule).

/// The (rows, sequences) a pass runs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PassShape {
    pub rows: usize,
    pub seqs: usize,
}

/// The largest pass that is padded to a captured shape: above it a pass computes for tens of
/// milliseconds, and the ~1 ms of launches a capture saves no longer counts.
pub const CAPTURED_MAX_ROWS: usize = 2048;

/// Rows of the smallest captured shape.
const CAPTURED_MIN_ROWS: usize = 16;

/// Captured row counts step by this above it (a tile row of the GEMMs: the padding costs a
/// bandwidth-bound GEMM nothing); powers of two below.
const CAPTURED_ROW_STEP: usize = 128;

/// The captured shape a pass of `rows` tokens in `seqs` sequences pads to: rows to a power of two
/// (at least 16) up to 128, then to a multiple of 128; sequences to a power of two. `None` above
/// [`CAPTURED_MAX_ROWS`] or for an empty pass.
pub fn captured_shape(rows: usize, seqs: usize) -> Option<PassShape> {
    if rows == 0 || seqs == 0 || rows > CAPTURED_MAX_ROWS {
        return None;
    }
    let rows = if rows <= CAPTURED_ROW_STEP {
        rows.next_power_of_two().max(CAPTURED_MIN_ROWS)
    } else {
        rows.div_ceil(CAPTURED_ROW_STEP) * CAPTURED_ROW_STEP
    };
    Some(PassShape {
        rows,
        seqs: seqs.next_power_of_two(),
    })
}

/// `cu_seqlens` of a pass at `shape`: the real offsets, then the total once per padding sequence.
pub fn padded_offsets(offsets: &[u32], shape: PassShape) -> Vec<u32> {
    let total = offsets.last().copied().unwrap_or(0);
    let mut out = offsets.to_vec();
    out.resize(shape.seqs + 1, total);
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
        assert_eq!(s(17, 3), Some((32, 4)));
        assert_eq!(s(128, 8), Some((128, 8)));
        assert_eq!(s(139, 1), Some((256, 1)));
        assert_eq!(s(257, 5), Some((384, 8)));
        assert_eq!(s(2048, 32), Some((2048, 32)));
        assert_eq!(s(2049, 1), None);
        assert_eq!(s(0, 1), None);
        assert_eq!(s(5, 0), None);
        // Every shape holds what it pads.
        for rows in 1..=CAPTURED_MAX_ROWS {
            let p = captured_shape(rows, 3).unwrap();
            assert!(p.rows >= rows && p.rows < 2 * rows.max(CAPTURED_MIN_ROWS));
        }
    }

    #[test]
    fn padding_sequences_are_empty_at_the_end() {
        let shape = PassShape { rows: 32, seqs: 4 };
        assert_eq!(padded_offsets(&[0, 5, 9], shape), [0, 5, 9, 9, 9]);
        assert_eq!(padded_offsets(&[0, 5, 9, 12, 20], shape), [0, 5, 9, 12, 20]);
    }
}
