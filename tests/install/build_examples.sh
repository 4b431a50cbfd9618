#!/bin/sh
# Installs Troupe from the build tree into BUILD/installed (cmake --install), then builds against
# that prefix, as separate CMake projects that find_package(Troupe): one translation unit per
# installed public header (each must compile alone), and every example under examples/ that has
# a CMakeLists.txt. The tests of the examples then run the programs built here
# (BUILD/installed-examples/NAME/NAME).
#   tests/install/build_examples.sh SOURCE_DIR BUILD_DIR [CXX_FLAGS [LINKER_FLAGS]]
# The flags are the build's own (a sanitizer build's instrumented libraries need them to link).
set -eu
src=$1
build=$2
cxx_flags=${3:-}
link_flags=${4:-}
prefix=$build/installed
out=$build/installed-examples
rm -rf "$prefix" "$out"
mkdir -p "$out"
step() {  # a command whose output goes to a log, shown when it fails
  log=$1; shift
  if ! "$@" > "$log" 2>&1; then
    echo "build_examples: failed: $*"; tail -n 40 "$log"; exit 1
  fi
}
step "$out/install.log" cmake --install "$build" --prefix "$prefix"
# Nothing of the build tree may be needed: the package is found from the prefix alone.
step "$out/headers.configure.log" cmake -S "$src/tests/install/headers" -B "$out/headers" \
  -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DTROUPE_PREFIX="$prefix" \
  -DCMAKE_CXX_FLAGS="$cxx_flags" -DCMAKE_EXE_LINKER_FLAGS="$link_flags"
step "$out/headers.build.log" cmake --build "$out/headers" -j 2
echo "build_examples: every public header in $prefix/include/troupe compiles alone"
for dir in "$src"/examples/*/; do
  name=$(basename "$dir")
  [ -f "$dir/CMakeLists.txt" ] || continue
  step "$out/$name.configure.log" cmake -S "$dir" -B "$out/$name" -G Ninja \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_FLAGS="$cxx_flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$link_flags"
  step "$out/$name.build.log" cmake --build "$out/$name" -j 2
  echo "build_examples: built examples/$name against $prefix"
done
