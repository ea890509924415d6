#!/usr/bin/env bash
# A process's start and first prompt on a GPU: `runner worker` with an empty kernel cache folder
# (cold), with the same folder again (warm: its frames must equal the cold run's), warm with ONNX
# Runtime's heuristic convolution search, without a folder; then `runner apply
# experiments/unstep_speed.toml` (a warmup process, then the measurement process) on prompts 0-4.
# Prints each worker's per-prompt times with its first record's `process_start` and `one_time`,
# and the apply's report from its statistics on.
#   benches/first_prompt.sh OUT_DIR BUNDLE_DIR    (RUNNER: the runner binary, default
#   target/release/runner; ORT_DYLIB_PATH and LD_LIBRARY_PATH as for scripts/bench-gpu)
# With BASELINE=<another runner binary>, that runner also runs warm on the same folder (after
# the warm run), to set its start and first prompt against this one's in the same call; with
# ROUNDS=N (default 1) the two warm runs alternate N times (warm, baseline, warm2, baseline2, ...).
# With PROFILE=1, a warm worker on prompt 0 with ONNX Runtime's profiler, summarised by
# benches/ort_profile.py (the large sessions' load and initialisation, their slowest run). With
# ORT_LOG=info (or verbose), a warm worker on prompt 0 with ONNX Runtime's log
# (UNSTEP_ORT_LOG), summarised by benches/ort_log.py (each large session's build and its longest
# steps, and the time each of the runner's CUDA kernels took to create). EXTRA=0 leaves out the
# heuristic-search and no-folder workers; APPLY=0 leaves out the apply.
set -u
out=${1:?usage: benches/first_prompt.sh OUT_DIR BUNDLE_DIR}
bundle=${2:?usage: benches/first_prompt.sh OUT_DIR BUNDLE_DIR}
runner=${RUNNER:-target/release/runner}
prompts=assets/prompts/tiny.txt
mkdir -p "$out"
cache=$(mktemp -d)
common=(--bundle "$bundle" --prompts "$prompts" --provider cuda --cuda-graphs --indices 0,1,2)
run() { # name, then the command (with leading VAR=value words)
  local name=$1; shift
  local started=$(date +%s.%N)
  env "$@" 2> "$out/$name.log"
  echo "== $name rc=$? wall $(python3 -c "print(round($(date +%s.%N) - $started, 2))") s"
}
run cold UNSTEP_KERNEL_CACHE="$cache" "$runner" worker "${common[@]}" --timings "$out/cold.jsonl" --save-frames "$out/frames_cold"
run warm UNSTEP_KERNEL_CACHE="$cache" "$runner" worker "${common[@]}" --timings "$out/warm.jsonl" --save-frames "$out/frames_warm"
for i in 0 1 2; do
  cmp -s "$out/frames_cold/frames_$i.u8" "$out/frames_warm/frames_$i.u8" && echo "frames_$i identical" || echo "frames_$i DIFFER"
done
rm -rf "$out/frames_cold" "$out/frames_warm"
names="cold warm"
for round in $(seq 1 "${ROUNDS:-1}"); do
  suffix=$([ "$round" = 1 ] || echo "$round")
  if [ "$round" != 1 ]; then
    run "warm$suffix" UNSTEP_KERNEL_CACHE="$cache" "$runner" worker "${common[@]}" --timings "$out/warm$suffix.jsonl"
    names="$names warm$suffix"
  fi
  if [ -n "${BASELINE:-}" ]; then
    run "baseline$suffix" UNSTEP_KERNEL_CACHE="$cache" "$BASELINE" worker "${common[@]}" --timings "$out/baseline$suffix.jsonl"
    names="$names baseline$suffix"
  fi
done
if [ -n "${ORT_LOG:-}" ]; then
  run ort_log UNSTEP_KERNEL_CACHE="$cache" UNSTEP_ORT_LOG="$ORT_LOG" "$runner" worker \
    --bundle "$bundle" --prompts "$prompts" --provider cuda --cuda-graphs --indices 0 --timings "$out/ort_log.jsonl"
  python3 benches/ort_log.py "$out/ort_log.log" 12
  gzip -f "$out/ort_log.log"
  names="$names ort_log"
fi
if [ "${PROFILE:-0}" = 1 ]; then
  run profile UNSTEP_KERNEL_CACHE="$cache" UNSTEP_ORT_PROFILE="$out/profile" "$runner" worker \
    --bundle "$bundle" --prompts "$prompts" --provider cuda --cuda-graphs --indices 0 --timings "$out/profile.jsonl"
  for f in "$out"/profile/{text_encoder,dit,vae}*.json; do python3 benches/ort_profile.py "$f" 6; done
  rm -rf "$out/profile"
  names="$names profile"
fi
if [ "${EXTRA:-1}" != 0 ]; then
  run warm_heuristic UNSTEP_KERNEL_CACHE="$cache" "$runner" worker "${common[@]}" --conv-algo-search heuristic --timings "$out/warm_heuristic.jsonl"
  run no_cache "$runner" worker "${common[@]}" --timings "$out/no_cache.jsonl"
  names="$names warm_heuristic no_cache"
fi
echo "kept: $(ls "$cache"/cudnn_attention | wc -l) attention plans, $(ls "$cache"/cudnn_conv/*.txt | wc -l) convolution choices ($(ls "$cache"/cudnn_conv/*.plan.json 2>/dev/null | wc -l) with their plans), $(ls "$cache"/nvrtc | wc -l) kernel image"
python3 - "$out" $names <<'PY'
import json, sys
out = sys.argv[1]
for name in sys.argv[2:]:
    try:
        records = [json.loads(line) for line in open(f"{out}/{name}.jsonl")]
    except OSError as e:
        print(name, e)
        continue
    print(name, [round(r["timed_total_s"], 3) for r in records])
    print("  process_start", records[0].get("process_start"))
    print("  one_time", records[0].get("one_time"), "later:", [r.get("one_time") for r in records[1:]])
PY
[ "${APPLY:-1}" = 0 ] && exit 0
started=$(date +%s)
PROMPT_INDICES=0-4 "$runner" apply experiments/unstep_speed.toml --quiet \
  --set assets.bundle="$bundle" --set prompts.file="$prompts" > "$out/apply.txt" 2> "$out/apply.err"
echo "== apply rc=$? wall $(( $(date +%s) - started )) s"
sed -n '/statistics/,$p' "$out/apply.txt"
tail -5 "$out/apply.err"
