//! Where an op finds its rows: the packed batch, per-head layouts and strided column blocks.

use super::KernelResult;
use crate::error::KernelError;

/// The packed sequences of one batch: `cu_seqlens[s]..cu_seqlens[s + 1]` are the rows of
/// sequence `s`. Only the first `num_seqs + 1` entries of the buffer are read.
///
/// `rows` is the batch's token count as launched, known on the host: device kernels size their
/// launches by it, so a short batch in a large buffer costs only its rows. It is
/// `cu_seqlens[num_seqs]`, or more in a pass padded to a captured shape (the rows past the last
/// offset, and empty padding sequences, belong to no sequence: see [`super::PassShape`]). The CPU
/// backend checks that it covers `cu_seqlens`; device kernels never touch a row at or beyond it,
/// whatever `cu_seqlens` holds.
pub struct Varlen<'a, I> {
    pub cu_seqlens: &'a I,
    pub num_seqs: usize,
    pub rows: usize,
}

impl<I> Clone for Varlen<'_, I> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<I> Copy for Varlen<'_, I> {}

/// Where the heads of a per-head op sit inside each row: head `h` of row `t` starts at
/// `t * row_stride + offset + h * head_stride` and spans `head_dim` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadLayout {
    pub heads: usize,
    pub head_dim: usize,
    pub head_stride: usize,
    pub row_stride: usize,
    pub offset: usize,
}

impl HeadLayout {
    /// Heads stored back to back, filling the row.
    pub fn dense(heads: usize, head_dim: usize) -> Self {
        Self {
            heads,
            head_dim,
            head_stride: head_dim,
            row_stride: heads * head_dim,
            offset: 0,
        }
    }

    /// Fails unless this layout has heads of some size and fits `rows` rows in a buffer of `len`
    /// values: the one check every per-head op makes before it touches a head.
    pub fn check_fits(&self, op: &'static str, len: usize, rows: usize) -> KernelResult<()> {
        if self.head_dim == 0 {
            return Err(KernelError::invalid(op, "head_dim is 0"));
        }
        let need = self.required_len(rows);
        if len < need {
            return Err(KernelError::invalid(
                op,
                format!("buffer holds {len} values, layout needs {need} for {rows} rows"),
            ));
        }
        Ok(())
    }

    /// Length a buffer needs to hold `rows` rows of this layout.
    pub fn required_len(&self, rows: usize) -> usize {
        if rows == 0 || self.heads == 0 {
            return 0;
        }
        (rows - 1) * self.row_stride
            + self.offset
            + (self.heads - 1) * self.head_stride
            + self.head_dim
    }
}

/// Where the rows of a `[rows, width]` operand sit in a buffer that may be wider: row `t` starts at
/// `t * row_stride + offset` and spans the `width` the op names. It lets an op read one column
/// block of a stacked projection's output (`[rows, Σ widths]`, one GEMM for several projections)
/// in place, without a copy. [`Strided::dense`] is the plain contiguous layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strided {
    pub row_stride: usize,
    pub offset: usize,
}

impl Strided {
    /// Rows of `width` stored back to back.
    pub fn dense(width: usize) -> Self {
        Self {
            row_stride: width,
            offset: 0,
        }
    }

    /// Columns `offset..offset + width` of rows `row_stride` wide.
    pub fn cols(row_stride: usize, offset: usize) -> Self {
        Self { row_stride, offset }
    }

    /// Index of value `c` of row `t`.
    pub fn at(&self, t: usize, c: usize) -> usize {
        t * self.row_stride + self.offset + c
    }

    /// Length a buffer needs to hold `rows` rows of `width` (saturating, so an absurd layout fails
    /// every length check instead of wrapping past it).
    pub fn required_len(&self, rows: usize, width: usize) -> usize {
        if rows == 0 || width == 0 {
            return 0;
        }
        (rows - 1)
            .saturating_mul(self.row_stride)
            .saturating_add(self.offset)
            .saturating_add(width)
    }

    /// How many whole rows of `width` (`width > 0`) a buffer of `len` values holds: the row cap of
    /// a varlen op.
    pub fn rows_in(&self, len: usize, width: usize) -> usize {
        let Some(room) = len.checked_sub(self.offset.saturating_add(width)) else {
            return 0;
        };
        match self.row_stride {
            0 => usize::MAX,
            stride => room / stride + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_rejects_a_buffer_too_short_for_its_rows() {
        let layout = HeadLayout::dense(2, 4);
        assert!(layout.check_fits("op", 16, 2).is_ok());
        let err = layout.check_fits("op", 15, 2).unwrap_err().to_string();
        assert!(err.contains("op"), "{err}");
        assert!(err.contains("holds 15 values"), "{err}");
        assert!(err.contains("needs 16 for 2 rows"), "{err}");
        let empty = HeadLayout::dense(2, 0);
        let err = empty.check_fits("op", 100, 1).unwrap_err().to_string();
        assert!(err.contains("head_dim is 0"), "{err}");
    }

    #[test]
    fn a_strided_block_needs_its_last_row_only_up_to_its_width() {
        let at = Strided::cols(10, 3);
        assert_eq!(at.required_len(0, 4), 0);
        assert_eq!(at.required_len(2, 4), 10 + 3 + 4);
        assert_eq!(at.rows_in(17, 4), 2);
        assert_eq!(at.rows_in(16, 4), 1);
        assert_eq!(at.rows_in(6, 4), 0);
    }
}
