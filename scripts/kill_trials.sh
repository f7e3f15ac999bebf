#!/usr/bin/env bash
# Kill trials for attn-translate train: N runs killed at a random time (during updates, saves and
# pruning alike) and resumed, each compared with one uninterrupted run of the same command.
#   SIGKILL: the resumed run must succeed, its final checkpoint and model.safetensors must be
#            bit-identical to the uninterrupted run's, at most one checkpoint interval of updates
#            may be lost, and no temporary file may be left once it has resumed.
#   SIGTERM: the same, the run must exit 143, and no update may be lost.
# The data is made here (a toy lexicon with reversed word order, as the tests use), no download.
# Usage: [TRIALS=20] [STEPS=40] [EVERY=5] bash scripts/kill_trials.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
case $build in /*) ;; *) build=$PWD/$build ;; esac
bin=$build/examples/translate/attn-translate
trials=${TRIALS:-20}
steps=${STEPS:-40}
every=${EVERY:-5}
[ -x "$bin" ] || { echo "build $bin first (cmake --build $build --target attn-translate)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/attn_kill_trials.XXXXXX")
trap 'rm -rf "$work"' EXIT

# 400 sentence pairs: target words are fixed translations of the source words, in reverse order.
awk 'BEGIN { srand(7);
  split("red blue green cat dog house big small runs sleeps the a", s, " ");
  split("rot blau gruen Katze Hund Haus gross klein laeuft schlaeft der ein", t, " ");
  for (i = 0; i < 400; i++) { n = 2 + int(rand() * 4); src = ""; tgt = "";
    for (k = 0; k < n; k++) { w[k] = 1 + int(rand() * 12) }
    for (k = 0; k < n; k++) { src = src (k ? " " : "") s[w[k]]; tgt = tgt (k ? " " : "") t[w[n-1-k]] }
    print src > "'"$work"'/train.en"; print tgt > "'"$work"'/train.de" } }'

args=(train --threads 1 --src "$work/train.en" --tgt "$work/train.de" --preset tiny --dropout 0.1
      --vocab-size 60 --max-tokens 128 --max-len 32 --valid-every 0 --svg 0 --log-every 1
      --keep 2 --steps "$steps" --checkpoint-every "$every")

t0=$(date +%s%N)
nice -n 19 "$bin" "${args[@]}" --model-dir "$work/ref" >/dev/null 2>"$work/ref.log"
ref_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "uninterrupted run: $steps updates in ${ref_ms} ms"

last_logged() { grep -o '^step [0-9]*' "$1" | tail -1 | cut -d' ' -f2 || true; }
newest_checkpoint() {
  ls "$1" 2>/dev/null | sed -n 's/^checkpoint_\([0-9]*\)\.safetensors$/\1/p' | sort -n | tail -1
}

run_trials() {
  local signal=$1 max_lost=$2
  local ok=0 identical=0 within=0 clean=0 restarted=0 worst=0 expected_rc=$((128 + $(kill -l "$signal")))
  for i in $(seq 1 "$trials"); do
    local dir=$work/$signal.$i
    nice -n 19 "$bin" "${args[@]}" --model-dir "$dir" >/dev/null 2>"$dir.log" &
    local pid=$!
    sleep "$(awk -v s="$RANDOM" -v ms="$ref_ms" 'BEGIN { srand(s); printf "%.3f", rand() * ms / 1000 }')"
    kill -s "$signal" "$pid" 2>/dev/null || true
    local rc=0
    { wait "$pid"; } 2>/dev/null || rc=$?
    local done_step ckpt lost
    done_step=$(last_logged "$dir.log"); done_step=${done_step:-0}
    ckpt=$(newest_checkpoint "$dir"); ckpt=${ckpt:-0}
    lost=$((done_step - ckpt))
    [ "$rc" -eq 0 ] && lost=0  # finished before the signal
    [ "$lost" -gt "$worst" ] && worst=$lost
    [ "$lost" -le "$max_lost" ] && within=$((within + 1))
    if [ "$signal" = TERM ] && [ "$rc" -ne 0 ] && [ "$rc" -ne "$expected_rc" ]; then
      echo "trial $i: SIGTERM exit code $rc, expected $expected_rc" >&2
    fi
    # Resume; a run killed before its first checkpoint is started again instead.
    local resume=(--resume)
    [ -n "$(newest_checkpoint "$dir")" ] || { resume=(); restarted=$((restarted + 1)); }
    if nice -n 19 "$bin" "${args[@]}" "${resume[@]}" --model-dir "$dir" >/dev/null 2>>"$dir.log"; then
      ok=$((ok + 1))
      if cmp -s "$dir/checkpoint_$steps.safetensors" "$work/ref/checkpoint_$steps.safetensors" &&
         cmp -s "$dir/model.safetensors" "$work/ref/model.safetensors"; then
        identical=$((identical + 1))
      else
        echo "trial $i: final model differs from the uninterrupted run" >&2
      fi
    else
      echo "trial $i: resume failed: $(tail -1 "$dir.log")" >&2
    fi
    if [ -z "$(find "$dir" -name '*.tmp.*')" ]; then clean=$((clean + 1)); else
      echo "trial $i: temporary files left: $(find "$dir" -name '*.tmp.*')" >&2
    fi
    rm -rf "$dir" "$dir.log"
  done
  echo "SIG$signal: $trials trials: $ok resumed ($restarted of them killed before the first" \
       "checkpoint and restarted), $identical bit-identical, $within lost <= $max_lost updates" \
       "(worst $worst), $clean without temporary files"
  [ "$ok" -eq "$trials" ] && [ "$identical" -eq "$trials" ] && [ "$within" -eq "$trials" ] &&
    [ "$clean" -eq "$trials" ]
}

status=0
run_trials KILL "$every" || status=1
run_trials TERM 0 || status=1
exit $status
