# Sourced by the device scripts (device_check.sh, ab_compare.sh, ab_cycles.sh): the one way they
# configure and build a source tree with the CUDA kernels, every core, Release.
#   build_tree SOURCE_DIR BUILD_DIR LOG [TARGET...]   (no target: everything)
# Output goes to LOG (appended); the status is the build's.
#
# Ninja rebuilds by modification times, and a tree carried to the device (git archive, tar) can
# bring a file older than the objects that a build dir kept from other contents at the same path
# (session 37: an A/B "baseline" ran the previous call's kernels). So every source file whose
# content differs from what the build dir last built (BUILD_DIR/.source-manifest, md5 per file)
# is touched first.
touch_changed_sources() {
  local source="$1" build="$2"
  local manifest="$build/.source-manifest" current
  current="$(cd "$source" && find src include bench tests python cmake CMakeLists.txt pyproject.toml -type f \
      -print0 2>/dev/null | sort -z | xargs -0 md5sum)"
  if [ -f "$manifest" ]; then
    # Files whose "hash  path" line is not in the manifest: new or changed.
    comm -13 <(sort "$manifest") <(sort <<<"$current") | sed 's/^[0-9a-f]*  //' |
      (cd "$source" && xargs -r -d '\n' touch)
  elif [ -f "$build/build.ninja" ]; then  # built before manifests: nothing is known, so everything
    sed 's/^[0-9a-f]*  //' <<<"$current" | (cd "$source" && xargs -r -d '\n' touch)
  fi
  mkdir -p "$build"
  printf '%s\n' "$current" >"$manifest.pending"
}

build_tree() {
  local source="$1" build="$2" log="$3"; shift 3
  local targets=()
  [ $# -gt 0 ] && targets=(--target "$@")
  touch_changed_sources "$source" "$build"
  cmake -S "$source" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOPENMLA_CUDA=ON >>"$log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" "${targets[@]}" >>"$log" 2>&1 &&
    mv "$build/.source-manifest.pending" "$build/.source-manifest"
}
