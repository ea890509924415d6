//! H.264 encoding with OpenH264, producing MP4-ready samples.

use openh264::encoder::{
    BitRate, Encoder, EncoderConfig, FrameRate, FrameType, IntraFramePeriod, QpRange,
    RateControlMode, UsageType, VuiConfig,
};
use openh264::formats::YUVSlices;
use openh264::{OpenH264API, Timestamp};

use super::VideoError;
use super::annexb::{NAL_AUD, NAL_IDR_SLICE, NAL_PPS, NAL_SPS, nal_type, split_nal_units};
use super::mp4::Sample;
use super::yuv::I420;

/// The encoded stream: parameter sets (for the MP4 sample description) and one sample per
/// input frame.
pub(crate) struct Encoded {
    pub sps: Vec<u8>,
    pub pps: Vec<u8>,
    pub samples: Vec<Sample>,
}

/// Bits per pixel per frame the rate controller aims for: 0.25 bpp is ~1.6 Mbit/s at 480×832
/// and 16 fps, generous for H.264 at that size (streaming sites use a fraction of it). These
/// are short research clips that people inspect closely, so size is cheap and artefacts are
/// not.
const TARGET_BITS_PER_PIXEL: f64 = 0.25;
/// Floor for tiny frames, where per-frame overhead dominates and a bpp target starves them.
const MIN_BITRATE_BPS: f64 = 1_000_000.0;
/// QP ceiling: even when the bitrate target is tight (fast motion), never quantise coarser
/// than this, trading overshoot for quality.
const MAX_QP: u8 = 30;
/// An IDR frame every this many seconds, so players can seek within a clip.
const KEYFRAME_INTERVAL_S: u32 = 2;

/// Encodes `num_frames` packed RGB frames of `width` × `height` (padded to `padded_width` ×
/// `padded_height`, both even) at `fps`.
pub(crate) fn encode_frames(
    frames: &[u8],
    num_frames: usize,
    (width, height): (usize, usize),
    (padded_width, padded_height): (usize, usize),
    fps: u32,
) -> Result<Encoded, VideoError> {
    let pixels = (padded_width * padded_height) as f64;
    let bitrate = (pixels * f64::from(fps) * TARGET_BITS_PER_PIXEL)
        .max(MIN_BITRATE_BPS)
        .min(f64::from(i32::MAX)) as u32;
    let config = EncoderConfig::new()
        .bitrate(BitRate::from_bps(bitrate))
        .max_frame_rate(FrameRate::from_hz(fps as f32))
        .rate_control_mode(RateControlMode::Bitrate)
        // Rate control may otherwise drop whole frames to hold the bitrate; every generated
        // frame must be in the video.
        .skip_frames(false)
        .usage_type(UsageType::CameraVideoRealTime)
        .qp(QpRange::new(0, MAX_QP))
        .intra_frame_period(IntraFramePeriod::from_num_frames(
            fps.saturating_mul(KEYFRAME_INTERVAL_S),
        ))
        // Tell decoders the matrix and range `yuv` converts with.
        .vui(VuiConfig::bt601());
    let mut encoder = Encoder::with_api_config(OpenH264API::from_source(), config)
        .map_err(|e| VideoError::Encoder(e.to_string()))?;
    silence_encoder_log(&mut encoder);

    let frame_len = width * height * 3;
    let mut picture = I420::new(padded_width, padded_height);
    let mut out = Encoded {
        sps: Vec::new(),
        pps: Vec::new(),
        samples: Vec::with_capacity(num_frames),
    };
    for (index, rgb) in frames.chunks_exact(frame_len).take(num_frames).enumerate() {
        picture.fill_from_rgb(rgb, width, height);
        let source = YUVSlices::new(
            (&picture.y, &picture.u, &picture.v),
            (padded_width, padded_height),
            (padded_width, padded_width / 2, padded_width / 2),
        );
        let timestamp = Timestamp::from_millis(index as u64 * 1000 / u64::from(fps));
        let stream = encoder
            .encode_at(&source, timestamp)
            .map_err(|e| VideoError::Encoder(e.to_string()))?;
        if matches!(stream.frame_type(), FrameType::Skip | FrameType::Invalid) {
            return Err(VideoError::FrameDropped { frame: index });
        }
        let annexb = stream.to_vec();
        out.samples
            .push(to_sample(&annexb, &mut out.sps, &mut out.pps, index)?);
    }
    if out.sps.is_empty() || out.pps.is_empty() {
        return Err(VideoError::MissingParameterSets);
    }
    Ok(out)
}

/// Keeps OpenH264 from printing to stderr. It initialises on the first frame and logs at
/// warning level until then; with frame skipping off it always warns that "bitrate can't be
/// controlled", which is exactly the trade we want (bitrate may overshoot, frames stay) and
/// would otherwise clutter the runner's output once per video. Failures still surface as
/// error codes from `encode_at`.
fn silence_encoder_log(encoder: &mut Encoder) {
    let mut level: u32 = openh264_sys2::WELS_LOG_QUIET as u32;
    // SAFETY: the trace level is one of the few options OpenH264 accepts before
    // initialisation (`CWelsH264SVCEncoder::SetOption` only stores it); it reads one u32
    // through the pointer during the call, and `level` outlives the call.
    unsafe {
        encoder.raw_api().set_option(
            openh264_sys2::ENCODER_OPTION_TRACE_LEVEL,
            (&raw mut level).cast(),
        );
    }
}

/// Converts one frame's Annex-B output into an AVCC sample. Parameter sets move out of the
/// sample into the `avcC` box (where `avc1` tracks keep them); OpenH264 repeats them before
/// every IDR, always identical with its default constant-ID strategy, which is checked here
/// because a changed SPS in a single-description track would corrupt decoding silently.
fn to_sample(
    annexb: &[u8],
    sps: &mut Vec<u8>,
    pps: &mut Vec<u8>,
    index: usize,
) -> Result<Sample, VideoError> {
    let mut sample = Sample {
        data: Vec::with_capacity(annexb.len() + 16),
        sync: false,
    };
    for nal in split_nal_units(annexb) {
        match nal_type(nal) {
            kind @ (NAL_SPS | NAL_PPS) => {
                let slot = if kind == NAL_SPS {
                    &mut *sps
                } else {
                    &mut *pps
                };
                if slot.is_empty() {
                    slot.extend_from_slice(nal);
                } else if slot != nal {
                    return Err(VideoError::ParameterSetsChanged { frame: index });
                }
            }
            // Access unit delimiters are optional in MP4 and only waste bytes.
            NAL_AUD => {}
            kind => {
                sample.sync |= kind == NAL_IDR_SLICE;
                sample
                    .data
                    .extend_from_slice(&(nal.len() as u32).to_be_bytes());
                sample.data.extend_from_slice(nal);
            }
        }
    }
    if sample.data.is_empty() {
        return Err(VideoError::FrameDropped { frame: index });
    }
    Ok(sample)
}
