//! Writing generated frames as H.264 MP4 videos, with no external tools.
//!
//! The pipeline is: packed RGB → YUV 4:2:0 (`yuv`, BT.601 limited range) → H.264 constrained
//! baseline from OpenH264, built from source by the `openh264` crate (`encode`) → Annex-B NAL
//! units re-framed as length-prefixed samples (`annexb`) → a small hand-written MP4 muxer
//! (`mp4`). The result plays in browsers and anything built on ffmpeg.

mod annexb;
mod encode;
mod mp4;
mod yuv;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

pub use self::mp4::Mp4Error;
use crate::bounded_read::ReadError;

/// Largest frame OpenH264 accepts (level 5.2): 3840 wide by 2160 high, or the transpose.
const MAX_LONG_SIDE: usize = 3840;
const MAX_SHORT_SIDE: usize = 2160;

/// Why a video could not be written.
#[derive(Debug, thiserror::Error)]
pub enum VideoError {
    #[error(
        "frame buffer holds {actual} bytes, expected {expected} for {num_frames} frames of {height}x{width} rgb"
    )]
    FrameBufferSize {
        expected: usize,
        actual: usize,
        num_frames: usize,
        height: usize,
        width: usize,
    },
    #[error("a video needs at least one frame")]
    NoFrames,
    #[error(
        "frame size {width}x{height} is not supported: each side must be at least 1 and at most {MAX_LONG_SIDE}x{MAX_SHORT_SIDE} (either orientation)"
    )]
    UnsupportedSize { width: usize, height: usize },
    #[error("frame rate must be at least 1 fps")]
    ZeroFps,
    #[error("h.264 encoder failed: {0}")]
    Encoder(String),
    #[error("h.264 encoder produced no picture for frame {frame}")]
    FrameDropped { frame: usize },
    #[error("h.264 encoder output has no sequence or picture parameter set")]
    MissingParameterSets,
    #[error("h.264 encoder changed its parameter sets at frame {frame}")]
    ParameterSetsChanged { frame: usize },
    #[error("encoded video of {bytes} bytes is too large for this mp4 writer (4 gib)")]
    TooLarge { bytes: u64 },
    #[error("cannot write video {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Encodes `frames` — `[num_frames, height, width, 3]` RGB `u8`, contiguous — as an H.264
/// (yuv420p) MP4 at `fps` frames per second, written to `path`.
///
/// Odd widths or heights are padded by one pixel (repeating the edge), since 4:2:0 chroma
/// needs even sizes; the video then is that one pixel larger. Every input frame becomes one
/// video frame: none are dropped or duplicated.
///
/// The file appears at `path` only once complete: it is written to a temporary file in the
/// same directory and renamed over `path`, so a crash or error never leaves a partial video
/// under the final name (an existing file at `path` is replaced).
pub fn write_mp4(
    path: &Path,
    frames: &[u8],
    num_frames: usize,
    height: usize,
    width: usize,
    fps: u32,
) -> Result<(), VideoError> {
    if num_frames == 0 {
        return Err(VideoError::NoFrames);
    }
    if fps == 0 {
        return Err(VideoError::ZeroFps);
    }
    let (padded_width, padded_height) = (width + width % 2, height + height % 2);
    let (long, short) = (
        padded_width.max(padded_height),
        padded_width.min(padded_height),
    );
    if width == 0 || height == 0 || long > MAX_LONG_SIDE || short > MAX_SHORT_SIDE {
        return Err(VideoError::UnsupportedSize { width, height });
    }
    let expected = num_frames
        .checked_mul(height * width * 3)
        .filter(|&n| n == frames.len());
    if expected.is_none() {
        return Err(VideoError::FrameBufferSize {
            expected: num_frames.saturating_mul(height * width * 3),
            actual: frames.len(),
            num_frames,
            height,
            width,
        });
    }

    let encoded = encode::encode_frames(
        frames,
        num_frames,
        (width, height),
        (padded_width, padded_height),
        fps,
    )?;
    let track = mp4::Track {
        // In range: checked against MAX_LONG_SIDE above.
        width: padded_width as u16,
        height: padded_height as u16,
        fps,
        sps: &encoded.sps,
        pps: &encoded.pps,
        samples: &encoded.samples,
    };
    let header = mp4::header(&track)?;
    write_atomically(path, |w| {
        w.write_all(&header)?;
        for sample in &encoded.samples {
            w.write_all(&sample.data)?;
        }
        Ok(())
    })
}

/// Writes `path` atomically ([`crate::atomic_file::write_with`]).
fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
) -> Result<(), VideoError> {
    crate::atomic_file::write_with(path, write).map_err(|source| VideoError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The largest video checked: far above what the runner writes (81 frames of 480×832 take a few
/// MB), small enough to read into memory.
const MP4_LIMIT: u64 = 4 << 30;

/// Why a file is not a whole MP4: it cannot be read, or its boxes say what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum Mp4CheckError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Incomplete(#[from] Mp4Error),
}

/// Checks that the file at `path` is a whole MP4 (what [`write_mp4`] leaves): a file cut short
/// or emptied by a crash, or not an MP4 at all, is an error saying what is wrong.
pub fn check_mp4(path: &Path) -> Result<(), Mp4CheckError> {
    let bytes = crate::bounded_read::read_bounded(path, MP4_LIMIT)?;
    Ok(mp4::check_complete(&bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_arguments_are_rejected_before_encoding() {
        let dir = std::env::temp_dir();
        let out = dir.join("unstep-video-unit-never-written.mp4");
        let frames = vec![0u8; 2 * 4 * 6 * 3];
        let err = write_mp4(&out, &frames, 3, 4, 6, 16).unwrap_err();
        assert!(matches!(
            err,
            VideoError::FrameBufferSize { expected: 216, .. }
        ));
        assert!(err.to_string().starts_with("frame buffer holds 144 bytes"));
        assert!(matches!(
            write_mp4(&out, &frames, 0, 4, 6, 16),
            Err(VideoError::NoFrames)
        ));
        assert!(matches!(
            write_mp4(&out, &frames, 2, 4, 6, 0),
            Err(VideoError::ZeroFps)
        ));
        assert!(matches!(
            write_mp4(&out, &[], 1, 0, 6, 16),
            Err(VideoError::UnsupportedSize { .. })
        ));
        assert!(matches!(
            write_mp4(&out, &[], 1, 4000, 4000, 16),
            Err(VideoError::UnsupportedSize { .. })
        ));
        assert!(!out.exists());
    }
}
