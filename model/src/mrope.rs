//! 3-D M-RoPE positions of a multimodal prompt (transformers' `Qwen3_5Model.get_rope_index`), and
//! the expansion of one image placeholder per image into its image tokens.
//!
//! Walking the sequence with a running start `cur` (from 0):
//! - a run of text tokens of length L gets `cur … cur+L−1` on all three axes, then `cur += L`;
//! - a run of image tokens, for an image with merged grid `(t, gh, gw)` (`gh = grid_h / merge`), gets
//!   `(cur + frame, cur + row, cur + col)` in (frame, row, col) order, then `cur += max(gh, gw)`.

use anyhow::{bail, ensure, Result};

/// Merged (LLM-side) grid of an image: `(t, h / merge, w / merge)`.
fn merged_grid(grid_thw: [u32; 3], merge: u32) -> Result<[u32; 3]> {
    let [t, h, w] = grid_thw;
    ensure!(merge > 0, "spatial merge size is 0");
    ensure!(
        t > 0 && h > 0 && w > 0 && h % merge == 0 && w % merge == 0,
        "image grid {grid_thw:?} is empty or not divisible by the merge size {merge}"
    );
    Ok([t, h / merge, w / merge])
}

/// Number of image tokens (placeholder copies) an image with `grid_thw` takes in the prompt.
pub fn image_token_count(grid_thw: [u32; 3], spatial_merge_size: u32) -> Result<usize> {
    let [t, gh, gw] = merged_grid(grid_thw, spatial_merge_size)?;
    Ok(t as usize * gh as usize * gw as usize)
}

/// Replaces the i-th `image_token_id` of `tokens` (one placeholder per image, as the chat template
/// renders it) with `image_token_count(grids[i])` copies, the way the processor does.
pub fn expand_image_placeholders(
    tokens: &[u32],
    image_token_id: u32,
    grids: &[[u32; 3]],
    spatial_merge_size: u32,
) -> Result<Vec<u32>> {
    let placeholders = tokens.iter().filter(|&&t| t == image_token_id).count();
    ensure!(
        placeholders == grids.len(),
        "the prompt holds {placeholders} image placeholders but {} images were given",
        grids.len()
    );
    let mut out = Vec::with_capacity(tokens.len());
    let mut images = grids.iter();
    for &token in tokens {
        if token == image_token_id {
            let grid = images.next().copied().unwrap_or_default();
            let copies = image_token_count(grid, spatial_merge_size)?;
            out.extend(std::iter::repeat_n(image_token_id, copies));
        } else {
            out.push(token);
        }
    }
    Ok(out)
}

/// `[t, h, w]` rotary positions of every token of an (expanded) prompt. Each maximal run of
/// `image_token_id` is one image, matched to `grids` in order, and must be exactly as long as that
/// image's token count.
pub fn rope_index(
    tokens: &[u32],
    image_token_id: u32,
    grids: &[[u32; 3]],
    spatial_merge_size: u32,
) -> Result<Vec<[u32; 3]>> {
    let mut positions = Vec::with_capacity(tokens.len());
    let mut images = grids.iter().enumerate();
    let mut cur: u32 = 0;
    let mut i = 0;
    while i < tokens.len() {
        let is_image = tokens[i] == image_token_id;
        let run = tokens[i..]
            .iter()
            .take_while(|&&t| (t == image_token_id) == is_image)
            .count();
        if is_image {
            let Some((index, &grid)) = images.next() else {
                bail!(
                    "image token run at {i} has no image grid (only {} given)",
                    grids.len()
                );
            };
            let [t, gh, gw] = merged_grid(grid, spatial_merge_size)?;
            let want = (t * gh * gw) as usize;
            ensure!(
                run == want,
                "image {index} (grid {grid:?}) needs {want} image tokens, the prompt has a run of {run} at {i}"
            );
            for frame in 0..t {
                for row in 0..gh {
                    for col in 0..gw {
                        positions.push([cur + frame, cur + row, cur + col]);
                    }
                }
            }
            cur += gh.max(gw);
        } else {
            positions.extend((cur..cur + run as u32).map(|p| [p, p, p]));
            cur += run as u32;
        }
        i += run;
    }
    ensure!(
        images.next().is_none(),
        "{} images were given but the prompt has fewer image token runs",
        grids.len()
    );
    Ok(positions)
}
