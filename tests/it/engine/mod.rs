//! The generation engine on real ONNX Runtime (CPU) and the embedded tiny bundle: parity with the
//! exporter's PyTorch golden outputs, noise invariance, method settings, and generations through
//! the hidden `runner worker` subcommand as a real process; the bundle checks are in `bundle`,
//! the worker's command line in `worker`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use unstep::engine::{
    Bundle, Emit, GenerateOptions, Generated, Generator, MethodSettings, RuntimeOptions,
    TimedRegionEnd, fill_normal,
};

mod bundle;
mod worker;

use bundle::bundle_copy;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tiny_bundle() -> PathBuf {
    repo().join("assets/tiny")
}

fn prompt_file() -> PathBuf {
    repo().join("assets/prompts/tiny.txt")
}

fn prompts() -> Vec<String> {
    std::fs::read_to_string(prompt_file())
        .expect("read assets/prompts/tiny.txt")
        .lines()
        .map(str::to_string)
        .collect()
}

/// One intra-op thread: tests run in parallel on few cores, and a fixed thread count keeps ONNX
/// Runtime's reductions identical between the runs a test compares.
fn runtime() -> RuntimeOptions {
    RuntimeOptions {
        intra_op_threads: Some(1),
        ..RuntimeOptions::default()
    }
}

fn generator() -> Generator {
    let unpack = tempfile::tempdir().unwrap();
    Generator::open(
        &tiny_bundle(),
        unpack.path(),
        &Default::default(),
        &runtime(),
    )
    .expect("open the tiny bundle")
}

fn latents_only(method: MethodSettings) -> GenerateOptions {
    GenerateOptions {
        method,
        latents_only: true,
        ..GenerateOptions::default()
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The tensors of a safetensors file (only the dtypes the golden file uses).
struct Golden {
    tensors: BTreeMap<String, (String, Vec<usize>, Vec<u8>)>,
}

impl Golden {
    fn load() -> Self {
        let bytes = std::fs::read(tiny_bundle().join("golden/golden.safetensors"))
            .expect("read golden.safetensors");
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&bytes[8..8 + header_len]).expect("safetensors header");
        let data = &bytes[8 + header_len..];
        let mut tensors = BTreeMap::new();
        for (name, info) in header {
            if name == "__metadata__" {
                continue;
            }
            let dtype = info["dtype"].as_str().unwrap().to_string();
            let shape = info["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            let offsets = info["data_offsets"].as_array().unwrap();
            let (start, end) = (
                offsets[0].as_u64().unwrap() as usize,
                offsets[1].as_u64().unwrap() as usize,
            );
            tensors.insert(name, (dtype, shape, data[start..end].to_vec()));
        }
        Self { tensors }
    }

    fn get(&self, name: &str, dtype: &str) -> (&[usize], &[u8]) {
        let (actual, shape, bytes) = self
            .tensors
            .get(name)
            .unwrap_or_else(|| panic!("golden has no {name}"));
        assert_eq!(actual, dtype, "dtype of {name}");
        (shape, bytes)
    }

    fn f32(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let (shape, bytes) = self.get(name, "F32");
        (
            shape.to_vec(),
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        )
    }

    fn i64(&self, name: &str) -> Vec<i64> {
        let (_, bytes) = self.get(name, "I64");
        bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn u8(&self, name: &str) -> (Vec<usize>, Vec<u8>) {
        let (shape, bytes) = self.get(name, "U8");
        (shape.to_vec(), bytes.to_vec())
    }
}

/// Golden prompts are 0 and 7 (`assets/prompts/README.md`).
const GOLDEN_PROMPTS: [u32; 2] = [0, 7];

#[test]
fn tokens_and_first_noise_draw_match_golden_bit_for_bit() {
    let golden = Golden::load();
    let prompts = prompts();
    let tokenizer = Bundle::peek(&tiny_bundle()).unwrap().tokenizer().unwrap();
    for p in GOLDEN_PROMPTS {
        let tokens = tokenizer.encode(&prompts[p as usize]).unwrap();
        let (ids, mask) = (tokens.ids, tokens.mask);
        assert_eq!(
            ids,
            golden.i64(&format!("p{p}.input_ids")),
            "input ids of prompt {p}"
        );
        assert_eq!(
            mask,
            golden.i64(&format!("p{p}.attention_mask")),
            "attention mask of prompt {p}"
        );

        let (shape, expected) = golden.f32(&format!("p{p}.noise_d0"));
        assert_eq!(shape, [1, 16, 3, 8, 14]);
        let mut noise = vec![0.0f32; expected.len()];
        fill_normal(0, p, 0, &mut noise);
        let mismatches = noise
            .iter()
            .zip(&expected)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            mismatches, 0,
            "prompt {p}: {mismatches} noise elements differ from the golden draw"
        );
    }
}

fn assert_frames_close(
    generated: &Generated,
    expected_shape: &[usize],
    expected: &[u8],
    what: &str,
) {
    let [frames, height, width, channels] = generated.frame_shape;
    assert_eq!(
        &expected_shape[1..],
        [height, width, channels],
        "{what}: frame size"
    );
    assert!(
        expected_shape[0] <= frames,
        "{what}: golden has more frames than generated"
    );
    let compared = &generated.frames[..expected.len()];
    let worst = compared
        .iter()
        .zip(expected)
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap_or(0);
    let off = compared
        .iter()
        .zip(expected)
        .filter(|(a, b)| a != b)
        .count();
    eprintln!(
        "{what}: frames max abs error {worst}, {off} of {} values differ",
        expected.len()
    );
    assert!(
        worst <= 1,
        "{what}: frames differ by up to {worst} (tolerance 1)"
    );
}

#[test]
fn generation_matches_the_pytorch_golden_outputs() {
    let golden = Golden::load();
    let prompts = prompts();
    let mut generator = generator();

    for p in GOLDEN_PROMPTS {
        let generated = generator
            .generate(p, &prompts[p as usize], &GenerateOptions::default())
            .expect("generate");
        let (shape, latents) = golden.f32(&format!("p{p}.latents"));
        assert_eq!(
            generated.latent_shape.to_vec(),
            shape,
            "latent shape of prompt {p}"
        );
        let error = max_abs_diff(&generated.latents, &latents);
        eprintln!("prompt {p}: latents max abs error {error:e}");
        assert!(
            error <= 1e-3,
            "prompt {p}: latents differ by {error} (tolerance 1e-3)"
        );
        let (frame_shape, frames) = golden.u8(&format!("p{p}.frames"));
        assert_eq!(
            generated.frame_shape[0], 81,
            "81 frames from 21 latent frames"
        );
        assert_frames_close(&generated, &frame_shape, &frames, &format!("prompt {p}"));
        assert_eq!(generated.timed_region_end, TimedRegionEnd::Uint8Frames);
    }

    // The golden file's clean_sigma ablation: same prompt, clean_sigma 0.01.
    let method = MethodSettings {
        clean_sigma: 0.01,
        ..MethodSettings::default()
    };
    let generated = generator
        .generate(0, &prompts[0], &latents_only(method))
        .unwrap();
    let (_, latents) = golden.f32("p0.clean_sigma_0p01.latents");
    let error = max_abs_diff(&generated.latents, &latents);
    assert!(error <= 1e-3, "clean_sigma 0.01: latents differ by {error}");
    assert!(generated.frames.is_empty());
    assert_eq!(generated.timed_region_end, TimedRegionEnd::Latents);
}

#[test]
fn excluding_the_final_layout_changes_the_timed_region_not_the_frames() {
    let prompts = prompts();
    let mut generator = generator();
    let excluded = GenerateOptions {
        exclude_final_output_layout: true,
        ..GenerateOptions::default()
    };
    let a = generator.generate(3, &prompts[3], &excluded).unwrap();
    let b = generator
        .generate(3, &prompts[3], &GenerateOptions::default())
        .unwrap();
    assert_eq!(a.timed_region_end, TimedRegionEnd::VaeOutput);
    assert_eq!(b.timed_region_end, TimedRegionEnd::Uint8Frames);
    assert_eq!(a.frames, b.frames);
    // The layout ran after the region's end, so none of the timed total is the layout's; with
    // the layout inside, it is part of the total.
    let t = a.times;
    assert_eq!(t.layout, std::time::Duration::ZERO);
    assert!(t.timed_total >= t.dit + t.vae);
    assert!(b.times.layout > std::time::Duration::ZERO);
    assert!(b.times.timed_total >= b.times.dit + b.times.vae + b.times.layout);
}

#[test]
fn method_settings_change_the_latents_and_seeds_repeat() {
    let prompts = prompts();
    let mut generator = generator();
    let mut run = |method: MethodSettings| {
        generator
            .generate(2, &prompts[2], &latents_only(method))
            .unwrap()
            .latents
    };
    let base = run(MethodSettings::default());
    assert_eq!(
        base,
        run(MethodSettings::default()),
        "same settings and seed twice"
    );
    let variants = [
        (
            "clean_sigma 0.01",
            MethodSettings {
                clean_sigma: 0.01,
                ..MethodSettings::default()
            },
        ),
        (
            "emit denoised",
            MethodSettings {
                emit: Emit::Denoised,
                ..MethodSettings::default()
            },
        ),
        (
            "seed 1",
            MethodSettings {
                seed: 1,
                ..MethodSettings::default()
            },
        ),
        (
            "attention window 3",
            MethodSettings {
                attention_window: 3,
                ..MethodSettings::default()
            },
        ),
        (
            "unwarped steps",
            MethodSettings {
                warp_denoising_steps: false,
                ..MethodSettings::default()
            },
        ),
    ];
    for (what, method) in variants {
        let latents = run(method);
        assert!(
            max_abs_diff(&base, &latents) > 1e-4,
            "{what} should change the latents"
        );
    }
}

fn runner(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .output()
        .expect("start runner")
}

fn worker(dir: &Path, extra: &[&str]) -> Output {
    worker_on(&tiny_bundle(), dir, extra)
}

/// `runner worker` on `bundle` with the tiny prompt file, one thread, unpacking into `dir`.
fn worker_on(bundle: &Path, dir: &Path, extra: &[&str]) -> Output {
    let prompts = prompt_file();
    let unpack = dir.join("unpack");
    let mut args = vec![
        "worker",
        "--bundle",
        bundle.to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
        "--threads",
        "1",
        "--unpack-dir",
        unpack.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    runner(&args)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Regression guard: a prompt's noise is keyed on its global index, so prompt 7
/// alone and prompt 7 after 0..=6 in one process give bit-identical latents.
#[test]
fn prompt_latents_do_not_depend_on_the_other_prompts_of_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("alone");
    let listed = dir.path().join("listed");
    let timings = dir.path().join("timings.jsonl");
    let a = worker(
        dir.path(),
        &[
            "--indices",
            "7",
            "--latents-only",
            "--save-latents",
            alone.to_str().unwrap(),
        ],
    );
    assert!(a.status.success(), "{}", stderr(&a));
    let b = worker(
        dir.path(),
        &[
            "--indices",
            "0-7",
            "--latents-only",
            "--save-latents",
            listed.to_str().unwrap(),
            "--timings",
            timings.to_str().unwrap(),
        ],
    );
    assert!(b.status.success(), "{}", stderr(&b));
    let seven_alone = std::fs::read(alone.join("latents_7.f32")).unwrap();
    let seven_listed = std::fs::read(listed.join("latents_7.f32")).unwrap();
    assert_eq!(seven_alone.len(), 16 * 21 * 8 * 14 * 4);
    assert!(
        seven_alone == seven_listed,
        "prompt 7's latents differ between the two prompt lists"
    );
    assert_ne!(
        std::fs::read(listed.join("latents_6.f32")).unwrap(),
        seven_listed
    );

    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&timings)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 8);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["prompt"], i);
        for key in [
            "text_encoding_s",
            "dit_s",
            "vae_s",
            "layout_s",
            "timed_total_s",
        ] {
            assert!(
                line[key].as_f64().is_some_and(|v| v >= 0.0),
                "{key} in {line}"
            );
        }
        assert_eq!(line["timed_region_ends"], "latents");
    }
}

#[test]
fn worker_saves_frames_and_latents_of_a_full_generation() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = worker(
        dir.path(),
        &[
            "--indices",
            "1",
            "--save-latents",
            out.to_str().unwrap(),
            "--save-frames",
            out.to_str().unwrap(),
            "--clean-sigma-override",
            "0.01",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(out.join("frames_1.u8")).unwrap().len(),
        81 * 64 * 112 * 3
    );
    assert_eq!(
        std::fs::read(out.join("latents_1.f32")).unwrap().len(),
        16 * 21 * 8 * 14 * 4
    );
}

/// Each graph's optimised model is written once per folder: a second process with the same folder
/// leaves the files as they are (writing a large graph's weights at every start is time the
/// process's start does not need), and still generates.
#[test]
fn optimised_models_are_written_once_per_folder() {
    let dir = tempfile::tempdir().unwrap();
    let optimized = dir.path().join("ort_optimized");
    let args = [
        "--indices",
        "0",
        "--latents-only",
        "--optimized-model-dir",
        optimized.to_str().unwrap(),
    ];
    let o = worker(dir.path(), &args);
    assert!(o.status.success(), "{}", stderr(&o));
    let written = |name: &str| {
        std::fs::metadata(optimized.join(name))
            .unwrap()
            .modified()
            .unwrap()
    };
    let names = ["dit.optimized.onnx", "vae_step.optimized.onnx"];
    let first: Vec<_> = names.iter().map(|n| written(n)).collect();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let o = worker(dir.path(), &args);
    assert!(o.status.success(), "{}", stderr(&o));
    let second: Vec<_> = names.iter().map(|n| written(n)).collect();
    assert_eq!(first, second, "the second process wrote them again");
}

/// Kept text contexts: a generator whose prompts an earlier one encoded with the same context
/// folder reads them and never loads the text encoder (here a garbage file the bundle check is
/// told is fine, which fails to load the moment a prompt needs it), and generates the same
/// latents bit for bit.
#[test]
fn kept_text_contexts_spare_the_text_encoder_and_give_the_same_latents() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_copy(dir.path());
    let unpack = dir.path().join("unpack");
    let runtime = RuntimeOptions {
        context_cache_dir: Some(dir.path().join("text_contexts")),
        ..runtime()
    };
    let texts = prompts();
    let generate = |generator: &mut Generator| {
        generator
            .generate(1, &texts[1], &latents_only(MethodSettings::default()))
            .unwrap()
            .latents
    };
    let opened = unstep::engine::Bundle::open(&bundle, &unpack).unwrap();
    let known = opened.manifest.files.clone();
    let mut first =
        Generator::with_prompts(opened, &runtime, [texts[0].as_str(), texts[1].as_str()])
            .expect("encode and keep");
    let expected = generate(&mut first);
    drop(first);
    let kept = std::fs::read_dir(dir.path().join("text_contexts"))
        .unwrap()
        .count();
    assert_eq!(kept, 2, "one file per prompt");

    std::fs::write(bundle.join("text_encoder.onnx"), b"not a graph").unwrap();
    let open = || unstep::engine::Bundle::open_with_known_hashes(&bundle, &unpack, &known).unwrap();
    let mut second = Generator::with_prompts(open(), &runtime, [texts[1].as_str()])
        .expect("every context kept: the text encoder is not loaded");
    assert_eq!(generate(&mut second), expected);
    drop(second);
    let err = Generator::with_prompts(open(), &runtime, [texts[2].as_str()])
        .expect_err("a prompt not kept needs the (broken) text encoder")
        .to_string();
    assert!(err.contains("text_encoder"), "{err}");

    // A damaged kept file is encoded again, not read.
    let file = std::fs::read_dir(dir.path().join("text_contexts"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(&file, b"\x01short").unwrap();
    assert!(
        Generator::with_prompts(open(), &runtime, [texts[0].as_str(), texts[1].as_str()]).is_err(),
        "the damaged context is not taken: the text encoder is needed"
    );
}

/// Contexts kept for later: a generator asked to keep the contexts of prompts it does not
/// generate encodes each once into the context folder, and a later generator of those prompts
/// reads them all without loading the (here broken) text encoder, says so, and generates the
/// latents of one that encodes its prompt itself; without a context folder nothing is encoded
/// for later.
#[test]
fn contexts_kept_for_later_processes_are_read_without_the_text_encoder() {
    use unstep::engine::{ContextSource, TextContexts};
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle_copy(dir.path());
    let unpack = dir.path().join("unpack");
    let folder = dir.path().join("text_contexts");
    let kept = RuntimeOptions {
        context_cache_dir: Some(folder.clone()),
        ..runtime()
    };
    let texts = prompts();
    let (t0, t1, t2) = (texts[0].as_str(), texts[1].as_str(), texts[2].as_str());
    let counts = |encoded, read, for_later| {
        Some(TextContexts {
            encoded,
            read,
            for_later,
        })
    };
    let opened = unstep::engine::Bundle::open(&bundle, &unpack).unwrap();
    let known = opened.manifest.files.clone();
    let open = || unstep::engine::Bundle::open_with_known_hashes(&bundle, &unpack, &known).unwrap();

    // The reference: prompt 1 encoded by the generator that generates it, nothing kept.
    let mut itself = Generator::with_prompts(open(), &runtime(), [t1]).unwrap();
    let expected = itself
        .generate(1, t1, &latents_only(MethodSettings::default()))
        .unwrap();
    assert_eq!(expected.text_context, ContextSource::Encoded);
    drop(itself);
    // No context folder: the later prompts are left alone.
    let alone = Generator::with_prompts_and_later(open(), &runtime(), [t0], [t1, t2]).unwrap();
    assert_eq!(alone.text_contexts(), counts(1, 0, 0));
    drop(alone);

    // Prompt 0 its own, 1 and 2 for later (0 again among them, and 2 twice: each once).
    let first = Generator::with_prompts_and_later(opened, &kept, [t0], [t1, t0, t2, t2]).unwrap();
    assert_eq!(first.text_contexts(), counts(3, 0, 2));
    drop(first);
    assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 3);

    std::fs::write(bundle.join("text_encoder.onnx"), b"not a graph").unwrap();
    let mut later = Generator::with_prompts(open(), &kept, [t1, t2])
        .expect("every context kept: the text encoder is not loaded");
    assert_eq!(later.text_contexts(), counts(0, 2, 0));
    let got = later
        .generate(1, t1, &latents_only(MethodSettings::default()))
        .unwrap();
    assert_eq!(got.text_context, ContextSource::Read);
    assert_eq!(
        got.latents, expected.latents,
        "read and encoded give the same latents"
    );
    drop(later);
    // A later prompt kept already is not encoded again (the broken encoder is not loaded).
    let again = Generator::with_prompts_and_later(open(), &kept, [t1], [t2]).unwrap();
    assert_eq!(again.text_contexts(), counts(0, 1, 0));
}

/// The VAE decoded beside the DiT (a second thread) or after it gives the same outputs bit for
/// bit, for both emit modes and a windowed attention; the first is also the golden video.
#[test]
fn the_vae_beside_the_dit_or_after_it_gives_the_same_video() {
    let prompts = prompts();
    let unpack = tempfile::tempdir().unwrap();
    let open = |overlap_vae: bool| {
        Generator::open(
            &tiny_bundle(),
            unpack.path(),
            &Default::default(),
            &RuntimeOptions {
                overlap_vae,
                ..runtime()
            },
        )
        .expect("open the tiny bundle")
    };
    let mut overlapped = open(true);
    let mut sequential = open(false);

    let full = GenerateOptions::default();
    let expected = sequential.generate(7, &prompts[7], &full).unwrap();
    {
        let name = "overlapped";
        let generator = &mut overlapped;
        let got = generator.generate(7, &prompts[7], &full).unwrap();
        assert_eq!(got.latents, expected.latents, "{name}: latents");
        assert_eq!(got.frames, expected.frames, "{name}: frames");
        assert_eq!(got.frame_shape, expected.frame_shape);
        assert_eq!(got.timed_region_end, TimedRegionEnd::Uint8Frames);
    }

    let method = MethodSettings {
        emit: Emit::Denoised,
        attention_window: 3,
        clean_sigma: 0.05,
        ..MethodSettings::default()
    };
    let expected = sequential
        .generate(0, &prompts[0], &latents_only(method.clone()))
        .unwrap();
    let got = overlapped
        .generate(0, &prompts[0], &latents_only(method))
        .unwrap();
    assert_eq!(got.latents, expected.latents, "denoised emit, window 3");
    assert!(got.frames.is_empty());
    assert_eq!(got.timed_region_end, TimedRegionEnd::Latents);
}

#[test]
fn an_attention_backend_the_provider_cannot_run_is_refused_before_any_work() {
    use unstep::engine::{AttentionBackend, CudaOptions, Precision, Provider};
    let cuda = |attention| {
        Provider::Cuda(CudaOptions {
            attention,
            ..CudaOptions::default()
        })
    };
    assert!(
        AttentionBackend::Flash
            .check(&cuda(AttentionBackend::Flash), Precision::Fp32)
            .unwrap_err()
            .to_string()
            .contains("fp16, bf16 or fp8")
    );
    assert!(
        AttentionBackend::Flash
            .check(&cuda(AttentionBackend::Flash), Precision::Fp16)
            .is_ok()
    );
    // An fp8 bundle's attention is fp16's.
    assert!(
        AttentionBackend::Flash
            .check(&cuda(AttentionBackend::Flash), Precision::Fp8)
            .is_ok()
    );
    assert!(
        AttentionBackend::CudnnFlash
            .check(&Provider::Cpu, Precision::Fp32)
            .is_err()
    );
    assert!(
        AttentionBackend::Math
            .check(&Provider::Cpu, Precision::Fp32)
            .is_ok()
    );
    assert_eq!(
        AttentionBackend::Auto.resolve(Precision::Fp16),
        AttentionBackend::CudnnFlash
    );
    assert_eq!(
        AttentionBackend::Auto.resolve(Precision::Fp32),
        AttentionBackend::Auto
    );
    for &kernel in <AttentionBackend as strum::VariantArray>::VARIANTS {
        assert_eq!(kernel.name().parse::<AttentionBackend>(), Ok(kernel));
    }
}

/// `UNSTEP_ORT_DISABLE_OPTIMIZERS` reaches ONNX Runtime: the CPU provider keeps every optimizer by
/// default, so the DiT's biased projections become `Gemm` nodes; naming `MatMulAddFusion` leaves
/// them `MatMul` + `Add` (what the runner does on GPUs).
#[test]
fn named_optimizers_are_left_out_of_the_optimized_graph() {
    let dir = tempfile::tempdir().unwrap();
    // NodeProto.op_type is field 4, a string: tag 0x22, length 4, "Gemm".
    let gemm_nodes = |disabled: Option<&str>| {
        let optimized = dir
            .path()
            .join(format!("opt_{}", disabled.unwrap_or("default")));
        let prompts = prompt_file();
        let mut command = Command::new(env!("CARGO_BIN_EXE_runner"));
        command.args([
            "worker",
            "--bundle",
            tiny_bundle().to_str().unwrap(),
            "--prompts",
            prompts.to_str().unwrap(),
            "--threads",
            "1",
            "--indices",
            "0",
            "--latents-only",
            "--optimized-model-dir",
            optimized.to_str().unwrap(),
        ]);
        command.env_remove("UNSTEP_ORT_DISABLE_OPTIMIZERS");
        if let Some(names) = disabled {
            command.env("UNSTEP_ORT_DISABLE_OPTIMIZERS", names);
        }
        let output = command.output().expect("start runner");
        assert!(output.status.success(), "{}", stderr(&output));
        let graph = std::fs::read(optimized.join("dit.optimized.onnx")).unwrap();
        graph.windows(6).filter(|w| w == b"\x22\x04Gemm").count()
    };
    assert!(gemm_nodes(None) > 0, "the CPU provider fuses MatMul + Add");
    assert_eq!(gemm_nodes(Some("MatMulAddFusion")), 0);
}

/// A generator built with its prompts encoded first (text encoder alone, then dropped) gives the
/// same latents as one that encodes each prompt when it is generated; a prompt it was not built
/// for is a clear error.
#[test]
fn prompts_encoded_before_the_dit_is_built_give_the_same_latents() {
    let prompts = prompts();
    let options = latents_only(MethodSettings::default());
    {
        let unpack = tempfile::tempdir().unwrap();
        let runtime = runtime();
        let bundle = || Bundle::open(&tiny_bundle(), unpack.path()).unwrap();
        let mut direct = Generator::new(bundle(), &runtime).unwrap();
        let expected = direct.generate(3, &prompts[3], &options).unwrap();

        let texts = [
            prompts[3].as_str(),
            prompts[5].as_str(),
            prompts[3].as_str(),
        ];
        let mut ahead = Generator::with_prompts(bundle(), &runtime, texts).unwrap();
        // Prompt 5 first: the context buffer then holds prompt 5's context when 3 comes.
        ahead.generate(5, &prompts[5], &options).unwrap();
        let got = ahead.generate(3, &prompts[3], &options).unwrap();
        assert_eq!(got.latents, expected.latents);
        assert!(got.times.text_encoding > std::time::Duration::ZERO);
        let err = ahead
            .generate(4, &prompts[4], &options)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no text encoder") && err.contains("not among them"),
            "{err}"
        );
    }
}

fn generator_with_kernels(
    dit: unstep::engine::FusedKernels,
    vae: unstep::engine::FusedKernels,
) -> Generator {
    let unpack = tempfile::tempdir().unwrap();
    Generator::open(
        &tiny_bundle(),
        unpack.path(),
        &Default::default(),
        &RuntimeOptions {
            dit_kernels: dit,
            vae_kernels: vae,
            ..runtime()
        },
    )
    .expect("open the tiny bundle")
}

/// The runner's fused operators (CPU kernels, real ONNX Runtime) on the bundle's fused graphs give
/// the standard graphs' video: the same arithmetic, reordered only inside each row.
#[test]
fn the_fused_graphs_give_the_video_of_the_standard_graphs() {
    use unstep::engine::FusedKernels::{Onnxruntime, Unstep};
    let prompts = prompts();
    let mut stock = generator_with_kernels(Onnxruntime, Onnxruntime);
    let mut fused = generator_with_kernels(Unstep, Unstep);
    let mut fused_vae = generator_with_kernels(Onnxruntime, Unstep);
    assert_eq!(
        (stock.dit_kernels(), stock.vae_kernels()),
        (Onnxruntime, Onnxruntime)
    );
    assert_eq!((fused.dit_kernels(), fused.vae_kernels()), (Unstep, Unstep));
    assert_eq!(
        (fused_vae.dit_kernels(), fused_vae.vae_kernels()),
        (Onnxruntime, Unstep)
    );
    // The fused DiT writes the block's keys and values into the cache in place; dit.onnx
    // outputs them.
    use unstep::engine::KvInterface::{InPlace, PastAndNew};
    assert_eq!(
        [&stock, &fused, &fused_vae].map(|g| g.kv_interface()),
        [PastAndNew, InPlace, PastAndNew]
    );
    // The fused DiT takes the context's keys and values, from dit_context once per prompt;
    // dit.onnx the context.
    use unstep::engine::ContextInterface::{KeysValues, Text};
    assert_eq!(
        [&stock, &fused, &fused_vae].map(|g| g.context_interface()),
        [Text, KeysValues, Text]
    );
    // `auto` keeps ONNX Runtime's kernels on the CPU provider.
    let auto = generator();
    assert_eq!(
        (auto.dit_kernels(), auto.vae_kernels()),
        (Onnxruntime, Onnxruntime)
    );

    let full = GenerateOptions::default();
    let golden = Golden::load();
    for p in GOLDEN_PROMPTS {
        let expected = stock.generate(p, &prompts[p as usize], &full).unwrap();
        {
            let name = "fused";
            let generator = &mut fused;
            let got = generator.generate(p, &prompts[p as usize], &full).unwrap();
            let error = max_abs_diff(&got.latents, &expected.latents);
            eprintln!("prompt {p}, {name}: fused vs stock latents max abs error {error:e}");
            assert!(
                error <= 1e-4,
                "prompt {p}, {name}: latents differ by {error}"
            );
            assert_ne!(error, 0.0, "prompt {p}, {name}: the fused DiT did not run");
            let (frame_shape, frames) = golden.u8(&format!("p{p}.frames"));
            assert_frames_close(&got, &frame_shape, &frames, &format!("fused, prompt {p}"));
        }
        // The fused decoder alone: the DiT's latents bit for bit, frames within a level.
        let got = fused_vae.generate(p, &prompts[p as usize], &full).unwrap();
        assert_eq!(
            got.latents, expected.latents,
            "prompt {p}: the DiT is the same"
        );
        let (frame_shape, frames) = golden.u8(&format!("p{p}.frames"));
        assert_frames_close(
            &got,
            &frame_shape,
            &frames,
            &format!("fused VAE, prompt {p}"),
        );
    }
}

#[test]
fn fused_kernels_the_bundle_or_provider_cannot_run_are_refused_before_any_work() {
    use unstep::engine::{CudaOptions, FusedKernels, FusedPart, Provider, TensorRtOptions};
    let unpack = tempfile::tempdir().unwrap();
    let mut bundle = Bundle::open(&tiny_bundle(), unpack.path()).unwrap();
    let cuda = Provider::Cuda(CudaOptions::default());
    assert!(
        bundle.manifest.graphs.dit_fused.is_some(),
        "the tiny bundle has dit_fused"
    );
    use FusedKernels::{Auto, Onnxruntime, Unstep};
    use FusedPart::{Dit, Vae};
    let trt = Provider::TensorRt(TensorRtOptions::default());
    let ok = |k: FusedKernels, part, provider: &Provider, bundle: &Bundle| {
        k.resolve(part, provider, bundle).unwrap()
    };
    let error = |part, provider: &Provider, bundle: &Bundle| {
        Unstep
            .resolve(part, provider, bundle)
            .unwrap_err()
            .to_string()
    };
    // `auto` on CUDA: the runner's kernels where NVRTC loads (they are compiled with it),
    // ONNX Runtime's where it does not (this machine may have either).
    let compiles = unstep::engine::probe::fused_kernels_check().ok;
    let auto_on_cuda = if compiles { Unstep } else { Onnxruntime };
    // The tiny bundle is fp32, and its dit_fused (exporter 0.10.0) runs the runner's attention,
    // which cuDNN runs in fp16 only: its DiT keeps the standard graph on CUDA (below).
    let fp16 = {
        let mut b = bundle.clone();
        b.manifest.precision = unstep::engine::Precision::Fp16;
        b
    };
    for (part, bundle) in [(Dit, &fp16), (Vae, &bundle)] {
        assert_eq!(ok(Auto, part, &cuda, bundle), auto_on_cuda);
        // Asked for by name, they are the runner's whatever NVRTC does (a missing NVRTC is an
        // error when the session is built).
        assert_eq!(ok(Unstep, part, &cuda, bundle), Unstep);
        // `auto` keeps ONNX Runtime's on the CPU and on TensorRT; `unstep` on TensorRT is an
        // error naming the way out.
        assert_eq!(ok(Auto, part, &Provider::Cpu, bundle), Onnxruntime);
        assert_eq!(ok(Auto, part, &trt, bundle), Onnxruntime);
    }
    // The fused DiT's self-attention runs on CUDA for fp16 bundles: `auto` keeps the standard
    // graph (every attention ONNX Runtime's) for an fp32 bundle, and `unstep` asked for by name
    // says why not. Exporter 0.9.0's fused DiT had ONNX Runtime's.
    use unstep::engine::AttentionBackend;
    let cuda_with = |attention| {
        Provider::Cuda(CudaOptions {
            attention,
            ..CudaOptions::default()
        })
    };
    assert_eq!(ok(Auto, Dit, &cuda, &bundle), Onnxruntime);
    let e = error(Dit, &cuda, &bundle);
    assert!(
        e.contains("fp16")
            && e.contains("this one is fp32")
            && e.contains("--dit-kernels onnxruntime"),
        "{e}"
    );
    // Another attention backend keeps the fused DiT with an fp16 bundle: its self-attention is
    // then ONNX Runtime's MultiHeadAttention in place of the runner's call.
    for kernel in [
        AttentionBackend::Flash,
        AttentionBackend::Fa2,
        AttentionBackend::Efficient,
        AttentionBackend::Math,
    ] {
        assert_eq!(ok(Auto, Dit, &cuda_with(kernel), &fp16), auto_on_cuda);
        assert_eq!(ok(Unstep, Dit, &cuda_with(kernel), &fp16), Unstep);
        assert_eq!(
            unstep::engine::DitAttention::of(Unstep, &cuda_with(kernel), &fp16.manifest),
            unstep::engine::DitAttention::OnnxRuntimeInFused
        );
    }
    assert_eq!(
        ok(Unstep, Dit, &cuda_with(AttentionBackend::CudnnFlash), &fp16),
        Unstep
    );
    let mut older = fp16.clone();
    older.manifest.exporter_version = "0.9.0".into();
    assert_eq!(
        ok(Unstep, Dit, &cuda_with(AttentionBackend::Flash), &older),
        Unstep
    );
    let e = error(Dit, &trt, &bundle);
    assert!(
        e.contains("tensorrt") && e.contains("--dit-kernels onnxruntime"),
        "{e}"
    );
    let e = error(Vae, &trt, &bundle);
    assert!(e.contains("--vae-kernels onnxruntime"), "{e}");

    // A bundle without the fused graphs: `auto` falls back, `unstep` says what to export.
    bundle.manifest.graphs.dit_fused = None;
    assert_eq!(ok(Auto, Dit, &cuda, &bundle), Onnxruntime);
    let e = error(Dit, &cuda, &bundle);
    assert!(
        e.contains("no `dit_fused` graph") && e.contains("export"),
        "{e}"
    );
    bundle.manifest.graphs.vae_step_fused = None;
    assert_eq!(ok(Auto, Vae, &cuda, &bundle), Onnxruntime);
    let e = error(Vae, &cuda, &bundle);
    assert!(
        e.contains("vae_step_fused") && e.contains("vae_kernels"),
        "{e}"
    );
    for kernels in [Auto, Unstep, Onnxruntime] {
        assert_eq!(kernels.name().parse::<FusedKernels>(), Ok(kernels));
    }
}
