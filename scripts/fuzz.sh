#!/usr/bin/env bash
# Runs every libFuzzer harness of the fuzz build on its checked-in corpus (fuzz/corpus/<name>/).
#   scripts/fuzz.sh FUZZ_BUILD SECONDS [NAME...]
# Each harness first replays every corpus file (a crash ever found stays fixed), then fuzzes for
# SECONDS. New interesting inputs go to FUZZ_BUILD/corpus-new/<name>/ (the checked-in corpus is
# only read: copy a finding into fuzz/corpus/<name>/ by hand once it is fixed), crashes to
# FUZZ_BUILD/artifacts/<name>/. Exits non-zero when any harness finds a crash, leak or timeout.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: scripts/fuzz.sh FUZZ_BUILD SECONDS [NAME...]}
secs=${2:?usage: scripts/fuzz.sh FUZZ_BUILD SECONDS [NAME...]}
shift 2
names=("$@")
if [[ ${#names[@]} -eq 0 ]]; then
  for d in "$here"/fuzz/corpus/*/; do names+=("$(basename "$d")"); done
fi
passed=0 failed=0
for name in "${names[@]}"; do
  bin="$build/fuzz/fuzz_$name"
  corpus="$here/fuzz/corpus/$name"
  if [[ ! -x "$bin" ]]; then
    echo "fuzz $name: no harness at $bin (fuzz/corpus/$name has no fuzz_$name.cpp?)" >&2
    failed=$((failed + 1)); continue
  fi
  new="$build/corpus-new/$name" art="$build/artifacts/$name"
  mkdir -p "$new" "$art"
  args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024
        -max_len=65536 -print_final_stats=1 -artifact_prefix="$art/")
  [[ -f "$here/fuzz/$name.dict" ]] && args+=(-dict="$here/fuzz/$name.dict")
  log="$build/fuzz-$name.log"
  if "$bin" "${args[@]}" "$new" "$corpus" >"$log" 2>&1; then
    runs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
    echo "fuzz $name: ok, ${runs:-?} executions in ${secs}s (corpus $(ls "$corpus" | wc -l) files)"
    passed=$((passed + 1))
  else
    echo "fuzz $name: FAILED (log $log, artifacts in $art)" >&2
    grep -E 'ERROR|SUMMARY|Test unit written|==[0-9]+==' "$log" | head -20 >&2
    failed=$((failed + 1))
  fi
done
echo "fuzz: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
