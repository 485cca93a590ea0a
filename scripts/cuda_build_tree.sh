# Sourced by the device scripts (device_check.sh, ab_compare.sh, ab_cycles.sh): the one way they
# configure and build a source tree with the CUDA kernels, every core, Release.
#   build_tree SOURCE_DIR BUILD_DIR LOG [TARGET...]   (no target: everything)
# Output goes to LOG (appended); the status is the build's.
build_tree() {
  local source="$1" build="$2" log="$3"; shift 3
  local targets=()
  [ $# -gt 0 ] && targets=(--target "$@")
  cmake -S "$source" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOPENMLA_CUDA=ON >>"$log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" "${targets[@]}" >>"$log" 2>&1
}
