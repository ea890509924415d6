//! A minimal MP4 (ISO/IEC 14496-12 and -15) muxer for one H.264 video track.
//!
//! It writes only what players need for a short, constant-frame-rate clip without B-frames:
//!
//! ```text
//! ftyp
//! moov
//!   mvhd
//!   trak
//!     tkhd
//!     mdia
//!       mdhd, hdlr
//!       minf
//!         vmhd, dinf/dref/url
//!         stbl
//!           stsd/avc1/avcC   parameter sets and profile, once
//!           stts             one entry: every sample lasts one frame
//!           stss             which samples are IDR (seek points)
//!           stsc, stco       all samples in a single chunk at one offset
//!           stsz             per-sample sizes
//! mdat                       the samples, back to back, in AVCC (length-prefixed) form
//! ```
//!
//! `moov` goes before `mdat` ("fast start") so a browser can start playing before the whole
//! file has arrived. Its size does not depend on the chunk offset it stores, so it is built
//! once to measure and once with the real offset.

use super::VideoError;

/// One encoded frame: its NAL units in AVCC form (4-byte big-endian length + unit).
pub(crate) struct Sample {
    pub data: Vec<u8>,
    /// An IDR picture, which a decoder can start from.
    pub sync: bool,
}

/// Everything the container needs to describe the video track.
pub(crate) struct Track<'a> {
    pub width: u16,
    pub height: u16,
    /// Frames per second; also used to pick the media timescale.
    pub fps: u32,
    /// The sequence parameter set NAL unit, without a start code.
    pub sps: &'a [u8],
    /// The picture parameter set NAL unit, without a start code.
    pub pps: &'a [u8],
    pub samples: &'a [Sample],
}

/// Ticks per frame in the media timescale. A timescale of `fps × 1000` keeps every frame
/// duration an exact integer and is fine-grained enough that no player rounds it oddly.
const TICKS_PER_FRAME: u32 = 1000;

/// The file header: `ftyp`, `moov` and the 8-byte `mdat` header. The sample data, in order,
/// follows it directly to make the complete file.
pub(crate) fn header(track: &Track<'_>) -> Result<Vec<u8>, VideoError> {
    let mdat_payload: u64 = track.samples.iter().map(|s| s.data.len() as u64).sum();
    let too_large = || VideoError::TooLarge {
        bytes: mdat_payload,
    };
    if track.sps.len() < 4 || track.pps.is_empty() {
        return Err(VideoError::MissingParameterSets);
    }
    let timescale = track
        .fps
        .checked_mul(TICKS_PER_FRAME)
        .ok_or_else(too_large)?;
    let num_samples = u32::try_from(track.samples.len()).map_err(|_| too_large())?;
    let duration = num_samples
        .checked_mul(TICKS_PER_FRAME)
        .ok_or_else(too_large)?;
    let ctx = Ctx {
        track,
        timescale,
        duration,
        num_samples,
    };

    let mut ftyp = Vec::new();
    write_box(&mut ftyp, b"ftyp", |b| {
        b.extend_from_slice(b"isom"); // major brand
        put_u32(b, 0x200); // minor version
        for brand in [b"isom", b"iso2", b"avc1", b"mp41"] {
            b.extend_from_slice(brand);
        }
    });

    // Measure moov with a dummy offset, then build it for real: stco holds a fixed-width
    // u32 either way.
    let moov_len = ctx.moov(0).len() as u64;
    let chunk_offset = ftyp.len() as u64 + moov_len + 8;
    let mdat_len = 8 + mdat_payload;
    let chunk_offset = u32::try_from(chunk_offset).map_err(|_| too_large())?;
    // stco is 32-bit and mdat uses a 32-bit size; videos here are a few MB, so rather than
    // writing co64 and a large-size mdat, refuse the (never expected) multi-GB case.
    let mdat_len = u32::try_from(mdat_len)
        .ok()
        .filter(|len| len.checked_add(chunk_offset).is_some())
        .ok_or_else(too_large)?;

    let mut out = ftyp;
    out.extend_from_slice(&ctx.moov(chunk_offset));
    put_u32(&mut out, mdat_len);
    out.extend_from_slice(b"mdat");
    Ok(out)
}

struct Ctx<'a> {
    track: &'a Track<'a>,
    timescale: u32,
    duration: u32,
    num_samples: u32,
}

/// A 3×3 identity transformation matrix in 16.16 / 2.30 fixed point, as mvhd and tkhd want.
const IDENTITY_MATRIX: [u32; 9] = [0x0001_0000, 0, 0, 0, 0x0001_0000, 0, 0, 0, 0x4000_0000];

impl Ctx<'_> {
    fn moov(&self, chunk_offset: u32) -> Vec<u8> {
        let mut out = Vec::new();
        write_box(&mut out, b"moov", |b| {
            self.mvhd(b);
            write_box(b, b"trak", |b| {
                self.tkhd(b);
                write_box(b, b"mdia", |b| {
                    self.mdhd(b);
                    hdlr(b);
                    write_box(b, b"minf", |b| {
                        write_full_box(b, b"vmhd", 0, 1, |b| {
                            put_u16(b, 0); // graphics mode: copy
                            b.extend_from_slice(&[0; 6]); // opcolor
                        });
                        write_box(b, b"dinf", |b| {
                            write_full_box(b, b"dref", 0, 0, |b| {
                                put_u32(b, 1); // entry count
                                // Flag 1: the media data is in this same file.
                                write_full_box(b, b"url ", 0, 1, |_| {});
                            });
                        });
                        self.stbl(b, chunk_offset);
                    });
                });
            });
        });
        out
    }

    fn mvhd(&self, b: &mut Vec<u8>) {
        write_full_box(b, b"mvhd", 0, 0, |b| {
            // Creation and modification times stay 0 so the same frames give the same bytes.
            put_u32(b, 0);
            put_u32(b, 0);
            put_u32(b, self.timescale);
            put_u32(b, self.duration);
            put_u32(b, 0x0001_0000); // rate 1.0
            put_u16(b, 0x0100); // volume 1.0
            b.extend_from_slice(&[0; 10]); // reserved
            IDENTITY_MATRIX.iter().for_each(|&m| put_u32(b, m));
            b.extend_from_slice(&[0; 24]); // pre_defined
            put_u32(b, 2); // next track ID
        });
    }

    fn tkhd(&self, b: &mut Vec<u8>) {
        // Flags: track enabled (1) | in movie (2).
        write_full_box(b, b"tkhd", 0, 3, |b| {
            put_u32(b, 0); // creation time
            put_u32(b, 0); // modification time
            put_u32(b, 1); // track ID
            put_u32(b, 0); // reserved
            put_u32(b, self.duration); // in the movie timescale, which equals the media one
            b.extend_from_slice(&[0; 8]); // reserved
            put_u16(b, 0); // layer
            put_u16(b, 0); // alternate group
            put_u16(b, 0); // volume: 0 for video
            put_u16(b, 0); // reserved
            IDENTITY_MATRIX.iter().for_each(|&m| put_u32(b, m));
            put_u32(b, u32::from(self.track.width) << 16); // 16.16 fixed point
            put_u32(b, u32::from(self.track.height) << 16);
        });
    }

    fn mdhd(&self, b: &mut Vec<u8>) {
        write_full_box(b, b"mdhd", 0, 0, |b| {
            put_u32(b, 0);
            put_u32(b, 0);
            put_u32(b, self.timescale);
            put_u32(b, self.duration);
            // Language "und" packed as three 5-bit letters (each minus 0x60).
            put_u16(b, 0x55C4);
            put_u16(b, 0); // pre_defined
        });
    }

    fn stbl(&self, b: &mut Vec<u8>, chunk_offset: u32) {
        let samples = self.track.samples;
        write_box(b, b"stbl", |b| {
            write_full_box(b, b"stsd", 0, 0, |b| {
                put_u32(b, 1); // entry count
                self.avc1(b);
            });
            write_full_box(b, b"stts", 0, 0, |b| {
                put_u32(b, 1); // one run of equal durations
                put_u32(b, self.num_samples);
                put_u32(b, TICKS_PER_FRAME);
            });
            // Without stss every sample counts as a sync sample, which would make players
            // seek to P-frames; with it, only IDR frames are seek points.
            let sync: Vec<u32> = (1..)
                .zip(samples)
                .filter(|(_, s)| s.sync)
                .map(|(n, _)| n)
                .collect();
            write_full_box(b, b"stss", 0, 0, |b| {
                put_u32(b, sync.len() as u32);
                sync.iter().for_each(|&n| put_u32(b, n));
            });
            write_full_box(b, b"stsc", 0, 0, |b| {
                put_u32(b, 1); // entry count
                put_u32(b, 1); // first chunk
                put_u32(b, self.num_samples); // samples per chunk: all of them
                put_u32(b, 1); // sample description index
            });
            write_full_box(b, b"stsz", 0, 0, |b| {
                put_u32(b, 0); // sizes vary: listed below
                put_u32(b, self.num_samples);
                samples.iter().for_each(|s| put_u32(b, s.data.len() as u32));
            });
            write_full_box(b, b"stco", 0, 0, |b| {
                put_u32(b, 1); // one chunk
                put_u32(b, chunk_offset);
            });
        });
    }

    /// The visual sample entry for AVC with its decoder configuration (ISO/IEC 14496-15 §5.3).
    fn avc1(&self, b: &mut Vec<u8>) {
        let (sps, pps) = (self.track.sps, self.track.pps);
        write_box(b, b"avc1", |b| {
            b.extend_from_slice(&[0; 6]); // reserved
            put_u16(b, 1); // data reference index
            b.extend_from_slice(&[0; 16]); // pre_defined and reserved
            put_u16(b, self.track.width);
            put_u16(b, self.track.height);
            put_u32(b, 0x0048_0000); // 72 dpi horizontally
            put_u32(b, 0x0048_0000); // and vertically
            put_u32(b, 0); // reserved
            put_u16(b, 1); // frames per sample
            b.extend_from_slice(&[0; 32]); // compressor name: empty Pascal string
            put_u16(b, 0x0018); // depth: colour, no alpha
            put_u16(b, 0xFFFF); // pre_defined = -1
            write_box(b, b"avcC", |b| {
                b.push(1); // configuration version
                // Profile, compatibility flags and level come straight from the SPS header.
                b.extend_from_slice(&sps[1..4]);
                b.push(0xFF); // 6 reserved bits + lengthSizeMinusOne = 3 (4-byte lengths)
                b.push(0xE1); // 3 reserved bits + one SPS
                put_u16(b, sps.len() as u16);
                b.extend_from_slice(sps);
                b.push(1); // one PPS
                put_u16(b, pps.len() as u16);
                b.extend_from_slice(pps);
            });
        });
    }
}

fn hdlr(b: &mut Vec<u8>) {
    write_full_box(b, b"hdlr", 0, 0, |b| {
        put_u32(b, 0); // pre_defined
        b.extend_from_slice(b"vide");
        b.extend_from_slice(&[0; 12]); // reserved
        b.extend_from_slice(b"VideoHandler\0");
    });
}

/// Why a file is not a whole MP4 as [`header`] and the encoder write one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mp4Error {
    #[error("{0} stray bytes after the last box")]
    StrayBytes(usize),
    #[error("a box's 64-bit size is cut off")]
    SizeCutOff,
    /// A box's size is below its header's, or above the `left` bytes from its start to the end.
    #[error("box `{name}` at byte {at} claims {size} bytes; the file ends {left} bytes later")]
    BoxOverrun {
        name: String,
        at: usize,
        size: u64,
        left: usize,
    },
    #[error("it does not start with an `ftyp` box")]
    NoFtyp,
    #[error("it has no `{0}` box")]
    NoBox(&'static str),
    #[error("its `mdat` box is empty")]
    EmptyMdat,
}

/// Checks that a file is a whole MP4 as [`header`] and the encoder write one: top-level boxes
/// that tile the file exactly, `ftyp` first, then `mdat` and `moov` with a non-empty `mdat`. A
/// file cut short by a crash, or empty, fails, naming what is wrong.
pub fn check_complete(bytes: &[u8]) -> Result<(), Mp4Error> {
    let mut at = 0usize;
    let mut kinds = Vec::new();
    let mut mdat_payload = 0u64;
    while at < bytes.len() {
        if bytes.len() - at < 8 {
            return Err(Mp4Error::StrayBytes(bytes.len() - at));
        }
        let size32 = u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let kind: [u8; 4] = bytes[at + 4..at + 8].try_into().expect("4 bytes");
        let (size, header) = match size32 {
            0 => ((bytes.len() - at) as u64, 8),
            1 if bytes.len() - at >= 16 => (
                u64::from_be_bytes(bytes[at + 8..at + 16].try_into().expect("8 bytes")),
                16,
            ),
            1 => return Err(Mp4Error::SizeCutOff),
            n => (u64::from(n), 8),
        };
        if size < header || at as u64 + size > bytes.len() as u64 {
            return Err(Mp4Error::BoxOverrun {
                name: String::from_utf8_lossy(&kind).into_owned(),
                at,
                size,
                left: bytes.len() - at,
            });
        }
        if &kind == b"mdat" {
            mdat_payload = size - header;
        }
        kinds.push(kind);
        at += size as usize;
    }
    if kinds.first() != Some(b"ftyp") {
        return Err(Mp4Error::NoFtyp);
    }
    for needed in ["mdat", "moov"] {
        if !kinds.iter().any(|k| k.as_slice() == needed.as_bytes()) {
            return Err(Mp4Error::NoBox(needed));
        }
    }
    if mdat_payload == 0 {
        return Err(Mp4Error::EmptyMdat);
    }
    Ok(())
}

/// Appends a box: 32-bit size, four-character type, then whatever `body` writes. The size is
/// patched in afterwards, so nesting calls builds the tree without computing sizes by hand.
fn write_box(out: &mut Vec<u8>, kind: &[u8; 4], body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    put_u32(out, 0);
    out.extend_from_slice(kind);
    body(out);
    let size = (out.len() - start) as u32;
    out[start..start + 4].copy_from_slice(&size.to_be_bytes());
}

/// A "full box": a box whose body starts with a version byte and 24 bits of flags.
fn write_full_box(
    out: &mut Vec<u8>,
    kind: &[u8; 4],
    version: u8,
    flags: u32,
    body: impl FnOnce(&mut Vec<u8>),
) {
    write_box(out, kind, |b| {
        put_u32(b, (u32::from(version) << 24) | (flags & 0x00FF_FFFF));
        body(b);
    });
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A parsed box: type, offset of the box and its total size.
    #[derive(Debug)]
    struct Box4 {
        kind: [u8; 4],
        start: usize,
        size: usize,
    }

    /// Parses the boxes that exactly tile `buf[from..to]`, panicking when one overruns.
    fn boxes(buf: &[u8], from: usize, to: usize) -> Vec<Box4> {
        let mut out = Vec::new();
        let mut at = from;
        while at < to {
            assert!(at + 8 <= to, "truncated box header at {at}");
            let size = u32::from_be_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
            let kind: [u8; 4] = buf[at + 4..at + 8].try_into().unwrap();
            assert!(
                size >= 8 && at + size <= to,
                "box {kind:?} at {at} overruns its parent"
            );
            out.push(Box4 {
                kind,
                start: at,
                size,
            });
            at += size;
        }
        assert_eq!(at, to, "children do not fill their parent exactly");
        out
    }

    /// Walks the whole tree, checking every container is tiled exactly by its children, and
    /// returns each box as (path, start, size), e.g. ("moov/trak/tkhd", 123, 92).
    fn walk(buf: &[u8], from: usize, to: usize, prefix: &str, out: &mut Vec<(String, Box4)>) {
        for bx in boxes(buf, from, to) {
            let name = std::str::from_utf8(&bx.kind).unwrap();
            let path = if prefix.is_empty() {
                name.to_string()
            } else {
                format!("{prefix}/{name}")
            };
            // Where the children begin, for the container boxes this muxer writes.
            let children_at = match name {
                "moov" | "trak" | "mdia" | "minf" | "dinf" | "stbl" => Some(8),
                "stsd" | "dref" => Some(16), // full box header + entry count
                "avc1" => Some(86),          // visual sample entry fields
                _ => None,
            };
            let (start, size) = (bx.start, bx.size);
            out.push((path.clone(), bx));
            if let Some(skip) = children_at {
                walk(buf, start + skip, start + size, &path, out);
            }
        }
    }

    fn u32_at(buf: &[u8], at: usize) -> u32 {
        u32::from_be_bytes(buf[at..at + 4].try_into().unwrap())
    }

    fn fake_track_file(samples: &[Sample]) -> Vec<u8> {
        let sps = [0x67, 0x42, 0xC0, 0x1E, 0xAB];
        let pps = [0x68, 0xCE, 0x3C, 0x80];
        let track = Track {
            width: 64,
            height: 112,
            fps: 16,
            sps: &sps,
            pps: &pps,
            samples,
        };
        let mut file = header(&track).unwrap();
        for s in samples {
            file.extend_from_slice(&s.data);
        }
        file
    }

    #[test]
    fn box_sizes_are_consistent_and_offsets_point_into_mdat() {
        let samples: Vec<Sample> = (0..5)
            .map(|i| Sample {
                data: vec![i as u8; 10 + i * 7],
                sync: i % 3 == 0,
            })
            .collect();
        let file = fake_track_file(&samples);
        let mut tree = Vec::new();
        walk(&file, 0, file.len(), "", &mut tree);
        let find = |p: &str| {
            &tree
                .iter()
                .find(|(path, _)| path == p)
                .unwrap_or_else(|| panic!("no {p}"))
                .1
        };

        let top: Vec<&str> = tree
            .iter()
            .filter(|(p, _)| !p.contains('/'))
            .map(|(p, _)| p.as_str())
            .collect();
        assert_eq!(
            top,
            ["ftyp", "moov", "mdat"],
            "fast start: moov before mdat"
        );
        for path in [
            "moov/mvhd",
            "moov/trak/tkhd",
            "moov/trak/mdia/mdhd",
            "moov/trak/mdia/hdlr",
            "moov/trak/mdia/minf/vmhd",
            "moov/trak/mdia/minf/dinf/dref/url ",
            "moov/trak/mdia/minf/stbl/stsd/avc1/avcC",
        ] {
            find(path);
        }
        // Fixed-size boxes have the sizes the specification gives them.
        assert_eq!(find("moov/mvhd").size, 108);
        assert_eq!(find("moov/trak/tkhd").size, 92);
        assert_eq!(find("moov/trak/mdia/mdhd").size, 32);

        let mdat = find("mdat");
        let payload: usize = samples.iter().map(|s| s.data.len()).sum();
        assert_eq!(mdat.size, 8 + payload);
        let stco = find("moov/trak/mdia/minf/stbl/stco");
        assert_eq!(u32_at(&file, stco.start + 16) as usize, mdat.start + 8);

        let stsz = find("moov/trak/mdia/minf/stbl/stsz");
        assert_eq!(u32_at(&file, stsz.start + 16), 5);
        let sizes: Vec<usize> = (0..5)
            .map(|i| u32_at(&file, stsz.start + 20 + 4 * i) as usize)
            .collect();
        assert_eq!(sizes, [10, 17, 24, 31, 38]);

        let stss = find("moov/trak/mdia/minf/stbl/stss");
        assert_eq!(u32_at(&file, stss.start + 12), 2);
        assert_eq!(
            [
                u32_at(&file, stss.start + 16),
                u32_at(&file, stss.start + 20)
            ],
            [1, 4]
        );

        // 5 frames at 16 fps: duration 5 × 1000 ticks at a 16000 Hz timescale.
        let mdhd = find("moov/trak/mdia/mdhd");
        assert_eq!(u32_at(&file, mdhd.start + 20), 16_000);
        assert_eq!(u32_at(&file, mdhd.start + 24), 5_000);

        let avcc = find("moov/trak/mdia/minf/stbl/stsd/avc1/avcC");
        assert_eq!(
            &file[avcc.start + 8..avcc.start + 12],
            [1, 0x42, 0xC0, 0x1E]
        );
    }

    #[test]
    fn missing_parameter_sets_are_an_error() {
        let track = Track {
            width: 2,
            height: 2,
            fps: 16,
            sps: &[],
            pps: &[],
            samples: &[],
        };
        assert!(matches!(
            header(&track),
            Err(VideoError::MissingParameterSets)
        ));
    }

    #[test]
    fn whole_files_pass_the_completeness_check_and_cut_ones_fail() {
        let file = fake_track_file(&[Sample {
            data: vec![0, 0, 0, 2, 0x65, 0x88],
            sync: true,
        }]);
        assert_eq!(check_complete(&file), Ok(()));
        assert!(
            check_complete(&[])
                .unwrap_err()
                .to_string()
                .contains("ftyp")
        );
        for cut in [file.len() - 1, file.len() / 2, 12] {
            let error = check_complete(&file[..cut]).unwrap_err().to_string();
            assert!(
                error.contains("claims") || error.contains("stray"),
                "{cut}: {error}"
            );
        }
    }
}
