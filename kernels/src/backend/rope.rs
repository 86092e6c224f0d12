//! The rotary embedding's configuration.

/// Partial multi-axis rotary embedding (M-RoPE) of the full-attention layers.
///
/// The first `rotary_dim` values of every head rotate; the rest pass through. Rotation pairs are
/// `(d, d + rotary_dim/2)` ("rotate half"). Frequency `j` (of `rotary_dim/2`) is
/// `theta^(-2j/rotary_dim)` and is driven by the position of axis `axis(j)`:
/// - `interleaved` (Qwen3.5): axis 1 if `j % 3 == 1 && j < 3·section[1]`, axis 2 if
///   `j % 3 == 2 && j < 3·section[2]`, otherwise axis 0;
/// - contiguous (Qwen2-VL): the first `section[0]` frequencies use axis 0, the next `section[1]`
///   axis 1, the rest axis 2.
///
/// With all three axes equal (text) this is plain 1-D RoPE.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    pub rotary_dim: usize,
    pub theta: f64,
    pub section: [usize; 3],
    pub interleaved: bool,
}

impl Rope {
    /// Which position axis (0 = temporal, 1 = height, 2 = width) drives frequency `j`.
    pub fn axis(&self, j: usize) -> usize {
        if self.interleaved {
            if j % 3 == 1 && j < 3 * self.section[1] {
                1
            } else if j % 3 == 2 && j < 3 * self.section[2] {
                2
            } else {
                0
            }
        } else if j < self.section[0] {
            0
        } else if j < self.section[0] + self.section[1] {
            1
        } else {
            2
        }
    }

    /// Inverse frequency of pair `j`, computed in f32 the way PyTorch does
    /// (`1 / theta^(f32(2j) / f32(rotary_dim))`).
    pub fn inv_freq(&self, j: usize) -> f32 {
        let exponent = (2 * j) as f32 / self.rotary_dim as f32;
        1.0 / (self.theta as f32).powf(exponent)
    }
}
