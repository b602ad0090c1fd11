#!/usr/bin/env bash
# Proves the thread-safety check bites: compiles contracts.cc with clang++-15 and the
# check's flags. Usage: check.sh SOURCE_DIR VIOLATION EXPECTED FLAGS...
#   VIOLATION 0: the contracts are kept, it must compile.
#   VIOLATION n: contract n is broken, it must fail with a -Wthread-safety error whose
#                message contains EXPECTED.
# Exits 77 (skipped) when clang++-15 is not installed (scripts/setup installs it).
set -uo pipefail
source_dir=$1 violation=$2 expected=$3
shift 3
clang=$(command -v clang++-15) || {
  echo "clang++-15 not found: skipped"
  exit 77
}
out=$("$clang" -std=c++20 -fsyntax-only "$@" -I"$source_dir" -DVIOLATION="$violation" \
  "$source_dir/tests/thread_safety/contracts.cc" 2>&1)
rc=$?
echo "$out"
if [[ $violation == 0 ]]; then
  ((rc == 0)) || { echo "FAIL: the annotated code should compile"; exit 1; }
  echo "ok: compiles"
  exit 0
fi
((rc != 0)) || { echo "FAIL: violation $violation compiled; the check does not bite"; exit 1; }
grep -q "error: .*${expected}.*\[-Werror,-Wthread-safety" <<<"$out" || {
  echo "FAIL: violation $violation failed, but not with a thread-safety error about: $expected"
  exit 1
}
echo "ok: refused ($expected)"
