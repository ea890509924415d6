//! The shapes of a bundle's video, blocks, KV cache and text context, in elements and tokens.

use crate::engine::bundle::Bundle;

/// Shapes derived from the bundle, in elements and tokens.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dims {
    pub(super) channels: usize,
    pub(super) frames_per_block: usize,
    pub(super) latent_frames: usize,
    pub(super) h: usize,
    pub(super) w: usize,
    pub(super) height: usize,
    pub(super) width: usize,
    pub(super) dim: usize,
    pub(super) tokens_per_frame: usize,
    pub(super) text_len: usize,
    pub(super) text_dim: usize,
    /// Pixel frames per latent frame after the first (the VAE's temporal stride).
    pub(super) frames_per_step: usize,
    pub(super) layers: usize,
}

impl Dims {
    pub(super) fn of(bundle: &Bundle) -> Self {
        let m = &bundle.manifest;
        let (h, w) = bundle.latent_hw();
        Self {
            channels: m.architecture.latent_channels,
            frames_per_block: m.export.frames_per_block,
            latent_frames: m.export.latent_frames,
            h,
            w,
            height: m.export.height,
            width: m.export.width,
            dim: m.architecture.dim,
            tokens_per_frame: m.architecture.tokens_per_frame,
            text_len: m.architecture.text_len,
            text_dim: m.architecture.text_dim,
            frames_per_step: m.architecture.vae_stride[0],
            layers: m.architecture.layers,
        }
    }

    pub(super) fn blocks(&self) -> usize {
        self.latent_frames / self.frames_per_block
    }

    pub(super) fn block_elems(&self) -> usize {
        self.channels * self.frames_per_block * self.h * self.w
    }

    /// The shape of one block's latents, `[1, C, F, h, w]`.
    pub(super) fn block_shape(&self) -> [i64; 5] {
        [
            1,
            self.channels as i64,
            self.frames_per_block as i64,
            self.h as i64,
            self.w as i64,
        ]
    }

    pub(super) fn block_tokens(&self) -> usize {
        self.frames_per_block * self.tokens_per_frame
    }

    pub(super) fn video_frames(&self) -> usize {
        1 + self.frames_per_step * (self.latent_frames - 1)
    }

    pub(super) fn frame_px(&self) -> usize {
        self.height * self.width
    }
}
