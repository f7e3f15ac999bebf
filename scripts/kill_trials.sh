#!/usr/bin/env bash
# Kill trials for attn-translate train (issue 10): N runs on the built-in corpus (the default data
# of `train`, no --src), each stopped by a signal and resumed, and compared with one uninterrupted
# run of the same command.
#   SIGKILL: the run must exit 137 (or 0 if it had finished), the resumed run must succeed, its
#            final checkpoint and model.safetensors must be bit-identical to the uninterrupted
#            run's, at most one checkpoint interval of updates may be lost, and no temporary file
#            may be left once it has resumed.
#   SIGTERM: the same, and the run must exit 143 with its last update checkpointed (0 updates
#            lost), or 0 if it had already finished, or 143 by the signal itself once its last
#            update is done (final averaging and writing: since session 41 a signal then ends the
#            run at once). Any other exit code is a failure.
#            A SIGTERM that lands before the handler is installed (while the corpus is read) ends
#            the run by the default action, exit 143 with nothing written: such trials are counted
#            apart, not as handled ones.
# Where the signal lands: trial i waits for one of four moments, in turn:
#   save    a checkpoint's temporary file appears (the write is under way);
#   prune   a checkpoint's temporary file is renamed in (the directory fsync and the removal of
#           the checkpoints beyond --keep follow: with --keep 1 every checkpoint after the first prunes one);
#   update  a random time within the updates, once the first progress line is out;
#   start   a random time within the whole run, corpus reading and vocabulary training included.
# The run is frozen (SIGSTOP) at that moment, the phase it is in read from its directory and log
# (a temporary file: save; more than --keep checkpoints: prune; no progress line yet: startup;
# exit code 0: finished; else update), and then it is sent the signal (and SIGCONT). The counts
# of the phases the signals landed in are reported per signal.
# A small model and few steps keep a trial to a few seconds, most of them reading the corpus.
# The runs average their last AVERAGE checkpoints into model.safetensors (session 41: a signal's
# checkpoint took an older one's place in the average), so KEEP must be at least AVERAGE.
# Usage: [TRIALS=20] [STEPS=40] [EVERY=2] [KEEP=2] [AVERAGE=2] bash scripts/kill_trials.sh [build-dir]
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."
build=${1:-build}
case $build in /*) ;; *) build=$PWD/$build ;; esac
bin=$build/examples/translate/attn-translate
trials=${TRIALS:-20}
steps=${STEPS:-40}
every=${EVERY:-2}
keep=${KEEP:-2}
average=${AVERAGE:-2}
[ -x "$bin" ] || { echo "build $bin first (cmake --build $build --target attn-translate)" >&2; exit 2; }
renice -n 19 -p $$ >/dev/null 2>&1 || true  # the trainers and the polling loops inherit it
work=$(mktemp -d "${TMPDIR:-/tmp}/attn_kill_trials.XXXXXX")
trap 'rm -rf "$work"' EXIT

args=(train --threads 1 --preset tiny --d-model 32 --d-ff 64 --dropout 0.1 --vocab-size 200
      --max-tokens 256 --max-len 32 --no-eval --svg 0 --log-every 1 --keep "$keep"
      --average "$average" --steps "$steps" --checkpoint-every "$every")
kinds=(save prune update start)

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
random_seconds() { awk -v s="$RANDOM" -v ms="$1" 'BEGIN { srand(s); printf "%.3f", rand() * ms / 1000 }'; }
has_progress() { grep -q '^step ' "$1" 2>/dev/null; }
# Globs only, no fork: these are polled in busy loops. $2: the step of the checkpoint (any).
saving() { local t=("$1"/checkpoint_${2:-*}.safetensors.attn-tmp.*); (( ${#t[@]} > 0 )); }
pruning() {
  local c=("$1"/checkpoint_*.safetensors) n=("$1"/checkpoint_${2:-*}.safetensors)
  (( ${#c[@]} > keep && ${#n[@]} > 0 ))
}
running() { kill -0 "$1" 2>/dev/null; }
last_logged() { grep -o '^step [0-9]*' "$1" | tail -1 | cut -d' ' -f2 || true; }
newest_checkpoint() {
  ls "$1" 2>/dev/null | sed -n 's/^checkpoint_\([0-9]*\)\.safetensors$/\1/p' | sort -n | tail -1
}

# The uninterrupted run: its duration, and that of its updates (first progress line to exit).
reference_run() {
  "$bin" "${args[@]}" --model-dir "$work/ref" >/dev/null 2>"$work/ref.log" &
  local pid=$! t0 t1
  t0=$(now_ms)
  until has_progress "$work/ref.log" || ! running "$pid"; do sleep 0.005; done
  t1=$(now_ms)
  wait "$pid" || { echo "the uninterrupted run failed: $(tail -1 "$work/ref.log")" >&2; exit 1; }
  ref_ms=$(( $(now_ms) - t0 ))
  train_ms=$(( $(now_ms) - t1 ))
  echo "uninterrupted run: $steps updates in ${ref_ms} ms, ${train_ms} ms of them after the first" \
       "progress line (built-in corpus, checkpoint every $every, --keep $keep, --average $average)"
}

# Waits for the moment `kind` of the run `pid` writing `dir` and `log`, or for its end. Saves and
# pruning are caught at a checkpoint chosen at random.
wait_for() {
  local kind=$1 pid=$2 dir=$3 log=$4 at
  at=$(( (RANDOM % (steps / every) + 1) * every ))
  case $kind in
    save) until saving "$dir" "$at" || ! running "$pid"; do :; done ;;
    prune)
      # The pruning takes some 40 us after a write of milliseconds: once the temporary is there,
      # the run goes on in slices of microseconds (SIGCONT, SIGSTOP) until it is renamed in.
      until saving "$dir" "$at" || ! running "$pid"; do :; done
      kill -s STOP "$pid" 2>/dev/null || true
      while saving "$dir" "$at" && running "$pid"; do
        kill -s CONT "$pid" 2>/dev/null || true
        kill -s STOP "$pid" 2>/dev/null || true
      done ;;
    update)
      until has_progress "$log" || ! running "$pid"; do sleep 0.002; done
      sleep "$(random_seconds "$train_ms")" ;;
    start) sleep "$(random_seconds "$ref_ms")" ;;
  esac
}

# Sets `phase` from what `dir` and `log` show (the run frozen; see the top).
read_phase() {
  if saving "$1"; then phase=save
  elif pruning "$1"; then phase=prune
  elif ! has_progress "$2"; then phase=startup
  else phase=update; fi
}

# Checks the exit code `rc` of trial `i` under `signal`; sets `lost_limit` (the updates it may
# lose) and counts finished, early and bad exits.
check_exit() {
  local signal=$1 i=$2 rc=$3 log=$4
  if [ "$rc" -eq 0 ]; then finished=$((finished + 1)); phase=finished; return; fi
  if [ "$signal" = KILL ]; then
    [ "$rc" -eq 137 ] || { bad=$((bad + 1)); echo "trial $i: SIGKILL exit code $rc, expected 137" >&2; }
    return
  fi
  lost_limit=0
  if [ "$rc" -eq 143 ] && grep -q 'interrupted by SIGTERM' "$log"; then
    handled=$((handled + 1))
  elif [ "$rc" -eq 143 ] && ! has_progress "$log"; then
    early=$((early + 1))  # the default action: nothing was trained, nothing written
  elif [ "$rc" -eq 143 ] && [ "$(last_logged "$log")" = "$steps" ]; then
    after_last=$((after_last + 1))  # the default action once the last update is done
  else
    bad=$((bad + 1))
    echo "trial $i: SIGTERM exit code $rc, expected 143 with a checkpoint or 0: $(tail -1 "$log")" >&2
  fi
}

# Resumes the run in `dir` (or starts it again if it has no checkpoint) and compares the result.
resume_and_compare() {
  local i=$1 dir=$2 log=$3 resume=(--resume)
  [ -n "$(newest_checkpoint "$dir")" ] || { resume=(); restarted=$((restarted + 1)); }
  if "$bin" "${args[@]}" "${resume[@]}" --model-dir "$dir" >/dev/null 2>>"$log"; then
    ok=$((ok + 1))
    if cmp -s "$dir/checkpoint_$steps.safetensors" "$work/ref/checkpoint_$steps.safetensors" &&
       cmp -s "$dir/model.safetensors" "$work/ref/model.safetensors"; then
      identical=$((identical + 1))
    else
      echo "trial $i: final model differs from the uninterrupted run" >&2
    fi
  else
    echo "trial $i: resume failed: $(tail -1 "$log")" >&2
  fi
  local left=("$dir"/*.attn-tmp.*)
  if [ ${#left[@]} -eq 0 ]; then clean=$((clean + 1)); else
    echo "trial $i: temporary files left: ${left[*]}" >&2
  fi
}

run_trial() {
  local signal=$1 i=$2 dir=$work/$1.$2 log=$work/$1.$2.log
  "$bin" "${args[@]}" --model-dir "$dir" >/dev/null 2>"$log" &
  local pid=$! rc=0
  wait_for "${kinds[$(( (i - 1) % ${#kinds[@]} ))]}" "$pid" "$dir" "$log"
  # Frozen by SIGSTOP while the phase is read, so the phase is the one the signal lands in; a
  # SIGTERM is handled once SIGCONT lets the run go on.
  kill -s STOP "$pid" 2>/dev/null || true
  read_phase "$dir" "$log"
  kill -s "$signal" "$pid" 2>/dev/null || true
  kill -s CONT "$pid" 2>/dev/null || true
  { wait "$pid"; } 2>/dev/null || rc=$?
  lost_limit=$every
  check_exit "$signal" "$i" "$rc" "$log"
  landed[$phase]=$(( ${landed[$phase]:-0} + 1 ))
  local done_step ckpt lost
  done_step=$(last_logged "$log"); done_step=${done_step:-0}
  ckpt=$(newest_checkpoint "$dir"); ckpt=${ckpt:-0}
  lost=$((done_step - ckpt))
  [ "$rc" -eq 0 ] && lost=0
  [ "$lost" -gt "$worst" ] && worst=$lost
  if [ "$lost" -le "$lost_limit" ]; then within=$((within + 1)); else
    echo "trial $i: $lost updates lost (step $done_step logged, checkpoint $ckpt)" >&2
  fi
  resume_and_compare "$i" "$dir" "$log"
  rm -rf "$dir" "$log"
}

run_trials() {
  local signal=$1
  ok=0 identical=0 within=0 clean=0 restarted=0 worst=0 finished=0 handled=0 early=0 bad=0
  after_last=0
  declare -gA landed=()
  for i in $(seq 1 "$trials"); do run_trial "$signal" "$i"; done
  local max_lost=$every phases="" p
  [ "$signal" = TERM ] && max_lost=0
  for p in startup update save prune finished; do phases+=" $p ${landed[$p]:-0},"; done
  echo "SIG$signal: $trials trials: $ok resumed ($restarted of them had no checkpoint and were" \
       "started again), $identical bit-identical, $within lost <= $max_lost updates (worst" \
       "$worst), $clean without temporary files; landed in:${phases%,}"
  if [ "$signal" = TERM ]; then
    echo "  exit codes: 143 with the last update checkpointed $handled, 0 (run finished)" \
         "$finished, 143 before the handler was installed (nothing trained or written) $early," \
         "143 after the last update $after_last, other $bad"
  elif [ "$bad" -gt 0 ]; then
    echo "  exit codes other than 137 or 0: $bad"
  fi
  [ "$ok" -eq "$trials" ] && [ "$identical" -eq "$trials" ] && [ "$within" -eq "$trials" ] &&
    [ "$clean" -eq "$trials" ] && [ "$bad" -eq 0 ]
}

reference_run
status=0
run_trials KILL || status=1
run_trials TERM || status=1
exit $status
