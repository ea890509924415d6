#!/usr/bin/env bash
# The benchmark guide's two speed probes back to back on one GPU: `runner apply
# experiments/unstep_speed.toml`, then `UNSTEP_ATTENTION_BACKEND=fa2 runner apply
# experiments/gb200_speed.toml`, which is the same probe with only the attention kernel
# different (the fused DiT's self-attention as ONNX Runtime's FlashAttention-2 in place of the
# runner's cuDNN call). Prints each run's attention as its record says it, the two warm means
# (`warm_mean_excluding_first`) and their ratio, and `runner compare` of the two.
#   benches/gb200_vs_unstep.sh [TAG]
# TAG (default: the time) names the runs unstep_speed_TAG and gb200_speed_TAG, so that each call
# measures fresh. RUNNER: the runner binary (default target/release/runner); ORT_DYLIB_PATH and
# LD_LIBRARY_PATH as for scripts/bench-gpu; CUDA_VISIBLE_DEVICES picks the GPU (a probe measures
# on the first visible one). Extra arguments for both applies in APPLY_ARGS (e.g.
# "--set assets.bundle=/data/wan-1.3b").
set -euo pipefail
runner=${RUNNER:-target/release/runner}
tag=${1:-$(date +%Y%m%d_%H%M%S)}
read -ra extra <<< "${APPLY_ARGS:-}"
a=unstep_speed_$tag
b=gb200_speed_$tag
echo "== $a"
"$runner" apply experiments/unstep_speed.toml --set "name=$a" "${extra[@]}"
echo "== $b (UNSTEP_ATTENTION_BACKEND=fa2)"
UNSTEP_ATTENTION_BACKEND=fa2 "$runner" apply experiments/gb200_speed.toml --set "name=$b" "${extra[@]}"
python3 - "results/$a" "results/$b" <<'EOF'
import json, sys
means = []
for run in sys.argv[1:]:
    record = json.load(open(f"{run}/run.json"))
    summary = json.load(open(f"{run}/summary.json"))
    attention = record.get("attention_backend", {})
    mean = summary["timed_total"]["warm_mean_excluding_first"]
    print(f"{run}: attention {attention.get('resolved')} (asked: {attention.get('requested')}), "
          f"DiT kernels {record.get('dit_kernels')}; warm mean {mean} s")
    means.append(mean)
if None not in means:
    print(f"gb200_speed / unstep_speed: {means[1] / means[0]:.3f}")
EOF
"$runner" compare "$a" "$b"
