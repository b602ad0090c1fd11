#!/usr/bin/env bash
# The embedding API as an embedder gets it: `cmake --install` the build into a
# scratch prefix, build examples/ as a project of its own against it
# (find_package(deltacast CONFIG REQUIRED), no path into the source tree, so the
# installed headers must stand alone), and run the example: it exits 0 only if the
# worker ends bit-identical to the trainer after every step.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
scratch=$(mktemp -d /tmp/deltacast-install.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$src/examples" -B "$scratch/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$scratch/prefix" "${launcher[@]}" >/dev/null
cmake --build "$scratch/build" >/dev/null
ls "$scratch/prefix/include/deltacast" "$scratch/prefix/lib"*/cmake/deltacast >/dev/null
"$scratch/build/deltacast_example_embed" 2
echo "install: the example built against the installed deltacast and ran: 1 passed, 0 failed"
