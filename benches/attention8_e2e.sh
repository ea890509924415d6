#!/usr/bin/env bash
# The 8-bit attention on a GPU machine, each piece alone and together, with the runner's own
# commands: speed (`unstep_speed`'s timed region, warm mean) and quality (`runner compare` of the
# kept frames against the fp16 run, same prompts and noise). Each step's output is kept under
# OUT_DIR as it goes.
#   benches/attention8_e2e.sh OUT_DIR STEP...
# Steps: `kernel` (benches/attention8.py: the kernel alone against cuDNN's fp16 attention),
# `gputest` (the runner's GPU test of the 8-bit attention against its CPU kernel and cuDNN: a
# test binary built here with `cargo test --release --lib --no-run`, named by TEST_BINARY),
# `fp16`, `int8` (fp16 bundle, 8-bit attention), `quantize` (the fp8 bundle from the fp16 one),
# `fp8` (fp8 bundle: float8 matrix multiplies), `fp8int8` (both), `compare` (each run against
# fp16). RUNNER (default target/release/runner); BUNDLE (default assets/wan-1.3b, seeded
# random weights from benches/gpu_machine.sh export); PROMPTS (default 0-19); ORT_DYLIB_PATH and
# LD_LIBRARY_PATH point at ONNX Runtime's CUDA build.
set -uo pipefail
out=${1:?usage: benches/attention8_e2e.sh OUT_DIR STEP...}
shift
runner=${RUNNER:-target/release/runner}
bundle=${BUNDLE:-assets/wan-1.3b}
prompts=${PROMPTS:-0-19}
mkdir -p "$out"
. "$(dirname "$0")/logged.sh"
# A probe of `fp16_quality.toml`'s settings on PROMPTS, frames kept: its name, bundle, the
# bundle's precision and the attention's.
probe() {
  local name=$1 dir=$2 precision=$3 attention=$4
  case $dir in /*) ;; *) dir=$PWD/$dir ;; esac
  logged "$name" "$runner" apply experiments/fp16_quality.toml --set "name=$name" \
    --set "assets.bundle=$dir" --set "method.precision=$precision" \
    --set "method.attention_precision=$attention" --set "prompts.indices=$prompts" \
    --set outputs.save_latents=false
  logged "$name-report" "$runner" report "$name"
  cp "results/$name/summary.json" "$out/$name-summary.json" 2>/dev/null
}
for step in "$@"; do
  case $step in
    kernel) PYTHONUNBUFFERED=1 logged kernel python3 benches/attention8.py "$out" ;;
    gputest) logged gputest "${TEST_BINARY:?TEST_BINARY names the lib test binary}" \
      cuda_attention_8bit --ignored --nocapture ;;
    fp16) probe att_fp16 "$bundle" fp16 fp16 ;;
    int8) probe att_int8 "$bundle" fp16 int8 ;;
    quantize) logged quantize env PYTHONPATH=assets/export python3 -m unstep_export quantize \
      --from "$bundle" --out "$bundle-fp8" ;;
    fp8) probe att_fp8 "$bundle-fp8" fp8 fp16 ;;
    fp8int8) probe att_fp8int8 "$bundle-fp8" fp8 int8 ;;
    compare)
      for run in att_int8 att_fp8 att_fp8int8; do
        [ -d "results/$run" ] && logged "compare-$run" "$runner" compare att_fp16 "$run"
      done ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
