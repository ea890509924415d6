# Sourced by the GPU-machine scripts: `logged NAME COMMAND...` runs the command with its output
# on the terminal and in "$out/NAME.log", and prints its exit status and time.
logged() {
  local name=$1; shift
  echo "== $name: $*"
  local start=$(date +%s%N)
  "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  printf "== %s: exit %s after %d ms\n" "$name" "$rc" $(( ($(date +%s%N) - start) / 1000000 ))
  return "$rc"
}
