#!/usr/bin/env bash
# relay/'s folders form layers: wire < store < tree < {producers, bucket}. A file may
# include relay/ headers only from its own folder or a layer below it; producers and
# bucket do not include each other. Fails naming each include that points the wrong way.
set -euo pipefail
cd "$(dirname "$0")/../.."
declare -A rank=([wire]=0 [store]=1 [tree]=2 [producers]=3 [bucket]=3)
bad=0
for dir in "${!rank[@]}"; do
  [[ -d relay/$dir ]] || { echo "relay/$dir is missing"; exit 1; }
  while IFS=: read -r file line inc; do
    to=$(sed -n 's|.*#include "relay/\([a-z]*\)/.*|\1|p' <<<"$inc")
    [[ -n $to && $to != "$dir" ]] || continue
    if [[ -z ${rank[$to]+x} ]] || ((rank[$to] >= rank[$dir])); then
      echo "$file:$line: relay/$dir includes relay/$to (${inc#*#include }): only lower layers may be used"
      bad=1
    fi
  done < <(grep -rn '#include "relay/' "relay/$dir" || true)
done
if ls relay/*.cc relay/*.h >/dev/null 2>&1; then
  echo "relay/ holds files outside its subsystem folders:" relay/*.cc relay/*.h
  bad=1
fi
((bad == 0)) && echo "relay/ layering holds"
exit $bad
