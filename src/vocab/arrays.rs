//! The arrays a run keeps per measured prompt (`outputs.save_latents`, `outputs.save_frames`):
//! their kinds, folders and file names, which the plan names, the workers write and `runner
//! compare` reads (`results::arrays` lists a run's files).

/// What a kept array holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrayKind {
    /// The final latents: float32, `[1, channels, latent frames, h, w]`.
    Latents,
    /// The decoded frames: uint8 RGB, `[frames, height, width, 3]`.
    Frames,
}

impl ArrayKind {
    pub const ALL: [ArrayKind; 2] = [ArrayKind::Latents, ArrayKind::Frames];

    /// The folder of the run that holds them.
    pub fn dir(self) -> &'static str {
        match self {
            Self::Latents => "latents",
            Self::Frames => "frames",
        }
    }

    fn prefix_and_extension(self) -> (&'static str, &'static str) {
        match self {
            Self::Latents => ("latents_", ".f32"),
            Self::Frames => ("frames_", ".u8"),
        }
    }

    /// The file of prompt `index`: `latents_<index>.f32` or `frames_<index>.u8`.
    pub fn file_name(self, index: u32) -> String {
        let (prefix, extension) = self.prefix_and_extension();
        format!("{prefix}{index}{extension}")
    }

    /// The prompt index a file of this kind is named after, if it is one.
    pub fn index_of(self, name: &str) -> Option<u32> {
        let (prefix, extension) = self.prefix_and_extension();
        let digits = name.strip_prefix(prefix)?.strip_suffix(extension)?;
        // Only the names `file_name` writes: no sign, no leading zeros.
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits.len() == 1 || !digits.starts_with('0'));
        if !canonical {
            return None;
        }
        digits.parse().ok()
    }
}
