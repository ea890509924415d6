//! MP4 output checked by an independent decoder: PyAV, i.e. FFmpeg's demuxer and H.264
//! decoder. A missing decoder fails these tests rather than skipping them: `scripts/test`
//! installs the pinned PyAV into the test interpreter's environment (`.cache/pyenv`) and points
//! `UNSTEP_TEST_PYTHON` at it.

use std::f64::consts::TAU;
use std::path::{Path, PathBuf};
use std::process::Command;

use unstep::video::{VideoError, write_mp4};

/// Decodes the video at argv[1] with PyAV, writes every frame as packed RGB to argv[2] and
/// prints what the container and decoder report as JSON.
const DECODE_PY: &str = r#"
import json, sys
import av

src, raw_out = sys.argv[1], sys.argv[2]
with av.open(src) as container:
    stream = container.streams.video[0]
    ctx = stream.codec_context
    meta = {
        "format": container.format.name,
        "codec": ctx.name,
        "width": ctx.width,
        "height": ctx.height,
        "pix_fmt": ctx.pix_fmt,
        "container_frames": stream.frames,
        "fps": float(stream.average_rate),
        "keyframes": [],
        "sync_packets": [],
        "times": [],
    }
    with open(raw_out, "wb") as out:
        packets = (p for p in container.demux(stream) if p.size)
        for i, packet in enumerate(packets):
            # From the container's sync-sample table (stss).
            if packet.is_keyframe:
                meta["sync_packets"].append(i)
            frames = packet.decode()
            assert len(frames) == 1, f"packet {i} gave {len(frames)} frames"
            frame = frames[0]
            # From the bitstream: an IDR picture.
            if frame.key_frame:
                meta["keyframes"].append(i)
            meta["times"].append(float(frame.time))
            # swscale's YUV->RGB: BT.601 limited range, as signalled in the stream.
            rgb = frame.reformat(format="rgb24")
            plane = rgb.planes[0]
            data = bytes(plane)
            row = rgb.width * 3
            for y in range(rgb.height):
                start = y * plane.line_size
                out.write(data[start:start + row])
print(json.dumps(meta))
"#;

/// What the independent decoder saw.
struct Decoded {
    meta: serde_json::Value,
    /// All frames, packed RGB, `[frames, height, width, 3]`.
    rgb: Vec<u8>,
}

/// The interpreter of the Python test packages: `UNSTEP_TEST_PYTHON`, or where scripts/test
/// makes it, so a plain `cargo test` works after one run of scripts/test.
fn test_python() -> PathBuf {
    std::env::var_os("UNSTEP_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/pyenv/bin/python"))
}

fn decode(video: &Path) -> Decoded {
    let raw = video.with_extension("rgb");
    let python = test_python();
    let out = Command::new(&python)
        .arg("-c")
        .arg(DECODE_PY)
        .arg(video)
        .arg(&raw)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {python:?} ({e}): run scripts/test, which installs the test packages"
            )
        });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'av'"),
        "PyAV is missing from {python:?}: run scripts/test, which installs it \
         (or set UNSTEP_TEST_PYTHON to an interpreter that has av==18.1.0)"
    );
    assert!(out.status.success(), "decoding {video:?} failed:\n{stderr}");
    Decoded {
        meta: serde_json::from_slice(&out.stdout).expect("decoder prints JSON"),
        rgb: std::fs::read(&raw).expect("decoder wrote the frames"),
    }
}

/// A smooth, moving test pattern: a horizontal sine drifting right, a vertical ramp and a
/// diagonal wave drifting the other way. Smooth content is what a lossy codec reproduces
/// closely, and the motion makes consecutive frames differ, so a dropped, duplicated or
/// reordered frame shows up as a large per-frame error.
fn pattern(num_frames: usize, height: usize, width: usize) -> Vec<u8> {
    let mut frames = Vec::with_capacity(num_frames * height * width * 3);
    // Wavelengths of at least 256 pixels: on tiny frames a full colour wave across the frame
    // would change many codes per pixel, and 4:2:0 chroma subsampling alone (before any
    // compression) would then cost several codes of error.
    let (wave_x, wave_y) = (width.max(256) as f64, height.max(256) as f64);
    for t in 0..num_frames {
        let phase = t as f64 / 12.0;
        for y in 0..height {
            for x in 0..width {
                let (u, v) = (x as f64 / wave_x, y as f64 / wave_y);
                let r = 128.0 + 90.0 * (TAU * (u - phase)).sin();
                let g = 30.0 + 190.0 * v;
                let b = 128.0 + 90.0 * (TAU * (u + v + phase)).cos();
                frames.extend([r, g, b].map(|c| c.round().clamp(0.0, 255.0) as u8));
            }
        }
    }
    frames
}

/// Mean absolute difference per channel value between `frame` of `src` (`src_width` wide)
/// and of `dec` (`dec_width` wide), over the source's `height` × `src_width` area.
fn frame_mae(
    src: &[u8],
    dec: &[u8],
    frame: usize,
    height: usize,
    (src_width, dec_width): (usize, usize),
    dec_height: usize,
) -> f64 {
    let src = &src[frame * height * src_width * 3..];
    let dec = &dec[frame * dec_height * dec_width * 3..];
    let mut total = 0u64;
    for y in 0..height {
        let a = &src[y * src_width * 3..(y + 1) * src_width * 3];
        let b = &dec[y * dec_width * 3..y * dec_width * 3 + src_width * 3];
        total += a
            .iter()
            .zip(b)
            .map(|(&p, &q)| u64::from(p.abs_diff(q)))
            .sum::<u64>();
    }
    total as f64 / (height * src_width * 3) as f64
}

/// Writes the pattern, decodes it and checks structure and pixels. Returns the decoded meta.
fn round_trip(
    dir: &Path,
    num_frames: usize,
    height: usize,
    width: usize,
    fps: u32,
) -> serde_json::Value {
    let frames = pattern(num_frames, height, width);
    let path = dir.join(format!("clip-{height}x{width}.mp4"));
    write_mp4(&path, &frames, num_frames, height, width, fps).expect("write_mp4");

    let Decoded { meta, rgb } = decode(&path);
    let (dec_w, dec_h) = (width + width % 2, height + height % 2);
    assert!(meta["format"].as_str().unwrap().contains("mp4"), "{meta}");
    assert_eq!(meta["codec"], "h264", "{meta}");
    assert_eq!(meta["pix_fmt"], "yuv420p", "{meta}");
    assert_eq!(meta["width"], dec_w, "{meta}");
    assert_eq!(meta["height"], dec_h, "{meta}");
    assert_eq!(meta["container_frames"], num_frames, "{meta}");
    assert_eq!(meta["fps"], f64::from(fps), "{meta}");
    let times: Vec<f64> = serde_json::from_value(meta["times"].clone()).unwrap();
    assert_eq!(times.len(), num_frames, "decoded frame count: {meta}");
    for (i, t) in times.iter().enumerate() {
        let expected = i as f64 / f64::from(fps);
        assert!(
            (t - expected).abs() < 1e-3,
            "frame {i} at {t}s, not {expected}s"
        );
    }
    assert_eq!(rgb.len(), num_frames * dec_h * dec_w * 3);
    // The container marks exactly the IDR pictures as seek points.
    assert_eq!(meta["sync_packets"], meta["keyframes"], "{meta}");

    // Constrained-baseline H.264 at this bitrate plus 8-bit YUV rounding on both sides:
    // a few codes of error on smooth content; a colour-matrix or frame mix-up gives tens.
    let maes: Vec<f64> = (0..num_frames)
        .map(|i| frame_mae(&frames, &rgb, i, height, (width, dec_w), dec_h))
        .collect();
    let mean = maes.iter().sum::<f64>() / num_frames as f64;
    let worst = maes.iter().cloned().fold(0.0, f64::max);
    eprintln!("{height}x{width}: mean abs error {mean:.2}, worst frame {worst:.2}");
    assert!(mean < 2.5, "mean abs error {mean:.2}: {maes:?}");
    assert!(worst < 3.0, "worst frame abs error {worst:.2}: {maes:?}");
    // The error against the *next* input frame is much larger, so the checks above would
    // catch an off-by-one frame.
    if num_frames > 1 {
        let next = &frames[height * width * 3..];
        let shifted = frame_mae(next, &rgb, 0, height, (width, dec_w), dec_h);
        assert!(
            shifted > 3.0 * worst,
            "pattern moves too little: {shifted:.2}"
        );
    }
    meta
}

#[test]
fn tiny_video_decodes_to_the_same_frames() {
    let dir = tempfile::tempdir().unwrap();
    // 33 frames at 16 fps: just over two seconds, so a second keyframe (every 2 s) appears.
    let meta = round_trip(dir.path(), 33, 112, 64, 16);
    let keyframes: Vec<usize> = serde_json::from_value(meta["keyframes"].clone()).unwrap();
    assert_eq!(keyframes[0], 0, "{meta}");
    // An IDR at least every 2 s (32 frames); OpenH264 may add more at scene changes.
    assert!(keyframes.len() >= 2, "{meta}");
    assert!(keyframes.windows(2).all(|w| w[1] - w[0] <= 32), "{meta}");
    // The temporary file was renamed away; only the video and the decoder's dump remain.
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["clip-112x64.mp4", "clip-112x64.rgb"]);
}

#[test]
fn full_size_video_decodes_to_the_same_frames() {
    let dir = tempfile::tempdir().unwrap();
    round_trip(dir.path(), 9, 480, 832, 16);
}

#[test]
fn odd_sizes_are_padded_to_even() {
    let dir = tempfile::tempdir().unwrap();
    round_trip(dir.path(), 5, 37, 51, 24);
}

#[test]
fn single_frame_video() {
    let dir = tempfile::tempdir().unwrap();
    let meta = round_trip(dir.path(), 1, 16, 16, 16);
    assert_eq!(meta["keyframes"], serde_json::json!([0]));
}

#[test]
fn failed_write_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let frames = pattern(2, 16, 16);
    let path = dir.path().join("missing-dir/clip.mp4");
    let err = write_mp4(&path, &frames, 2, 16, 16, 16).unwrap_err();
    assert!(matches!(err, VideoError::Io { .. }), "{err}");
    assert!(err.to_string().starts_with("cannot write video "), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn rewriting_replaces_the_previous_video() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clip.mp4");
    std::fs::write(&path, b"old contents").unwrap();
    let frames = pattern(3, 16, 16);
    write_mp4(&path, &frames, 3, 16, 16, 16).unwrap();
    assert_eq!(decode(&path).meta["container_frames"], 3);
}

/// Encode time of a full-length, full-size clip. A measurement, not a check (debug builds are
/// far slower): `cargo test --release --test it video::encode_speed -- --ignored --nocapture`.
#[test]
#[ignore = "timing only; run in release"]
fn encode_speed() {
    let (num_frames, height, width) = (81, 480, 832);
    let frames = pattern(num_frames, height, width);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clip.mp4");
    let (start, cpu_start) = (std::time::Instant::now(), process_cpu_seconds());
    write_mp4(&path, &frames, num_frames, height, width, 16).unwrap();
    let (elapsed, cpu) = (start.elapsed(), process_cpu_seconds() - cpu_start);
    let bytes = std::fs::metadata(&path).unwrap().len();
    // CPU time as well as wall time: on a shared machine wall time mostly measures the load.
    eprintln!(
        "{num_frames} frames of {height}x{width}: {elapsed:.2?} wall, {cpu:.2}s cpu, {bytes} bytes"
    );
}

/// User + system CPU seconds this process has used so far, all threads.
fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}
