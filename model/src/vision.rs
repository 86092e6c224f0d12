//! The Qwen3.5 vision tower (a ViT with a 2×2 patch merger): its config, its weights (with the
//! multimodal adapter's vision LoRA modules merged in) and its forward pass over the backend's
//! vision ops. Image features replace the image tokens' embeddings in the text model
//! ([`crate::forward::TextModel::forward_last_with_embeddings`]) at the positions
//! [`crate::mrope`] assigns.

mod config;
mod grid;
mod tower;
mod weights;

pub use config::{VisionConfig, VISION_LAYER_NORM_EPS};
pub use grid::{add_position_embedding, patch_coords};
pub use tower::{ImageInput, VisionTower};
pub use weights::{LinearWeights, NormWeights, VisionBlockWeights, VisionWeights};
