#!/usr/bin/env bash
# The trainer side of FP8 serving weights (docs/fp8.md, "Trainer side"): the nodes
# hold FP8 twins, the trainer only BF16 steps. `publish --serving FILE` quantizes
# both BF16 steps and ships the delta between their twins (no twin directory read
# by the publish: it is given the BF16 steps only); every file of every node must
# end byte-identical to the twin `synth --fp8` wrote (sha256), and the FP8 version
# id must be the twin's (`deltacast manifest`). A serving description that does not
# fit the checkpoint is refused naming the tensor, and no node changes.
# Then the same from producers (local ones, then `deltacast produce` processes): the four ranks of a TP=2 x PP=2 job (whose TP cut
# of the MLP's 640 falls inside a 128 x 128 block) quantize their own shards with
# `publish --base-shards --new-shards --serving` (split blocks after the amax
# exchange through the root), and the nodes again end byte-identical to the twins.
# Usage: fp8_publish_test.sh DELTACAST_BINARY
set -uo pipefail
dc=$1
source "$(dirname "$0")/lib.sh"
start_work fp8-publish
port_base=$((27400 + (RANDOM % 100) * 8))
write_chain_config fp8-publish "$port_base" 2 64KiB 4 30s all 10s
export DELTACAST_TOKEN=fp8-publish-$RANDOM
failures=()
check() { "${@:2}" >/dev/null 2>&1 || failures+=("$1"); }
sums() { (cd "$1" && find . -path ./.deltacast -prune -o -type f -print | LC_ALL=C sort | xargs sha256sum); }

"$dc" synth --out "$work/steps" --params 4M --steps 5 --change-rate 3% --threads 2 --fp8 \
  --shards tp=2,pp=2 >/dev/null ||
  { echo "fp8_publish: FAIL: synth --fp8"; exit 1; }
# synth's default serving description, as a file.
cat >"$work/serving.toml" <<'TOML'
[serving]
scheme = "fp8_e4m3_block128"
quantize = ["model.layers.*.weight"]
not_converted = ["*norm.weight", "*.mlp.gate.weight"]
TOML
mkdir -p "$work/run" "$work/twins"
# The twins live apart from the BF16 steps the publish reads.
for k in 0 1 2 3 4 5; do mv "$work/steps/step$k-fp8" "$work/twins/step$k"; done
for n in a1 a2 a3; do
  cp -r "$work/twins/step0" "$work/run/$n"
  run_agent "$n"
done
version() { "$dc" manifest "$1" --json | jq -r .version; }

publish() {  # FROM TO MODE
  "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step$1" --new "$work/steps/step$2" \
    --serving "$work/serving.toml" --mode "$3" --json --no-progress --state-dir "$work/run/source" \
    >"$work/run/publish$2.json" 2>>"$work/run/publish.log"
  local rc=$?
  check "publish --serving step$1 -> step$2 ($3) exited $rc" test "$rc" -eq 0
  same_as_twin "$2" "$3"
}
same_as_twin() {  # STEP WHAT
  check "step$1 ($2) did not commit on all 3 nodes" \
    json_holds "$work/run/publish$1.json" '.committed and .nodes_decided == 3'
  local twin
  twin=$(version "$work/twins/step$1")
  check "the FP8 version of step$1 ($2) is not the twin's ($twin)" \
    json_holds "$work/run/publish$1.json" ".target_version == \"$twin\""
  sums "$work/twins/step$1" >"$work/run/want$1.sums"
  for n in a1 a2 a3; do
    sums "$work/run/$n" >"$work/run/$n.$1.sums"
    check "$n is not byte-identical to step$1's twin after $2 ($(diff "$work/run/want$1.sums" "$work/run/$n.$1.sums" | head -2 | tr '\n' ' '))" \
      cmp "$work/run/want$1.sums" "$work/run/$n.$1.sums"
  done
}
publish 0 1 fast
publish 1 2 context
for k in 1 2; do
  bf16=$(version "$work/steps/step$k")
  check "the report does not name BF16 step$k ($bf16)" \
    json_holds "$work/run/publish$k.json" ".bf16_target_version == \"$bf16\""
done
for n in a1 a2 a3; do check "$n's audit" "$dc" audit "$work/run/$n"; done

# Refused before anything is sent: norms listed as FP8 (1-D), naming the tensor.
cat >"$work/bad.toml" <<'TOML'
[serving]
scheme = "fp8_e4m3_block128"
quantize = ["model.layers.*.weight"]
TOML
"$dc" publish --config "$work/cluster.toml" --base "$work/steps/step1" --new "$work/steps/step2" \
  --serving "$work/bad.toml" --no-progress --state-dir "$work/run/source" >/dev/null \
  2>"$work/run/bad.log"
rc=$?
check "publish with a 1-D tensor to quantize exited $rc" test "$rc" -ne 0
check "the refusal does not name the norm tensor: $(head -c 300 "$work/run/bad.log")" \
  grep -q "model\.layers\.[0-9]*\.[a-z_]*norm\.weight" "$work/run/bad.log"
for n in a1 a2 a3; do
  sums "$work/run/$n" >"$work/run/$n.after.sums"
  check "$n changed after the refused publish" cmp "$work/run/want2.sums" "$work/run/$n.after.sums"
done

# From producers: step 2 -> 3 with no base given (the producers hash their FP8
# base pieces), 3 -> 4 with the receivers' twin as --base, in context mode.
produce() {  # FROM TO MODE [BASE_TWIN]
  local extra=()
  [[ -n ${4:-} ]] && extra=(--base "$4")
  "$dc" publish --config "$work/cluster.toml" --base-shards "$work/steps/step$1.shards" \
    --new-shards "$work/steps/step$2.shards" --serving "$work/serving.toml" --mode "$3" \
    --threads 2 --json --no-progress --state-dir "$work/run/source" "${extra[@]}" \
    >"$work/run/publish$2.json" 2>>"$work/run/publish.log"
  local rc=$?
  check "producers step$1 -> step$2 ($3) exited $rc" test "$rc" -eq 0
  same_as_twin "$2" "producers, $3"
  check "step$2: no block split across producers, or no exchange reported" \
    json_holds "$work/run/publish$2.json" \
    '.fp8_exchange.split_blocks > 0 and .fp8_exchange.producers == 4 and .fp8_exchange.exchange_bytes > 0'
  check "step$2: the amax exchange moved more than gathering the split blocks would" \
    json_holds "$work/run/publish$2.json" '.fp8_exchange.exchange_bytes < .fp8_exchange.gather_bytes'
  check "step$2: producers report no split blocks" \
    json_holds "$work/run/publish$2.json" '[.producers[].fp8.split_blocks] | add > 0'
}
produce 2 3 fast
produce 3 4 context "$work/twins/step3"
# Step 4 -> 5 from four `deltacast produce --serving` processes and a root waiting
# for them (`publish --producers 4`).
"$dc" publish --config "$work/cluster.toml" --producers 4 --listen-producers "127.0.0.1:$((port_base + 5))" \
  --state-dir "$work/run/source" --json --no-progress >"$work/run/publish5.json" \
  2>>"$work/run/publish.log" &
root=$!
producers=()
for r in 0 1 2 3; do
  stem=$(printf 'rank-%05d' "$r")
  "$dc" produce --config "$work/cluster.toml" --rank "$r" --layout "$work/steps/step5.shards/$stem.toml" \
    --base "$work/steps/step4.shards/$stem.safetensors" --new "$work/steps/step5.shards/$stem.safetensors" \
    --root "127.0.0.1:$((port_base + 5))" --serving "$work/serving.toml" --threads 1 --json \
    >"$work/run/produce5.$stem.json" 2>>"$work/run/produce.log" &
  producers+=($!)
done
wait "$root"
rc=$?
check "the root of produce --serving processes exited $rc" test "$rc" -eq 0
for p in "${producers[@]}"; do wait "$p" 2>/dev/null; done
same_as_twin 5 "produce processes"
check "rank 1's produce report has no FP8 figures" \
  json_holds "$work/run/produce5.rank-00001.json" '.committed and .fp8.quantized_bf16_bytes > 0'
for n in a1 a2 a3; do check "$n's audit after the producers" "$dc" audit "$work/run/$n"; done

if ((${#failures[@]} == 0)); then
  echo "fp8_publish: producers: $(jq -c .fp8_exchange "$work/run/publish3.json")"
  echo "fp8_publish: BF16 -> FP8 twin deltas (fast $(jq .delta_bytes "$work/run/publish1.json") B, context $(jq .delta_bytes "$work/run/publish2.json") B) bit-exact on 3 nodes"
  echo "fp8_publish: 1 passed, 0 failed"
else
  printf 'fp8_publish: FAIL: %s\n' "${failures[@]}"
  tail -n 5 "$work/run/publish.log" "$work/run/a1.log"
  exit 1
fi
