#!/usr/bin/env bash
# The released-weights path at full size on a GPU machine: seeded random weights written in the
# released files' formats (Self-Forcing's generator checkpoint, Wan2.1's VAE and 24-layer UMT5-XXL
# encoder, a UMT5-type tokenizer.json), then the exporter reading them strictly.
#
#   benches/released_export.sh WORK_DIR
#
# Writes WORK_DIR/release (the released-format files) and WORK_DIR/wan-1.3b-released (the
# bundle), and prints the time of each step. The 24-layer float32 text encoder
# alone is about 23 GB; its ONNX export passes through a temporary copy, which goes to /dev/shm
# when that has room (TMPDIR otherwise), so the disk holds the released files and the bundle.
set -euo pipefail
work=${1:?usage: benches/released_export.sh WORK_DIR}
export PYTHONPATH=${EXPORT:-assets/export}${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$work"
shm_free=$(df --output=avail -B1G /dev/shm 2>/dev/null | tail -1 | tr -d ' ' || echo 0)
if [ "${shm_free:-0}" -gt 40 ]; then export TMPDIR=/dev/shm; fi
echo "== temporary files in ${TMPDIR:-/tmp}"
step() {
  local name=$1
  shift
  echo "== $name"
  local started=$SECONDS
  "$@"
  echo "$name: $((SECONDS - started)) s"
}
step release-files python3 -m unstep_export release-files --preset wan-1.3b --out "$work/release"
step export python3 -m unstep_export export --preset wan-1.3b --device cuda --out "$work/wan-1.3b-released" \
  --released "$work/release"
du -sh "$work/release" "$work/wan-1.3b-released"
ls -l "$work/wan-1.3b-released"
