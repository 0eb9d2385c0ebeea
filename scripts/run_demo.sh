#!/usr/bin/env bash
# End-to-end demo: train digits.TinyConvPipeline (a tiny conv net as a TensorPipeLayer with K = 4 partitions
# on 4 logical CPU devices, M = 8 micro-batches) on the scikit-learn handwritten digits through Lingvo's
# trainer (sync mode: controller + trainer), then run the evaler on the final checkpoint and print the
# held-out accuracy.
#
#   bash scripts/run_demo.sh [LOGDIR]      (default: a new directory under ${TMPDIR:-/tmp})
#
# Full logs go to LOGDIR/train.log and LOGDIR/eval.log; the terminal shows a digest (every 100th step).
# Running it again with the same LOGDIR resumes from the last checkpoint (or just re-reports if done).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=.venv/bin/python
MODEL=digits.TinyConvPipeline
K=4
LOGDIR=${1:-$(mktemp -d "${TMPDIR:-/tmp}/tensorpipe-digits.XXXXXX")}
mkdir -p "$LOGDIR"
LOGDIR=$(cd "$LOGDIR" && pwd)
COMMON=(--model="$MODEL" --cpu_devices="$K" --worker_split_size="$K" --mode=sync --run_locally=cpu
        --logdir="$LOGDIR")

# Keeps the TensorPipe lines, checkpoint saves and every 100th training step of Lingvo's log.
digest() {
  awk '
    /TensorPipe: / { sub(/.*TensorPipe: /, "  "); print; fflush(); next }
    /Save checkpoint done: / { sub(/.*Save checkpoint done: /, "  checkpoint saved: "); print; fflush(); next }
    /error: / && /tensorpipe.trainer.train/ { print; fflush(); next }
    /runners.py.*\] step: *[0-9]+,/ {
      if (match($0, /step: *[0-9]+/)) { s = substr($0, RSTART, RLENGTH); gsub(/[^0-9]/, "", s) }
      if (s % 100 != 0) next
      line = sprintf("  step %5d", s)
      n = split("loss accuracy examples/sec", keys, " ")
      for (i = 1; i <= n; i++) {
        if (match($0, "[ ,]" keys[i] ": ?[0-9.e+-]+")) {
          kv = substr($0, RSTART + 1, RLENGTH - 1); sub(/: ?/, " ", kv); line = line "  " kv
        }
      }
      print line; fflush()
    }'
}

start=$(date +%s)
echo "== Training $MODEL (K=$K partitions on $K logical CPU devices) -> $LOGDIR  [log: $LOGDIR/train.log]"
"$PY" -m tensorpipe.trainer.train "${COMMON[@]}" 2>&1 | tee "$LOGDIR/train.log" | digest
trained=$(date +%s)

echo "== Evaluating the final checkpoint on the held-out split  [log: $LOGDIR/eval.log]"
"$PY" -m tensorpipe.trainer.train "${COMMON[@]}" --job=evaler_test 2>&1 | tee "$LOGDIR/eval.log" | digest
done_at=$(date +%s)

score=$(ls "$LOGDIR"/eval_test/score-*.txt 2>/dev/null | sort | tail -n 1 || true)
if [ -z "$score" ]; then
  echo "No eval score was written under $LOGDIR/eval_test; see $LOGDIR/eval.log" >&2
  exit 1
fi
step=$(basename "$score" .txt | sed 's/^score-0*//')
accuracy=$(awk -F': *' '$1 == "accuracy" { print $2 }' "$score")
samples=$(awk -F': *' '$1 == "total_samples" { print $2 }' "$score")
echo
echo "Final held-out accuracy: $accuracy  ($samples test images, checkpoint at step ${step:-0})"
echo "Time: training $((trained - start)) s, evaluation $((done_at - trained)) s"
echo "Logdir: $LOGDIR"
echo "TensorBoard: tensorboard --logdir=$LOGDIR    (installed at $(pwd)/.venv/bin/tensorboard)"
