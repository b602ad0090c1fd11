#!/usr/bin/env bash
# Commands that use no fabric start without libfabric: linked, it brought its PSM,
# PSM2 and infinipath provider libraries, whose constructors calibrate clocks for
# ~0.2 s before main, and every command paid for it (`deltacast --version` took
# 0.24 s, now ~0.04 s). The ofi transport loads it when it first needs it
# (transport/ofi/libfabric.h; the ofi tests use it that way).
# Usage: startup_test.sh DELTACAST_BINARY
set -uo pipefail
dc=$1
failures=()
for args in "--version" "diff --help" "config --help"; do
  # shellcheck disable=SC2086
  inits=$(LD_DEBUG=libs "$dc" $args 2>&1 >/dev/null | grep "calling init")
  if [[ -z $inits ]]; then
    failures+=("'deltacast $args': LD_DEBUG showed no library initialised at all")
  elif grep -qE "libfabric|libpsm|libinfinipath" <<<"$inits"; then
    failures+=("'deltacast $args' initialised $(grep -oE '[^/]*(libfabric|libpsm|libinfinipath)[^ ]*' <<<"$inits" | tr '\n' ' ')")
  fi
done
if ((${#failures[@]})); then
  printf 'FAIL: %s\n' "${failures[@]}"
  exit 1
fi
echo "PASS: no command that uses no fabric loads libfabric or its providers"
