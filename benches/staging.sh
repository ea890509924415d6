#!/usr/bin/env bash
# Staging a released-size bundle: the tiny bundle plus one padding file of SIZE (default 27G, the
# released fp16 bundle's size; written with real bytes, so the hashing and any copy are real),
# applied as a one-prompt CPU probe twice: with the work root on the bundle's file system
# (linked) and on another one (COPY_ROOT, a folder on another file system: copied, the only way
# before staging by link). Prints each apply's staging seconds and placements from run.json, the
# work root file system's growth during the linked apply, and the ratio copy / link.
#   benches/staging.sh SCRATCH_DIR [COPY_ROOT]    (SIZE=27G; RUNNER: target/release/runner)
# SCRATCH_DIR must hold SIZE free; COPY_ROOT must be on another file system with SIZE free (no
# COPY_ROOT: the copied apply is left out and no ratio printed).
set -eu
scratch=${1:?usage: benches/staging.sh SCRATCH_DIR [COPY_ROOT]}
copy_root=${2:-}
size=${SIZE:-27G}
runner=$(realpath "${RUNNER:-target/release/runner}")
repo=$(cd "$(dirname "$0")/.." && pwd)
export UNSTEP_ORT_CACHE_DIR=${UNSTEP_ORT_CACHE_DIR:-$repo/.cache/onnxruntime}
mkdir -p "$scratch"
scratch=$(realpath "$scratch")
bundle=$scratch/bundle
rm -rf "$bundle" "$scratch/results" "$scratch/work" "$scratch/state"
cp -r "$repo/assets/tiny" "$bundle"
rm -rf "$bundle/golden"
echo "writing $size of padding into the bundle ..." >&2
head -c "$size" /dev/urandom > "$bundle/padding.bin"
probe() { # name, work root
  cat > "$scratch/$1.toml" <<TOML
kind = "probe"
[prompts]
file = "$repo/assets/prompts/tiny.txt"
indices = "0"
[warmup]
repeats = 0
[runtime]
provider = "cpu"
cpu_threads_per_process = 1
[method]
height = 64
width = 112
precision = "fp32"
[outputs]
dir = "$scratch/results"
[staging]
work_root = "$2"
[cache]
run_state_root = "$scratch/state/$1"
[assets]
bundle = "$bundle"
TOML
  "$runner" apply --quiet "$scratch/$1.toml" > /dev/null
  python3 - "$scratch/results/$1/run.json" "$1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["staging"]
print(f"{sys.argv[2]:<8} staging {s['seconds']:.2f} s  placements {json.dumps(s.get('placements'))}")
PY
}
used() { df --output=used -B1 "$1" | tail -1; }
before=$(used "$scratch")
probe linked "$scratch/work" &
watcher=$!
peak=$before
while kill -0 $watcher 2>/dev/null; do
  now=$(used "$scratch"); [ "$now" -gt "$peak" ] && peak=$now; sleep 0.2
done
wait $watcher
echo "linked   work root file system grew by at most $(( (peak - before) / 1048576 )) MiB during the apply"
linked=$(python3 -c "import json;print(json.load(open('$scratch/results/linked/run.json'))['staging']['seconds'])")
if [ -n "$copy_root" ]; then
  probe copied "$copy_root/unstep-staging-bench"
  copied=$(python3 -c "import json;print(json.load(open('$scratch/results/copied/run.json'))['staging']['seconds'])")
  python3 -c "print(f'copy / link: {$copied / $linked:.2f}x')"
fi
rm -rf "$bundle" "$scratch/results" "$scratch/work" "$scratch/state"
