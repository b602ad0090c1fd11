#!/usr/bin/env bash
# What a person and a machine see: with stderr on a terminal (a pseudo-terminal
# here), synth, diff and a checkpoint publish draw a progress bar there; with --json
# stdout is exactly one JSON document and the terminal gets no bar; with stderr not
# a terminal there is no bar either. `deltacast config --explain` prints a config
# that parses back (TOML and JSON), and a wrong key still fails with FILE:LINE.
# Usage: cli_output_test.sh DELTACAST_BINARY
set -uo pipefail
dc=$1
source "$(dirname "$0")/lib.sh"
start_work cli-output
export DELTACAST_TOKEN=cli-$RANDOM
base=$((25400 + (RANDOM % 100) * 8))
failures=()
check() { "${@:2}" >/dev/null 2>&1 || failures+=("$1"); }

# tty_run NAME CMD...: runs CMD with stderr on a pseudo-terminal and stdout on a
# pipe; $work/NAME.out gets stdout, $work/NAME.tty what reached the terminal.
cat >"$work/tty_run.py" <<'PY'
import os, pty, select, subprocess, sys
name, cmd = sys.argv[1], sys.argv[2:]
master, slave = pty.openpty()
with open(name + ".out", "wb") as out:
    p = subprocess.Popen(cmd, stdout=out, stderr=slave)
os.close(slave)
seen = b""
while True:
    ready, _, _ = select.select([master], [], [], 0.1)
    if ready:
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed its end
            break
        if not data:
            break
        seen += data
    elif p.poll() is not None:
        break
open(name + ".tty", "wb").write(seen)
sys.exit(p.wait())
PY
tty_run() { python3 "$work/tty_run.py" "$work/$1" "${@:2}"; }
has_bar() { grep -aq $'\r'"$2 .*100%" "$work/$1.tty"; }
# A bar redraws with "\r"; a terminal's own line ends are "\r\n".
no_bar() { ! grep -aqP '\r.' "$work/$1.tty"; }

check "synth failed" tty_run synth "$dc" synth --out "$work/steps" --params 8M --steps 2 --threads 2
check "synth drew no bar on the terminal" has_bar synth synth
check "synth's report is not on stdout" grep -q "synthesized" "$work/synth.out"
check "synth --json failed" tty_run synth_json "$dc" synth --out "$work/steps2" --params 8M \
  --steps 1 --threads 2 --json
check "synth --json drew on the terminal" test ! -s "$work/synth_json.tty"
check "synth --json stdout is not one JSON document" jq -e .params "$work/synth_json.out"

check "diff failed" tty_run diff "$dc" diff --base "$work/steps/step0" --new "$work/steps/step1" \
  --out "$work/d1"
check "diff drew no bar" has_bar diff encode
check "diff --json failed" tty_run diff_json "$dc" diff --base "$work/steps/step0" \
  --new "$work/steps/step1" --out "$work/d1" --json
check "diff --json drew on the terminal" test ! -s "$work/diff_json.tty"
check "diff --json stdout is not one JSON document" jq -e .encode_gbps "$work/diff_json.out"
"$dc" diff --base "$work/steps/step0" --new "$work/steps/step1" --out "$work/d1" \
  >/dev/null 2>"$work/diff_pipe.tty"
check "diff drew a bar on a stderr that is not a terminal" no_bar diff_pipe

# A checkpoint publish to one agent.
printf '[cluster]\nname = "cli"\n[[node]]\nid = "trainer"\nhost = "127.0.0.1"\nport = %d\nrole = "source"\n[[node]]\nid = "a1"\nhost = "127.0.0.1"\nport = %d\n' \
  "$base" $((base + 1)) >"$work/cluster.toml"
mkdir -p "$work/run"
cp -r "$work/steps/step0" "$work/run/a1"
"$dc" agent --config "$work/cluster.toml" --node a1 --store "$work/run/a1" --threads 1 \
  >>"$work/run/a1.log" 2>&1 &
pids+=($!)
check "publish failed" tty_run publish "$dc" publish --config "$work/cluster.toml" \
  --base "$work/steps/step0" --new "$work/steps/step1" --state-dir "$work/run/source"
check "publish drew no bar" has_bar publish publish
check "publish --json failed" tty_run publish_json "$dc" publish --config "$work/cluster.toml" \
  --base "$work/steps/step1" --new "$work/steps/step2" --state-dir "$work/run/source" --json
check "publish --json drew a bar" no_bar publish_json
check "publish --json stdout is not one JSON document" jq -e .committed "$work/publish_json.out"
check "a1 is not at step 2" "$dc" verify "$work/run/a1" "$work/steps/step2"

# config --explain: TOML that parses back to the same values, and JSON.
check "config --explain failed" bash -c "'$dc' config --explain --config '$work/cluster.toml' >'$work/explained.toml'"
check "explain does not mark defaults" grep -q "window = 8 .*# default" "$work/explained.toml"
check "explain's output does not parse back to itself" bash -c \
  "'$dc' config --explain --config '$work/explained.toml' | grep -v '^#' | sed 's/  *#.*//' >'$work/again' &&
   grep -v '^#' '$work/explained.toml' | sed 's/  *#.*//' | diff - '$work/again'"
check "config --explain --json is not JSON" bash -c \
  "'$dc' config --explain --config '$work/cluster.toml' --json | jq -e '.tree.commit_timeout == \"120s\"'"
check "config --defaults --json is not JSON" bash -c "'$dc' config --defaults --json | jq -e 'length > 40'"
printf '[cluster]\nname = "x"\n[tree]\nwindw = 8\n' >"$work/bad.toml"
"$dc" config --explain --config "$work/bad.toml" >"$work/bad.out" 2>"$work/bad.err"
check "a wrong key did not fail" test $? -eq 1
check "a wrong key's error lacks FILE:LINE" grep -q "bad.toml:4: unknown key \"windw\"" "$work/bad.err"

if ((${#failures[@]} == 0)); then
  echo "cli_output: 1 passed, 0 failed"
else
  printf 'cli_output: FAIL: %s\n' "${failures[@]}"
  exit 1
fi
