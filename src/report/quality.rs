//! How far one run's outputs are from another's on the same noise, from the arrays both kept
//! (`outputs.save_latents`, `outputs.save_frames`): `runner compare`'s quality section. It is how
//! a reduced precision, an ablation or another build is measured against a reference run on a
//! checkpoint of one's own: the latents' relative L2 error and the frames' PSNR, before any
//! video compression.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;

use super::load::LoadedRun;
use crate::results::arrays::{ArrayKind, kept_files};
use crate::results::files::RecordError;
use crate::results::records::ProcessRole;

/// Why a pair of kept arrays could not be compared, naming the file.
#[derive(Debug, thiserror::Error)]
enum QualityError {
    #[error(transparent)]
    Open(#[from] RecordError),
    #[error(
        "{} holds {a_len} bytes and {} {b_len}: the runs made outputs of other shapes",
        a.display(),
        b.display()
    )]
    Lengths {
        a: PathBuf,
        a_len: u64,
        b: PathBuf,
        b_len: u64,
    },
    #[error("cannot read {}: {source} (changed while read?)", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{} holds {len} bytes, not whole float32 values", path.display())]
    NotFloat32 { path: PathBuf, len: u64 },
}

/// One run's latents against the reference's, over the prompts both kept.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatentQuality {
    pub prompts: usize,
    /// Prompts whose latents are bit for bit the reference's.
    pub identical: usize,
    /// The mean over the prompts of ‖b − a‖ / ‖a‖ (in JSON, `"NaN"` or `"inf"` when not finite,
    /// never `null`, which means "no inputs" elsewhere).
    #[serde(serialize_with = "number_or_word")]
    pub mean_relative_l2: f64,
    /// The largest of them, and its prompt (none when every prompt is identical).
    #[serde(serialize_with = "number_or_word")]
    pub max_relative_l2: f64,
    pub worst_prompt: Option<u32>,
    /// Each prompt's error, in prompt order (`--json` only).
    pub per_prompt: Vec<PromptLatents>,
}

/// One prompt's latents against the reference's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptLatents {
    pub prompt: u32,
    #[serde(serialize_with = "number_or_word")]
    pub relative_l2: f64,
}

/// A float as a JSON number when finite, else as the word for it (`"NaN"`, `"inf"`, `"-inf"`):
/// JSON has no number for them, and `null` would read as "no inputs".
fn number_or_word<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    match *v {
        v if v.is_finite() => s.serialize_f64(v),
        v if v.is_nan() => s.serialize_str("NaN"),
        v if v > 0.0 => s.serialize_str("inf"),
        _ => s.serialize_str("-inf"),
    }
}

/// One prompt's frames against the reference's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptFrames {
    pub prompt: u32,
    /// None for identical frames.
    pub psnr_db: Option<f64>,
    pub max_abs_diff: u8,
}

/// One run's frames against the reference's, over the prompts both kept.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FrameQuality {
    pub prompts: usize,
    /// Prompts whose frames are byte for byte the reference's.
    pub identical: usize,
    /// The mean PSNR in dB over the prompts whose frames differ (none when none differ).
    pub mean_psnr_db: Option<f64>,
    /// The lowest PSNR, and its prompt.
    pub min_psnr_db: Option<f64>,
    pub worst_prompt: Option<u32>,
    /// The mean absolute difference over every value of every prompt, in levels of 255.
    pub mean_abs_diff: f64,
    pub max_abs_diff: u8,
    /// Each prompt's figures, in prompt order (`--json` only).
    pub per_prompt: Vec<PromptFrames>,
}

/// A run measured against the reference run (the first of a comparison).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Quality {
    /// The run measured.
    pub run: String,
    /// The reference.
    pub against: String,
    pub latents: Option<LatentQuality>,
    pub frames: Option<FrameQuality>,
}

/// The sha256 of the text of each prompt a run measured, from its latest record (warmups left
/// out; records of runners that did not keep it have none).
fn prompt_texts(run: &LoadedRun) -> BTreeMap<u32, &str> {
    run.timings
        .iter()
        .filter(|r| r.role != ProcessRole::Warmup)
        .filter_map(|r| Some((r.prompt, r.prompt_sha256.as_deref()?)))
        .collect()
}

/// `b` measured against `a` over the prompts whose arrays both kept (of the same text), and the
/// reasons a kind of array or a prompt was not compared (for the comparison's warnings). Runs
/// that kept no arrays give neither.
pub fn quality(a: &LoadedRun, b: &LoadedRun) -> (Option<Quality>, Vec<String>) {
    let mut warnings = Vec::new();
    let (texts_a, texts_b) = (prompt_texts(a), prompt_texts(b));
    // The same index with another text (another prompt file) is another prompt.
    let mut other_text = BTreeSet::new();
    let kinds = ArrayKind::ALL.map(|kind| {
        let in_a = kept_files(&a.dir.join(kind.dir()), kind);
        let in_b = kept_files(&b.dir.join(kind.dir()), kind);
        let (common, differ): (Vec<u32>, Vec<u32>) = in_a
            .keys()
            .filter(|i| in_b.contains_key(i))
            .partition(|i| match (texts_a.get(i), texts_b.get(i)) {
                (Some(x), Some(y)) => x == y,
                _ => true,
            });
        other_text.extend(differ.iter().copied());
        let none_in_both = common.is_empty() && differ.is_empty();
        if none_in_both && !(in_a.is_empty() && in_b.is_empty()) {
            warnings.push(format!(
                "no {} compared: `{}` kept them for {}, `{}` for {}; keep them in both runs \
                 (outputs.save_{}) over the same prompts",
                kind.dir(),
                a.name,
                prompt_count(in_a.len()),
                b.name,
                prompt_count(in_b.len()),
                kind.dir()
            ));
        }
        (kind, common)
    });
    if !other_text.is_empty() {
        let list: Vec<String> = other_text.iter().map(u32::to_string).collect();
        warnings.push(format!(
            "{} left out of the quality: `{}` and `{}` made them from other texts (prompt {})",
            prompt_count(other_text.len()),
            a.name,
            b.name,
            list.join(", ")
        ));
    }
    if kinds.iter().all(|(_, common)| common.is_empty()) {
        return (None, warnings);
    }
    if let Some(differs) = noise_differs(a, b) {
        warnings.push(format!(
            "no quality compared: `{}` and `{}` drew different noise ({differs}); their arrays \
             differ by the noise, not only by what the runs changed",
            a.name, b.name
        ));
        return (None, warnings);
    }
    let mut result = Quality {
        run: b.name.clone(),
        against: a.name.clone(),
        latents: None,
        frames: None,
    };
    for (kind, common) in kinds {
        if common.is_empty() {
            continue;
        }
        let compared = match kind {
            ArrayKind::Latents => per_prompt(a, b, kind, &common, latent_sums)
                .map(|v| result.latents = Some(latent_quality(&v))),
            ArrayKind::Frames => per_prompt(a, b, kind, &common, frame_sums)
                .map(|v| result.frames = Some(frame_quality(&v))),
        };
        if let Err(why) = compared {
            warnings.push(format!("no {} compared: {why}", kind.dir()));
        }
    }
    let any = result.latents.is_some() || result.frames.is_some();
    (any.then_some(result), warnings)
}

/// `sums` of each prompt's pair of files of `kind`, the prompts side by side, in their order.
fn per_prompt<S: Send>(
    a: &LoadedRun,
    b: &LoadedRun,
    kind: ArrayKind,
    prompts: &[u32],
    sums: impl Fn(&Path, &Path) -> Result<S, QualityError> + Sync,
) -> Result<Vec<(u32, S)>, QualityError> {
    prompts
        .par_iter()
        .map(|&i| {
            let name = kind.file_name(i);
            sums(
                &a.dir.join(kind.dir()).join(&name),
                &b.dir.join(kind.dir()).join(name),
            )
            .map(|s| (i, s))
        })
        .collect()
}

/// "no prompt", "1 prompt", "3 prompts".
pub(super) fn prompt_count(n: usize) -> String {
    match n {
        0 => "no prompt".into(),
        1 => "1 prompt".into(),
        n => format!("{n} prompts"),
    }
}

/// The first `noise.*` setting whose recorded value differs between the runs, as a message.
fn noise_differs(a: &LoadedRun, b: &LoadedRun) -> Option<String> {
    let (sa, sb) = (&a.record.settings, &b.record.settings);
    let keys = sa
        .keys()
        .chain(sb.keys())
        .filter(|k| k.starts_with("noise."));
    for key in keys {
        let (va, vb) = (sa.get(key).map(|s| &s.value), sb.get(key).map(|s| &s.value));
        if va != vb {
            let show = |v: Option<&serde_json::Value>| v.map_or("unset".into(), |v| v.to_string());
            return Some(format!("{key}: {} against {}", show(va), show(vb)));
        }
    }
    None
}

/// Reads two files of the same length side by side, a chunk of each at a time, handing the
/// pairs to `each`; an error names the file and says why.
fn read_pairs(a: &Path, b: &Path, mut each: impl FnMut(&[u8], &[u8])) -> Result<(), QualityError> {
    let open = |p: &Path| crate::results::files::open_regular(p, u64::MAX);
    let ((mut fa, la), (mut fb, lb)) = (open(a)?, open(b)?);
    if la != lb {
        return Err(QualityError::Lengths {
            a: a.to_path_buf(),
            a_len: la,
            b: b.to_path_buf(),
            b_len: lb,
        });
    }
    // A multiple of 4 bytes, so that float32 values never straddle two chunks.
    const CHUNK: usize = 1 << 20;
    let (mut xa, mut xb) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let mut left = la;
    while left > 0 {
        let n = CHUNK.min(left as usize);
        let read = |f: &mut File, buf: &mut [u8], p: &Path| -> Result<(), QualityError> {
            f.read_exact(buf).map_err(|source| QualityError::Read {
                path: p.to_path_buf(),
                source,
            })
        };
        read(&mut fa, &mut xa[..n], a)?;
        read(&mut fb, &mut xb[..n], b)?;
        each(&xa[..n], &xb[..n]);
        left -= n as u64;
    }
    Ok(())
}

/// Sums over one prompt's latents: Σ(b − a)², Σa².
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct LatentSums {
    diff2: f64,
    ref2: f64,
}

fn latent_sums(a: &Path, b: &Path) -> Result<LatentSums, QualityError> {
    let mut s = LatentSums::default();
    let mut len = 0u64;
    read_pairs(a, b, |xa, xb| {
        len += xa.len() as u64;
        for (ca, cb) in xa.chunks_exact(4).zip(xb.chunks_exact(4)) {
            let va = f64::from(f32::from_le_bytes(ca.try_into().expect("4 bytes")));
            let vb = f64::from(f32::from_le_bytes(cb.try_into().expect("4 bytes")));
            s.diff2 += (vb - va) * (vb - va);
            s.ref2 += va * va;
        }
    })?;
    if !len.is_multiple_of(4) {
        return Err(QualityError::NotFloat32 {
            path: a.to_path_buf(),
            len,
        });
    }
    Ok(s)
}

/// ‖b − a‖ / ‖a‖ from the sums: 0 for equal arrays, infinite for a zero reference with a
/// difference.
fn relative_l2(s: LatentSums) -> f64 {
    if s.diff2 == 0.0 {
        0.0
    } else if s.ref2 == 0.0 {
        f64::INFINITY
    } else {
        (s.diff2 / s.ref2).sqrt()
    }
}

fn latent_quality(per_prompt: &[(u32, LatentSums)]) -> LatentQuality {
    let errors: Vec<(u32, f64)> = per_prompt
        .iter()
        .map(|&(i, s)| (i, relative_l2(s)))
        .collect();
    // The worst is the largest error, a NaN (non-finite latents) above all; the first of equals.
    let worst = errors
        .iter()
        .copied()
        .filter(|e| e.1 != 0.0)
        .reduce(|x, y| if y.1.total_cmp(&x.1).is_gt() { y } else { x });
    LatentQuality {
        prompts: errors.len(),
        identical: errors.iter().filter(|e| e.1 == 0.0).count(),
        mean_relative_l2: errors.iter().map(|e| e.1).sum::<f64>() / errors.len().max(1) as f64,
        max_relative_l2: worst.map_or(0.0, |w| w.1),
        worst_prompt: worst.map(|w| w.0),
        per_prompt: errors
            .iter()
            .map(|&(prompt, relative_l2)| PromptLatents {
                prompt,
                relative_l2,
            })
            .collect(),
    }
}

/// Sums over one prompt's frames: values, Σ|b − a|, Σ(b − a)², max |b − a|.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct FrameSums {
    values: u64,
    abs: u64,
    squares: u64,
    max: u8,
}

fn frame_sums(a: &Path, b: &Path) -> Result<FrameSums, QualityError> {
    let mut s = FrameSums::default();
    read_pairs(a, b, |xa, xb| {
        s.values += xa.len() as u64;
        for (&va, &vb) in xa.iter().zip(xb) {
            let d = va.abs_diff(vb);
            s.abs += u64::from(d);
            s.squares += u64::from(d) * u64::from(d);
            s.max = s.max.max(d);
        }
    })?;
    Ok(s)
}

/// PSNR in dB of 8-bit values from their mean squared difference; none for equal frames.
fn psnr_db(s: FrameSums) -> Option<f64> {
    (s.squares > 0).then(|| {
        let mse = s.squares as f64 / s.values as f64;
        10.0 * (255.0f64 * 255.0 / mse).log10()
    })
}

fn frame_quality(per_prompt: &[(u32, FrameSums)]) -> FrameQuality {
    let psnrs: Vec<(u32, f64)> = per_prompt
        .iter()
        .filter_map(|&(i, s)| psnr_db(s).map(|p| (i, p)))
        .collect();
    let lowest = psnrs.iter().copied().min_by(|x, y| x.1.total_cmp(&y.1));
    let values: u64 = per_prompt.iter().map(|(_, s)| s.values).sum();
    let abs: u64 = per_prompt.iter().map(|(_, s)| s.abs).sum();
    FrameQuality {
        prompts: per_prompt.len(),
        identical: per_prompt.len() - psnrs.len(),
        mean_psnr_db: (!psnrs.is_empty())
            .then(|| psnrs.iter().map(|p| p.1).sum::<f64>() / psnrs.len() as f64),
        min_psnr_db: lowest.map(|p| p.1),
        worst_prompt: lowest.map(|p| p.0),
        mean_abs_diff: if values == 0 {
            0.0
        } else {
            abs as f64 / values as f64
        },
        max_abs_diff: per_prompt.iter().map(|(_, s)| s.max).max().unwrap_or(0),
        per_prompt: per_prompt
            .iter()
            .map(|&(prompt, s)| PromptFrames {
                prompt,
                psnr_db: psnr_db(s),
                max_abs_diff: s.max,
            })
            .collect(),
    }
}

/// ", 2 prompts identical" where some prompts are, for a line that names the worst.
fn identical_note(identical: usize) -> String {
    match identical {
        0 => String::new(),
        n => format!(", {} identical", prompt_count(n)),
    }
}

/// Writes the quality section of a comparison: one block per run measured.
pub fn quality_text(t: &mut String, quality: &[Quality]) {
    for q in quality {
        let _ = writeln!(
            t,
            "\nquality of `{}` against `{}` on the same noise (their kept arrays)",
            q.run, q.against
        );
        if let Some(l) = &q.latents {
            let error = match l.worst_prompt {
                Some(worst) => format!(
                    "relative L2 error  mean {:.3e}  max {:.3e} (prompt {worst}{})",
                    l.mean_relative_l2,
                    l.max_relative_l2,
                    identical_note(l.identical)
                ),
                None => "identical".into(),
            };
            let _ = writeln!(t, "  latents  {:<11}  {error}", prompt_count(l.prompts));
        }
        if let Some(f) = &q.frames {
            let psnr = match (f.mean_psnr_db, f.min_psnr_db, f.worst_prompt) {
                (Some(mean), Some(min), Some(worst)) => format!(
                    "PSNR mean {mean:.1} dB  min {min:.1} dB (prompt {worst}{})",
                    identical_note(f.identical)
                ),
                _ => "identical".into(),
            };
            let _ = writeln!(
                t,
                "  frames   {:<11}  {psnr}  abs diff mean {:.2}  max {} levels",
                prompt_count(f.prompts),
                f.mean_abs_diff,
                f.max_abs_diff
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn f32s(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Non-finite errors are words in JSON, never the `null` of "no inputs".
    #[test]
    fn non_finite_errors_are_words_in_json() {
        let q = latent_quality(&[
            (
                0,
                LatentSums {
                    diff2: f64::NAN,
                    ref2: 1.0,
                },
            ),
            (
                1,
                LatentSums {
                    diff2: 1.0,
                    ref2: 0.0,
                },
            ),
            (
                2,
                LatentSums {
                    diff2: 1.0,
                    ref2: 4.0,
                },
            ),
        ]);
        let v = serde_json::to_value(&q).unwrap();
        assert_eq!(v["per_prompt"][0]["relative_l2"], "NaN");
        assert_eq!(v["per_prompt"][1]["relative_l2"], "inf");
        assert_eq!(v["per_prompt"][2]["relative_l2"], 0.5);
        assert_eq!(v["mean_relative_l2"], "NaN");
        assert_eq!(v["max_relative_l2"], "NaN");
    }

    /// The latents' relative L2 error of worked examples, from the files.
    #[test]
    fn relative_l2_error_of_latents() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for (a, b, expected) in [
            (vec![3.0, 4.0], vec![3.0, 4.0], 0.0),
            // ‖(0.3, 0.4)‖ / ‖(3, 4)‖ = 0.5 / 5.
            (vec![3.0, 4.0], vec![3.3, 4.4], 0.1),
            (vec![1.0, 0.0, 0.0, 0.0], vec![0.0, 0.0, 0.0, 0.0], 1.0),
            (vec![0.0, 0.0], vec![0.0, 1.0], f64::INFINITY),
        ] {
            let (pa, pb) = (write(d, "a", &f32s(&a)), write(d, "b", &f32s(&b)));
            let error = relative_l2(latent_sums(&pa, &pb).unwrap());
            assert!(
                (error - expected).abs() < 1e-6 || error == expected,
                "{a:?} {b:?}: {error}"
            );
        }
    }

    /// Files of other lengths are not compared, and the message says why; so is a length that
    /// is not whole float32 values.
    #[test]
    fn arrays_of_other_shapes_are_not_compared() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (pa, pb) = (
            write(d, "a", &f32s(&[1.0, 2.0])),
            write(d, "b", &f32s(&[1.0])),
        );
        let e = latent_sums(&pa, &pb).unwrap_err().to_string();
        assert!(
            e.contains("holds 8 bytes and") && e.contains("other shapes"),
            "{e}"
        );
        let (pa, pb) = (write(d, "a", &[0; 6]), write(d, "b", &[0; 6]));
        let e = latent_sums(&pa, &pb).unwrap_err().to_string();
        assert!(e.contains("not whole float32 values"), "{e}");
        let e = frame_sums(&pa, &d.join("missing")).unwrap_err().to_string();
        assert!(e.starts_with("cannot read"), "{e}");
    }

    /// PSNR and the pixel differences of worked examples; identical frames have no PSNR.
    #[test]
    fn psnr_and_differences_of_frames() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // One value in four off by 2: MSE 1, PSNR 20·log10(255) = 48.13 dB.
        let (pa, pb) = (
            write(d, "a", &[10, 20, 30, 40]),
            write(d, "b", &[10, 22, 30, 40]),
        );
        let off = frame_sums(&pa, &pb).unwrap();
        assert_eq!(
            off,
            FrameSums {
                values: 4,
                abs: 2,
                squares: 4,
                max: 2
            }
        );
        assert!((psnr_db(off).unwrap() - 48.1308).abs() < 1e-3);
        let same = frame_sums(&pa, &pa).unwrap();
        assert_eq!(psnr_db(same), None);
        let q = frame_quality(&[(3, off), (5, same)]);
        assert_eq!((q.prompts, q.identical, q.worst_prompt), (2, 1, Some(3)));
        assert_eq!(
            q.per_prompt
                .iter()
                .map(|p| (p.prompt, p.psnr_db.is_some(), p.max_abs_diff))
                .collect::<Vec<_>>(),
            [(3, true, 2), (5, false, 0)]
        );
        assert_eq!(q.max_abs_diff, 2);
        assert!((q.mean_abs_diff - 0.25).abs() < 1e-12);
        let q = frame_quality(&[(5, same)]);
        assert_eq!(
            (q.mean_psnr_db, q.min_psnr_db, q.identical),
            (None, None, 1)
        );
    }

    /// Over several prompts: the mean, and the worst prompt named.
    #[test]
    fn the_worst_prompt_is_named() {
        let sums = |diff2: f64| LatentSums { diff2, ref2: 1.0 };
        let q = latent_quality(&[(0, sums(0.01)), (7, sums(0.04)), (9, sums(0.0))]);
        assert_eq!((q.prompts, q.identical, q.worst_prompt), (3, 1, Some(7)));
        assert_eq!(
            q.per_prompt.iter().map(|p| p.prompt).collect::<Vec<_>>(),
            [0, 7, 9]
        );
        assert!((q.per_prompt[1].relative_l2 - 0.2).abs() < 1e-12);
        assert!((q.max_relative_l2 - 0.2).abs() < 1e-12);
        assert!((q.mean_relative_l2 - 0.1).abs() < 1e-12);
        let q = latent_quality(&[(2, sums(0.0)), (4, sums(0.0))]);
        assert_eq!(
            (q.identical, q.worst_prompt, q.max_relative_l2),
            (2, None, 0.0)
        );
        // Non-finite latents are the worst of all.
        let q = latent_quality(&[(1, sums(0.04)), (5, sums(f64::NAN))]);
        assert_eq!(q.worst_prompt, Some(5));
    }
}
