use std::path::{Path, PathBuf};

use ort::session::Session;
use ort::value::{Tensor, TensorElementType};

use super::*;
use crate::engine::kernels::test_support::Rng;
use crate::engine::kernels::{DOMAIN, operator_domain};
use crate::engine::onnx_graph::{self, Attr};
use crate::engine::options::tests::REWRITE_ON_CPU;
use crate::engine::{
    Bundle, DitAttention, FusedKernels, GenerateOptions, Generator, RuntimeOptions, ort_lib,
};

fn tiny(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("assets/tiny")
        .join(name)
}

/// The fields of a message as (number, the field's bytes with its key).
fn spans(msg: &[u8]) -> Vec<(u64, &[u8])> {
    fields(msg)
        .map(|f| {
            let f = f.unwrap();
            (f.number, &msg[f.span])
        })
        .collect()
}

/// The payloads of the fields `number` of a message.
fn payloads(msg: &[u8], number: u64) -> Vec<&[u8]> {
    fields(msg)
        .filter_map(|f| match f.unwrap() {
            Field {
                number: n,
                payload: Payload::Bytes(b),
                ..
            } if n == number => Some(b),
            _ => None,
        })
        .collect()
}

fn string(msg: &[u8], number: u64) -> String {
    payloads(msg, number)
        .first()
        .map(|b| String::from_utf8(b.to_vec()).unwrap())
        .unwrap_or_default()
}

/// A node's (domain, op_type).
fn operator(node: &[u8]) -> (String, String) {
    (
        string(node, field::NODE_DOMAIN),
        string(node, field::NODE_OP_TYPE),
    )
}

fn graph(model: &[u8]) -> &[u8] {
    payloads(model, field::MODEL_GRAPH)[0]
}

/// The model's opset imports as (domain, version).
fn opsets(model: &[u8]) -> Vec<(String, u64)> {
    payloads(model, field::MODEL_OPSET_IMPORT)
        .into_iter()
        .map(|opset| {
            let version = fields(opset)
                .find_map(|f| match f.unwrap() {
                    Field {
                        number: field::OPSET_VERSION,
                        payload: Payload::Varint(v),
                        ..
                    } => Some(v),
                    _ => None,
                })
                .unwrap();
            (string(opset, field::OPSET_DOMAIN), version)
        })
        .collect()
}

/// A node's fields but its operator and domain.
fn other_fields(node: &[u8]) -> Vec<(u64, &[u8])> {
    spans(node)
        .into_iter()
        .filter(|(n, _)| ![field::NODE_OP_TYPE, field::NODE_DOMAIN].contains(n))
        .collect()
}

fn pair(domain: &str, op: &str) -> (String, String) {
    (domain.to_string(), op.to_string())
}

/// Every field of the tiny bundle's fused DiT keeps its bytes but the two self-attention nodes'
/// operator and domain; the model imports `com.microsoft` already (its cross-attention is
/// `MultiHeadAttention`), so no import is added.
#[test]
fn only_the_runner_attention_nodes_of_the_fused_dit_change() {
    let model = std::fs::read(tiny("dit_fused.onnx")).unwrap();
    let new = attention_to_multi_head_attention(&model).unwrap();
    let (old_fields, new_fields) = (spans(&model), spans(&new));
    assert_eq!(old_fields.len(), new_fields.len());
    for ((a, old), (b, new)) in old_fields.iter().zip(&new_fields) {
        assert_eq!(a, b, "the model's fields keep their order");
        if *a != field::MODEL_GRAPH {
            assert_eq!(old, new, "model field {a}");
        }
    }
    let (old_graph, new_graph) = (spans(graph(&model)), spans(graph(&new)));
    assert_eq!(old_graph.len(), new_graph.len());
    let mut rewritten = 0;
    for ((a, old), (b, new)) in old_graph.iter().zip(&new_graph) {
        assert_eq!(a, b, "the graph's fields keep their order");
        let (old_node, new_node) = match *a {
            field::GRAPH_NODE => (payloads(old, 1)[0], payloads(new, 1)[0]),
            _ => {
                assert_eq!(old, new, "graph field {a}");
                continue;
            }
        };
        if operator(old_node) != pair("ai.unstep", "Attention") {
            assert_eq!(old, new, "{:?} changed", operator(old_node));
            continue;
        }
        rewritten += 1;
        assert_eq!(
            operator(new_node),
            pair("com.microsoft", "MultiHeadAttention")
        );
        assert_eq!(other_fields(old_node), other_fields(new_node));
        assert_eq!(payloads(new_node, field::NODE_INPUT).len(), 3);
    }
    assert_eq!(rewritten, 2, "one self-attention per layer of the tiny DiT");
    assert_eq!(opsets(&new), opsets(&model));
    assert!(opsets(&model).contains(&("com.microsoft".into(), 1)));
    // The rewrite of a rewritten model has nothing left to do.
    assert_eq!(
        attention_to_multi_head_attention(&new).unwrap_err(),
        RewriteError::NothingToRewrite("ai.unstep::Attention")
    );
}

/// The Python interpreter of the exporter's tests (it has `onnx`): `UNSTEP_TEST_PYTHON`, or the
/// checkout's `.cache/pyenv`.
fn python() -> PathBuf {
    std::env::var_os("UNSTEP_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/pyenv/bin/python"))
}

fn run_python(script: &str, args: &[&Path]) -> String {
    let out = std::process::Command::new(python())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "run {}: {e}; set UNSTEP_TEST_PYTHON to a Python with the onnx package",
                python().display()
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "python failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// What the `onnx` package reads in the rewritten fused DiT: a model its checker accepts, with
/// the exported model's nodes in their order, each equal but the self-attention nodes, which are
/// `MultiHeadAttention` with the same inputs, output, name and `num_heads`; the same
/// initializers, inputs, outputs, value infos and opset imports.
#[test]
fn onnx_reads_the_rewritten_fused_dit_as_the_exported_one_with_multi_head_attention() {
    let dir = tempfile::tempdir().unwrap();
    let rewritten = dir.path().join("dit_fused.onnx");
    let model = std::fs::read(tiny("dit_fused.onnx")).unwrap();
    std::fs::write(
        &rewritten,
        attention_to_multi_head_attention(&model).unwrap(),
    )
    .unwrap();
    let script = r#"
import sys, onnx
old, new = onnx.load(sys.argv[1]), onnx.load(sys.argv[2])
onnx.checker.check_model(new)
assert len(old.graph.node) == len(new.graph.node), (len(old.graph.node), len(new.graph.node))
changed = 0
for a, b in zip(old.graph.node, new.graph.node):
    if (a.domain, a.op_type) == ("ai.unstep", "Attention"):
        changed += 1
        assert (b.domain, b.op_type) == ("com.microsoft", "MultiHeadAttention"), b
        assert list(a.input) == list(b.input) and list(a.output) == list(b.output)
        assert a.name == b.name and list(a.attribute) == list(b.attribute)
        assert [(x.name, x.i) for x in b.attribute] == [("num_heads", 2)], b.attribute
    else:
        assert a == b, (a, b)
for part in ("initializer", "input", "output", "value_info"):
    assert list(getattr(old.graph, part)) == list(getattr(new.graph, part)), part
assert list(old.opset_import) == list(new.opset_import)
assert sum(n.op_type == "MultiHeadAttention" for n in new.graph.node) == 4
print("rewritten", changed, "of", len(new.graph.node))
"#;
    let out = run_python(script, &[&tiny("dit_fused.onnx"), &rewritten]);
    assert_eq!(out.trim(), "rewritten 2 of 257");
}

fn f32_inputs() -> [(&'static str, TensorElementType); 3] {
    let f32_ = TensorElementType::Float32;
    [("Q", f32_), ("K", f32_), ("V", f32_)]
}

fn attention_model(inputs: &[(&str, TensorElementType)], attrs: &[Attr]) -> Vec<u8> {
    onnx_graph::custom_node(
        DOMAIN,
        "Attention",
        TensorElementType::Float32,
        inputs,
        &["O"],
        attrs,
    )
}

fn cpu_session(model: &[u8]) -> Session {
    let runtime = ort_lib::runtime(None).expect(
        "ONNX Runtime: run through scripts/test (or set UNSTEP_ORT_CACHE_DIR / ORT_DYLIB_PATH)",
    );
    Session::builder(&runtime.environment)
        .unwrap()
        .with_intra_threads(1)
        .unwrap()
        .with_operators(operator_domain(false).unwrap())
        .unwrap()
        .commit_from_memory(model)
        .unwrap()
}

/// A lone `Attention` node of a model that imports no `com.microsoft` becomes
/// `MultiHeadAttention` with that import added, and ONNX Runtime's CPU kernel of it gives the
/// runner's CPU kernel's output: same scale, same softmax over every key, for a batch of two
/// with fewer queries than keys.
#[test]
fn multi_head_attention_computes_the_runner_attention() {
    let model = attention_model(&f32_inputs(), &[Attr::Int("num_heads", 4)]);
    let new = attention_to_multi_head_attention(&model).unwrap();
    let mut expected = opsets(&model);
    assert!(!expected.iter().any(|(d, _)| d == "com.microsoft"));
    expected.push(("com.microsoft".into(), 1));
    assert_eq!(opsets(&new), expected);

    let (b, s, l, d) = (2usize, 5usize, 7usize, 64usize);
    let mut rng = Rng(38);
    let q: Vec<f32> = rng.vec(b * s * d, -2.0, 2.0);
    let k: Vec<f32> = rng.vec(b * l * d, -2.0, 2.0);
    let v: Vec<f32> = rng.vec(b * l * d, -1.0, 1.0);
    let run = |model: &[u8]| -> Vec<f32> {
        let mut session = cpu_session(model);
        let tensor = |rows: usize, data: &[f32]| {
            Tensor::from_array((vec![b as i64, rows as i64, d as i64], data.to_vec())).unwrap()
        };
        let outputs = session
            .run(ort::inputs! {
                "Q" => tensor(s, &q),
                "K" => tensor(l, &k),
                "V" => tensor(l, &v),
            })
            .unwrap();
        let (shape, o) = outputs["O"].try_extract_tensor::<f32>().unwrap();
        assert_eq!(shape.to_vec(), [b as i64, s as i64, d as i64]);
        o.to_vec()
    };
    let (runner, onnxruntime) = (run(&model), run(&new));
    let worst = runner
        .iter()
        .zip(&onnxruntime)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst <= 1e-5, "outputs differ by {worst:e}");
    // Not the same kernel by accident: the two differ in their rounding somewhere.
    assert_ne!(runner, onnxruntime);
}

/// Nodes the contract does not describe are refused rather than rewritten into another
/// computation, and bytes that are not a model are refused.
#[test]
fn what_the_rewrite_does_not_know_is_refused() {
    let f32_ = f32_inputs();
    let two_inputs = attention_model(&f32_[..2], &[Attr::Int("num_heads", 2)]);
    let message = attention_to_multi_head_attention(&two_inputs)
        .unwrap_err()
        .to_string();
    assert!(message.contains("not the three Q, K and V"), "{message}");
    let no_heads = attention_model(&f32_, &[]);
    let message = attention_to_multi_head_attention(&no_heads)
        .unwrap_err()
        .to_string();
    assert!(message.contains("0 attributes"), "{message}");
    let other = attention_model(&f32_, &[Attr::Float("scale", 0.5)]);
    let message = attention_to_multi_head_attention(&other)
        .unwrap_err()
        .to_string();
    assert!(message.contains("not num_heads"), "{message}");
    let zero = attention_model(&f32_, &[Attr::Int("num_heads", 0)]);
    let message = attention_to_multi_head_attention(&zero)
        .unwrap_err()
        .to_string();
    assert!(message.contains("num_heads is 0"), "{message}");

    let identity = onnx_graph::identity(TensorElementType::Float32);
    assert_eq!(
        attention_to_multi_head_attention(&identity).unwrap_err(),
        RewriteError::NothingToRewrite("ai.unstep::Attention")
    );
    let model = attention_model(&f32_, &[Attr::Int("num_heads", 2)]);
    let cut = &model[..model.len() - 3];
    assert!(matches!(
        attention_to_multi_head_attention(cut),
        Err(RewriteError::Malformed(_))
    ));
    assert!(matches!(
        attention_to_multi_head_attention(b"not a model"),
        Err(RewriteError::Malformed(_))
    ));
}

/// Latents of a generation on the CPU provider with the tiny bundle's fused DiT.
fn latents(bundle: Bundle, rewrite: bool) -> (DitAttention, Vec<f32>) {
    let runtime = RuntimeOptions {
        intra_op_threads: Some(1),
        dit_kernels: FusedKernels::Unstep,
        ..RuntimeOptions::default()
    };
    REWRITE_ON_CPU.set(rewrite);
    let generator = Generator::new(bundle, &runtime);
    REWRITE_ON_CPU.set(false);
    let mut generator = generator.unwrap();
    let options = GenerateOptions {
        latents_only: true,
        ..GenerateOptions::default()
    };
    let video = generator
        .generate(3, "a red fox running through fresh snow", &options)
        .unwrap();
    (generator.dit_attention(), video.latents)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// A whole generation with the fused DiT rewritten to ONNX Runtime's `MultiHeadAttention` (its
/// CPU kernel) gives the latents of the runner's `Attention` (its CPU kernel) within 1e-4, and
/// the same latents bit for bit when the model keeps its weights as external data beside it (as
/// a full-size bundle's DiT does), loaded from memory with the folder of that data.
#[test]
fn the_rewritten_fused_dit_generates_the_runner_attention_latents() {
    let tiny_dir = tiny("");
    let (runner_kind, runner) = latents(Bundle::peek(&tiny_dir).unwrap(), false);
    let (rewritten_kind, rewritten) = latents(Bundle::peek(&tiny_dir).unwrap(), true);
    assert_eq!(runner_kind, DitAttention::Runner);
    assert_eq!(rewritten_kind, DitAttention::OnnxRuntimeInFused);
    let error = max_abs_diff(&runner, &rewritten);
    eprintln!("rewritten vs runner attention: latents max abs error {error:e}");
    assert!(error <= 1e-4, "latents differ by {error}");
    assert_ne!(error, 0.0, "the rewritten attention did not run");

    // The bundle again, its fused DiT's initializers in `dit_fused.onnx.data` beside it.
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&tiny_dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
        }
    }
    let model = copy.path().join("dit_fused.onnx");
    let script = r#"
import sys, onnx
path = sys.argv[1]
m = onnx.load(path)
onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
          location="dit_fused.onnx.data", size_threshold=0)
m = onnx.load(path, load_external_data=False)
print(sum(t.data_location == onnx.TensorProto.EXTERNAL for t in m.graph.initializer))
"#;
    let external = run_python(script, &[&model]);
    assert_eq!(external.trim(), "24", "every initializer is external data");
    assert!(
        std::fs::metadata(model.with_extension("onnx.data"))
            .unwrap()
            .len()
            > 0
    );
    let (_, from_external) = latents(Bundle::peek(copy.path()).unwrap(), true);
    assert_eq!(from_external, rewritten);
}

/// On a GPU, the rewritten self-attention in float16 at the DiT's sizes (12 heads of 128, a
/// block's 4,680 rows over two blocks' keys) with ONNX Runtime's FlashAttention-2 and
/// memory-efficient kernels gives the runner's cuDNN call's output.
#[test]
#[ignore = "needs a CUDA GPU, ONNX Runtime's CUDA provider, cuDNN and NVRTC on LD_LIBRARY_PATH"]
fn on_a_gpu_rewritten_attention_matches_the_runner_cudnn_call() {
    use half::f16;
    use ort::ep::{self, cuda::AttentionBackend as B};
    let f16_ = TensorElementType::Float16;
    let inputs = [("Q", f16_), ("K", f16_), ("V", f16_)];
    let model = onnx_graph::custom_node(
        DOMAIN,
        "Attention",
        f16_,
        &inputs,
        &["O"],
        &[Attr::Int("num_heads", 12)],
    );
    let rewritten = attention_to_multi_head_attention(&model).unwrap();
    let (s, l, d) = (4680usize, 9360usize, 1536usize);
    let mut rng = Rng(38);
    // Queries large enough that each row's softmax is far from uniform.
    let q: Vec<f16> = rng.vec(s * d, -4.0, 4.0);
    let k: Vec<f16> = rng.vec(l * d, -1.0, 1.0);
    let v: Vec<f16> = rng.vec(l * d, -1.0, 1.0);
    let runtime = ort_lib::runtime(None).unwrap();
    let run = |model: &[u8], backend: B, runner: bool| -> Vec<f32> {
        let cuda = ep::CUDA::default()
            .with_attention_backend(backend)
            .build()
            .error_on_failure();
        let mut builder = Session::builder(&runtime.environment)
            .unwrap()
            .with_execution_providers([cuda])
            .unwrap();
        if runner {
            builder = builder
                .with_operators(operator_domain(true).unwrap())
                .unwrap();
        }
        let mut session = builder.commit_from_memory(model).unwrap();
        let tensor = |rows: usize, data: &[f16]| {
            Tensor::from_array((vec![1, rows as i64, d as i64], data.to_vec())).unwrap()
        };
        let outputs = session
            .run(ort::inputs! {
                "Q" => tensor(s, &q),
                "K" => tensor(l, &k),
                "V" => tensor(l, &v),
            })
            .unwrap();
        let (_, o) = outputs["O"].try_extract_tensor::<f16>().unwrap();
        o.iter().map(|x| x.to_f32()).collect()
    };
    let cudnn = run(&model, B::CUDNN_FLASH_ATTENTION, true);
    for (name, backend) in [
        ("FlashAttention-2", B::FLASH_ATTENTION),
        ("memory-efficient", B::EFFICIENT_ATTENTION),
    ] {
        let got = run(&rewritten, backend, false);
        let worst = max_abs_diff(&cudnn, &got);
        eprintln!("{name} against the runner's cuDNN call: max abs difference {worst:e}");
        assert!(worst <= 2e-3, "{name}: outputs differ by {worst:e}");
    }
}
