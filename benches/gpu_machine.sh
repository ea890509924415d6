#!/usr/bin/env bash
# docs/gpu.md's path on a GPU machine, from an exported bundle to the speed probes and a
# generation, with the runner's own commands; each step's output is kept under OUT_DIR.
#   benches/gpu_machine.sh export OUT_DIR            # a seeded wan-1.3b bundle at assets/wan-1.3b
#   benches/gpu_machine.sh probes OUT_DIR [TAG]      # doctor, plan, unstep_speed and gb200_speed
#   benches/gpu_machine.sh subset OUT_DIR [N] [TAG]  # full946's first N prompts (default 32), 8 shards
# RUNNER (default target/release/runner); ORT_DYLIB_PATH and LD_LIBRARY_PATH point at ONNX
# Runtime's CUDA build (scripts/setup-gpu writes them for scripts/runner); BUNDLE_AT (default
# assets/wan-1.3b, where the experiments look) is where `export` writes, or a link to it when
# BUNDLE_DIR names the export's real place. The bundle's weights are seeded random: a machine
# without the released files measures speed with them, and the subset's VBench step is allowed
# to run on them only because `subset` says so (assets.allow_random_weights).
set -uo pipefail
step=${1:?usage: benches/gpu_machine.sh export|probes|subset OUT_DIR ...}
out=${2:?usage: benches/gpu_machine.sh export|probes|subset OUT_DIR ...}
runner=${RUNNER:-target/release/runner}
at=${BUNDLE_AT:-assets/wan-1.3b}
mkdir -p "$out"
. "$(dirname "$0")/logged.sh"
case $step in
  export)
    dir=${BUNDLE_DIR:-$at}
    logged nvidia-smi nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    logged export env PYTHONPATH=assets/export python3 -m unstep_export export --preset wan-1.3b \
      --device cuda --out "$dir" || exit 1
    [ "$dir" != "$at" ] && ln -sfn "$dir" "$at"
    du -sh "$dir"/ ;;
  probes)
    tag=${3:-$(date +%H%M%S)}
    logged doctor "$runner" doctor experiments/unstep_speed.toml
    logged plan "$runner" plan experiments/unstep_speed.toml
    RUNNER=$runner logged probes benches/gb200_vs_unstep.sh "$tag"
    logged report "$runner" report "unstep_speed_$tag"
    cp "results/unstep_speed_$tag/summary.json" "$out/unstep_speed_summary.json"
    cp "results/gb200_speed_$tag/summary.json" "$out/gb200_speed_summary.json" ;;
  subset)
    n=${3:-32}
    tag=${4:-$(date +%H%M%S)}
    name=full946_first${n}_$tag
    set_args=(--set "name=$name" --set "prompts.indices=0-$((n - 1))" --set "prompts.expect_count=$n"
      --set assets.allow_random_weights=true)
    logged subset-plan "$runner" plan experiments/full946.toml "${set_args[@]}"
    logged subset "$runner" apply experiments/full946.toml "${set_args[@]}"
    logged subset-report "$runner" report "$name"
    cp "results/$name/summary.json" "$out/subset_summary.json" ;;
  *) echo "unknown step $step: export, probes or subset" >&2; exit 2 ;;
esac
