#!/bin/sh
# train_blas.sh ZCKPT_TRAIN: the OpenBLAS matmuls train as the engine's own loops do. The same
# ZeRO-3 run (2 rank threads, fp32) with OpenBLAS and with ZCKPT_TRAIN_NO_BLAS=1: the header
# names the path that ran, and every step's loss and grad_norm, and the final eval_loss, agree
# within fp32 tolerance (relative 1e-4: only the order of the sums differs). Exit 77 when the
# build has no OpenBLAS.
set -eu
train=$1
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
run() {
  env "$@" "$train" --ranks 2 --zero-stage 3 --n-layer 2 --n-embd 64 --n-head 4 --n-positions 32 \
    --per-device-train-batch-size 4 --max-steps 12 --logging-steps 1 --eval-samples 4 2>&1 >/dev/null
}
run ZCKPT_TRAIN_NO_BLAS=0 >"$T/blas"
run ZCKPT_TRAIN_NO_BLAS=1 >"$T/loops"
if grep -q "matmuls: loops" "$T/blas"; then echo "SKIP: built without OpenBLAS"; exit 77; fi
grep -q "matmuls: OpenBLAS" "$T/blas" || { echo "FAIL: the OpenBLAS run does not say so"; cat "$T/blas"; exit 1; }
grep -q "matmuls: loops" "$T/loops" || { echo "FAIL: ZCKPT_TRAIN_NO_BLAS=1 did not pick the loops"; exit 1; }
# "step 3/12 | loss X | grad_norm Y | ..." and "final eval_loss Z": the numbers side by side
nums() { sed -n 's/^step \([0-9]*\)\/[0-9]* | loss \([0-9.]*\) | grad_norm \([0-9.]*\) .*/\2 \3/p; s/^final eval_loss \([0-9.]*\)$/\1 \1/p' "$1"; }
nums "$T/blas" >"$T/a"; nums "$T/loops" >"$T/b"
[ "$(wc -l <"$T/a")" -eq 13 ] && [ "$(wc -l <"$T/b")" -eq 13 ] || { echo "FAIL: missing progress lines"; cat "$T/blas"; exit 1; }
paste "$T/a" "$T/b" | awk '
  function bad(x, y) { d = x - y; if (d < 0) d = -d; return d > 1e-4 * (y < 0 ? -y : y) + 1e-6 }
  { if (bad($1, $3) || bad($2, $4)) { printf "FAIL: line %d: OpenBLAS %s %s, loops %s %s\n", NR, $1, $2, $3, $4; f = 1 } }
  END { exit f }'
echo "ok: 12 steps and the eval agree ($(tail -1 "$T/a"))"
