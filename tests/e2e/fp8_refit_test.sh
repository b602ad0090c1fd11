#!/usr/bin/env bash
# FP8 serving weights through the relay tree: `synth --fp8` writes BF16 steps and
# their FP8 twins (docs/fp8.md); agents a1..a3 (a3 below a relay) hold step0-fp8 and
# the source publishes step0-fp8 -> step1-fp8 in fast mode, then step1-fp8 ->
# step2-fp8 in context mode. Every file of every store (safetensors headers, the
# index, config.json) must end byte-identical to the twin, by sha256.
# Usage: fp8_refit_test.sh DELTACAST_BINARY   (APPLY=staged: agents apply staged)
set -uo pipefail
dc=$1
source "$(dirname "$0")/lib.sh"
start_work fp8-refit
write_chain_config fp8-refit $((26600 + (RANDOM % 100) * 8)) 2 64KiB 4 30s all 10s
export DELTACAST_TOKEN=fp8-refit-$RANDOM
failures=()
check() { "${@:2}" >/dev/null 2>&1 || failures+=("$1"); }
# The checksums of a directory's files (not the agent's .deltacast/ state).
sums() { (cd "$1" && find . -path ./.deltacast -prune -o -type f -print | LC_ALL=C sort | xargs sha256sum); }

"$dc" synth --out "$work/steps" --params 4M --steps 2 --change-rate 3% --threads 2 --fp8 >/dev/null ||
  { echo "fp8_refit: FAIL: synth --fp8"; exit 1; }
mkdir -p "$work/run"
for n in a1 a2 a3; do
  cp -r "$work/steps/step0-fp8" "$work/run/$n"
  run_agent "$n"
done
check "the twins' config.json differ between steps" \
  cmp "$work/steps/step0-fp8/config.json" "$work/steps/step2-fp8/config.json"
check "the twins hold no F8_E4M3 tensor" grep -q F8_E4M3 "$work/steps/step1-fp8/model-00001-of-00003.safetensors"
publish() {  # FROM TO MODE
  "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step$1-fp8" \
    --new "$work/steps/step$2-fp8" --mode "$3" --json --no-progress --state-dir "$work/run/source" \
    >"$work/run/publish$2.json" 2>>"$work/run/publish.log"
  local rc=$?
  check "publish step$1-fp8 -> step$2-fp8 ($3) exited $rc" test "$rc" -eq 0
  check "step$2-fp8 ($3) did not commit on all 3 nodes" \
    json_holds "$work/run/publish$2.json" '.committed and .nodes_decided == 3'
  check "step$2-fp8 ($3) sent no delta" json_holds "$work/run/publish$2.json" '.delta_bytes > 0'
  sums "$work/steps/step$2-fp8" >"$work/run/want$2.sums"
  for n in a1 a2 a3; do
    sums "$work/run/$n" >"$work/run/$n.$2.sums"
    check "$n is not byte-identical to step$2-fp8 after $3 ($(diff "$work/run/want$2.sums" "$work/run/$n.$2.sums" | head -2 | tr '\n' ' '))" \
      cmp "$work/run/want$2.sums" "$work/run/$n.$2.sums"
  done
}
publish 0 1 fast
publish 1 2 context
for n in a1 a2 a3; do check "$n's audit" "$dc" audit "$work/run/$n"; done
# --fp8-from: only the later steps' twins (what scripts/demo needs), the same bytes.
"$dc" synth --out "$work/later" --params 4M --steps 2 --change-rate 3% --threads 2 --fp8 --fp8-from 1 \
  >/dev/null
check "--fp8-from 1 wrote step0's twin" test ! -e "$work/later/step0-fp8"
check "--fp8-from 1: step2's twin differs" "$dc" verify "$work/later/step2-fp8" "$work/steps/step2-fp8"

# Refused at the door (docs/fp8.md): a store whose config.json says 64 x 64 blocks
# while its scales are of 128 x 128 blocks. The agent exits before writing anything,
# audit, publish and serve name the tensor, and nothing is sent.
cp -r "$work/steps/step2-fp8" "$work/run/bad"
rm -rf "$work/run/bad/.deltacast"  # the source's manifest cache
jq '.quantization_config.weight_block_size = [64, 64]' "$work/steps/step2-fp8/config.json" \
  >"$work/run/bad/config.json"
scale="scale tensor 'model\.layers\.[0-9]*\.[a-z_.]*\.weight_scale_inv' is F32 \[.*\]; expected F32"
timeout 20 "$dc" agent --config "$work/cluster.toml" --node a3 --store "$work/run/bad" \
  >"$work/run/bad-agent.log" 2>&1
rc=$?
check "an agent on a store with the wrong block size exited $rc" test "$rc" -ne 0 -a "$rc" -ne 124
check "the agent's refusal does not name the scale tensor" grep -q "$scale" "$work/run/bad-agent.log"
check "the refused agent wrote its state" test ! -e "$work/run/bad/.deltacast"
"$dc" publish --config "$work/cluster.toml" --base "$work/run/bad" --new "$work/steps/step1-fp8" \
  --no-progress --state-dir "$work/run/source" >/dev/null 2>"$work/run/bad-publish.log"
rc=$?
check "publish to receivers of the wrong block size exited $rc" test "$rc" -ne 0
check "the publish refusal does not name the scale tensor" grep -q "$scale" "$work/run/bad-publish.log"
printf '%s\n' "$work/run/bad" | timeout 60 "$dc" serve --config "$work/cluster.toml" \
  --state-dir "$work/run/serve-bad" >/dev/null 2>"$work/run/bad-serve.log"
rc=$?
check "serve from receivers of the wrong block size exited $rc" test "$rc" -ne 0 -a "$rc" -ne 124
check "the serve refusal does not name the scale tensor" grep -q "$scale" "$work/run/bad-serve.log"
cp -r "$work/run/a1" "$work/run/bad-audit"
cp "$work/run/bad/config.json" "$work/run/bad-audit/config.json"
"$dc" audit "$work/run/bad-audit" >/dev/null 2>"$work/run/bad-audit.log"
check "audit of a store with the wrong block size passed" test $? -ne 0
check "the audit refusal does not name the scale tensor" grep -q "$scale" "$work/run/bad-audit.log"
for n in a1 a2 a3; do
  sums "$work/run/$n" >"$work/run/$n.after.sums"
  check "$n changed after the refused publish" cmp "$work/run/want2.sums" "$work/run/$n.after.sums"
done
if ((${#failures[@]} == 0)); then
  echo "fp8_refit: 2 FP8 refits (fast $(jq .delta_bytes "$work/run/publish1.json") B, context $(jq .delta_bytes "$work/run/publish2.json") B) bit-exact on 3 nodes"
  echo "fp8_refit: 1 passed, 0 failed"
else
  printf 'fp8_refit: FAIL: %s\n' "${failures[@]}"
  tail -n 5 "$work/run/publish.log" "$work/run/a1.log"
  exit 1
fi
