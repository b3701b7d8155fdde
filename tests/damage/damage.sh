#!/bin/sh
# damage.sh [--full] [--strict] [--jobs N] ZCKPT ZCKPT_TRAIN ZCK_DAMAGE
#
# The damage campaign: every damage class x ZeRO stage 1/2/3 x with and without
# zckpt-manifest.json x checkpoint source, every job run on the damaged copy and on the intact
# one. Sources: "ds" (real DeepSpeed 0.19.8 checkpoints from tests/fixtures/deepspeed),
# "train" (written here by zckpt-train, saving at steps 1 and 2) and "reshard" (written here
# by `zckpt reshard` of a train run of another stage, at world size 3, both steps).
# Jobs: consolidate, reshard (to another stage and world size), to-universal in DeepSpeed's
# layout (--inject-missing-state at stage 1/2) and as HDF5, verify, and zckpt-train
# --resume-from-checkpoint (zckpt-written sources; the DeepSpeed fixtures hold another model).
#
# A damaged copy passes a job when the job exits 1 (verify: 3) with exactly one stderr line
# `zckpt: error: ...` naming the damaged file (verify: a `damaged:` line naming it; resume:
# one `zckpt-train: error:` line naming it and no training step), leaves its output folder
# empty (no OUT, no .*.zck-tmp-*, no latest_universal) and the input untouched. An intact
# copy passes when every job exits 0 with its output in place and nothing else left over.
# Damage is written by zck_damage (one bit inside a named zip record, checked to have
# happened), cp, mv, truncate and rm; every damaged copy is compared with its source.
#
# Prints a table (class x stage x manifest x source -> one column per job), the reason of
# every cell that is not ok, and a summary. Cells listed in known-failures.txt (beside this
# script: "CLASS STAGE MANIFEST SOURCE JOB  reason") are reported as "known" and do not fail
# the run; a listed cell that passes is reported as "fixed" (an error with --strict).
# Exit 0 when no other cell fails.
#
# --full adds more sources (DeepSpeed world sizes 3/4, fp16 and fp32 fixtures; zckpt-train at
# world size 3 and in fp32); it takes several times longer and is not registered in ctest.
# --jobs N runs N cells at a time (default: $ZCK_DAMAGE_JOBS or 2). ZCK_DAMAGE_KEEP=1 keeps
# the work folder (its path is printed).
set -u

FULL=0 STRICT=0 PAR=${ZCK_DAMAGE_JOBS:-2}
while [ $# -gt 0 ]; do
  case $1 in
    --full) FULL=1 ;;
    --strict) STRICT=1 ;;
    --jobs) PAR=$2; shift ;;
    -*) echo "damage.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done

JOBS="consolidate reshard uv-ds uv-h5 verify resume"

# ---- helpers shared by the driver and the cell workers

# sums DIR: one line per entry under DIR (hidden ones too): path, and for files their CRC
sums() {
  (cd "$1" && find . -type d | LC_ALL=C sort && find . -type f -exec cksum {} + | LC_ALL=C sort -k3)
}

# optim R: the rank-R optimizer file of the tag folder $T (bf16_ prefix or not)
optim() {
  for f in "$T"/*zero_pp_rank_$1_mp_rank_00_optim_states.pt; do echo "$f"; return; done
}

model() {
  if [ "$STAGE" = 3 ]; then echo "$T/zero_pp_rank_1_mp_rank_00_model_states.pt"
  else echo "$T/mp_rank_00_model_states.pt"; fi
}

rel() { echo "${1#"$C/ck/"}"; } # a path as named under the checkpoint root

# result JOB LINE: the verdict of one job of the current cell
result() { echo "$2" | sed "s|$C/||g" >"$RES/$ID.$1"; } # paths shown from the cell folder

all_jobs() { for j in $JOBS; do result "$j" "$1"; done; }

# applies CLASS: 0 when CLASS can be made on this source; otherwise NA says why
applies() {
  NA=""
  case $1 in
    valid-recrc|other-run) [ "$MF" = mf ] || NA="a valid file with other values: only a manifest can tell" ;;
  esac
  case $1 in
    old-*) [ -n "$OLDTAG" ] || NA="no earlier checkpoint of this run" ;;
    other-run) [ -d "$SRC/other" ] || NA="no second run of this source" ;;
  esac
  [ -z "$NA" ]
}

# damage CLASS: damages $C/ck in place; sets NAMES (the damaged files, as the root names
# them, separated by '|'); returns 2 when the class does not apply (NA says why), 1 when the
# damage could not be made.
damage() {
  NAMES="" NA=""
  o1=$(optim 1) o0=$(optim 0)
  old=$SRC/old/$OLDTAG
  case $1 in
    intact) return 0 ;;
    crc-fp32|crc-exp_avg|crc-datapkl|crc-16bit|valid-recrc)
      case $1 in
        crc-fp32) f=$o1 w=@fp32 ;;
        crc-exp_avg) f=$o1 w=@exp_avg ;;
        crc-datapkl) f=$o1 w=@data.pkl ;;
        crc-16bit) f=$(model) w=@lp ;;
        valid-recrc) f=$o1 w="--recrc @fp32" ;;
      esac
      # shellcheck disable=SC2086
      "$DAMAGE" flip ${w%@*} "$f" "@${w#*@}" >"$C/damage.log" 2>&1
      case $? in
        0) ;;
        2) NA="no such record in $(basename "$f")"; return 2 ;;
        *) return 1 ;;
      esac
      NAMES=$(rel "$f") ;;
    copy-r0-r1) cp "$o0" "$o1" && NAMES=$(rel "$o1") ;;
    swap-r0-r1) mv "$o0" "$C/tmp.pt" && mv "$o1" "$o0" && mv "$C/tmp.pt" "$o1" && NAMES="$(rel "$o0")|$(rel "$o1")" ;;
    old-rank|old-optim|old-model)
      case $1 in
        old-rank) cp "$old/$(basename "$o1")" "$o1" && NAMES=$(rel "$o1") ;;
        old-model) m=$(model); cp "$old/$(basename "$m")" "$m" && NAMES=$(rel "$m") ;;
        old-optim)
          for f in "$T"/*_optim_states.pt; do
            cp "$old/$(basename "$f")" "$f" || return 1
            NAMES="$NAMES${NAMES:+|}$(rel "$f")"
          done ;;
      esac ;;
    truncated) truncate -s $(($(wc -c <"$o1") / 2)) "$o1" && NAMES=$(rel "$o1") ;;
    missing) rm "$o1" && NAMES=$(rel "$o1") ;;
    other-run)
      cp "$SRC/other/$TAG/$(basename "$o1")" "$o1" && NAMES=$(rel "$o1") ;;
    *) echo "unknown class $1" >"$C/damage.log"; return 1 ;;
  esac
}

# names_in FILE: 0 if a line of FILE names one of $NAMES (its file name, as a whole word: the
# line may lead with another file it found disagreeing, e.g. "X: step 2, but Y says 1")
names_in() {
  echo "$NAMES" | tr "|" "\n" | while read -r n; do
    grep -qE -- "(^|[^A-Za-z0-9_])$(echo "${n##*/}" | sed "s/[.]/[.]/g")(\$|[^A-Za-z0-9_])" "$1" && echo y
  done | grep -q y
}

# check JOB: runs one job on $C/ck and writes its verdict
check() {
  job=$1 O=$C/out-$1
  mkdir "$O"
  case $job in
    consolidate) set -- "$ZCKPT" consolidate "$C/ck" "$O/model"; want=$O/model ;;
    reshard) set -- "$ZCKPT" reshard "$C/ck" "$O/ck" --to-stage "$RSTAGE" --to-world-size "$RWS"; want=$O/ck/latest ;;
    uv-ds)
      set -- "$ZCKPT" to-universal "$C/ck" "$O/universal"
      [ "$STAGE" = 3 ] || set -- "$@" --inject-missing-state
      want=$O/universal ;;
    uv-h5) set -- "$ZCKPT" to-universal "$C/ck" "$O/universal.h5" --format hdf5; want=$O/universal.h5 ;;
    verify) set -- "$ZCKPT" verify "$C/ck"; want="" ;;
    resume)
      [ -n "$RANKS" ] || { result resume "n/a the DeepSpeed fixtures hold a model zckpt-train does not train"; return; }
      set -- "$TRAIN" $SMALL --ranks "$RANKS" --deepspeed "$CONF/ds_zero$STAGE.json" $PREC --max-steps 3 \
        --save-steps 0 --resume-from-checkpoint "$C/ck" --output-dir "$O/run"
      want=$O/run/checkpoint-3 ;;
  esac
  timeout 300 "$@" >"$O.out" 2>"$O.err"
  rc=$?
  changed=$(find "$C/ck" -newermt @1000000000 | head -2 | tr "\n" " ")
  left=$(cd "$O" && ls -A | tr '\n' ' ')
  tmps=$(find "$O" -name '.*zck-tmp*' | head -3 | tr '\n' ' ')
  first=$(head -c 300 "$O.err" | head -1)
  [ -n "$first" ] || first=$(grep -v '^\(result\|checked\|manifest\|note\)' "$O.out" | head -1 | head -c 300)
  if [ -n "$changed" ]; then
    result "$job" "FAIL the input changed: $changed"
  elif [ "$CLASS" = intact ]; then
    if [ $rc -ne 0 ]; then result "$job" "FAIL intact copy: exit $rc: $first"
    elif [ -n "$want" ] && [ ! -e "$want" ]; then result "$job" "FAIL intact copy: exit 0 but no $(basename "$want")"
    elif [ -n "$tmps" ]; then result "$job" "FAIL intact copy: temporaries left: $tmps"
    else result "$job" ok; fi
  else
    case $job in verify) code=3 ;; *) code=1 ;; esac
    case $job in resume) prefix="zckpt-train: error: " ;; *) prefix="zckpt: error: " ;; esac
    grep "^$prefix" "$O.err" >"$O.errlines"
    nerr=$(wc -l <"$O.errlines")
    nall=$(wc -l <"$O.err")
    if [ $rc -eq 0 ]; then result "$job" "FAIL exit 0: the damage was accepted"
    elif [ $rc -eq 124 ]; then result "$job" "FAIL timed out"
    elif [ $rc -gt 128 ]; then result "$job" "FAIL killed by signal $((rc - 128)): $first"
    elif [ $rc -ne $code ]; then result "$job" "FAIL exit $rc (want $code): $first"
    elif [ "$job" = verify ]; then
      grep '^damaged: ' "$O.out" >"$O.errlines"
      if names_in "$O.errlines"; then result "$job" ok
      else result "$job" "FAIL no damaged: line names $(echo "$NAMES" | sed 's/|/ or /g'): $(head -1 "$O.errlines" | head -c 300)"; fi
    elif [ "$job" = resume ] && grep -q '^step ' "$O.err"; then result "$job" "FAIL trained a step: $first"
    elif [ "$job" != resume ] && [ "$nall" -ne 1 ]; then result "$job" "FAIL $nall stderr lines: $first"
    elif [ "$nerr" -ne 1 ]; then result "$job" "FAIL $nerr '$prefix' lines: $first"
    elif ! names_in "$O.errlines"; then
      result "$job" "FAIL the error does not name $(echo "$NAMES" | sed 's/|/ or /g'): $(head -c 300 "$O.errlines")"
    elif [ -n "$left" ]; then result "$job" "FAIL left in the output folder: $left"
    else result "$job" ok; fi
  fi
}

# ---- a cell worker: damages one copy, runs every job on it
if [ "${1:-}" != "" ] && [ "$#" -eq 1 ] && [ -n "${ZCK_DAMAGE_WORK:-}" ]; then
  ID=$1
  CLASS=${ID%%.*} SRCID=${ID#*.}
  W=$ZCK_DAMAGE_WORK RES=$W/res SRC=$W/src/$SRCID C=$W/cells/$ID
  # shellcheck disable=SC1090
  . "$SRC/info"
  applies "$CLASS" || { all_jobs "n/a $NA"; exit 0; }
  mkdir -p "$C" && cp -r "$SRC/ck" "$C/ck"
  T=$C/ck/$TAG
  damage "$CLASS"
  case $? in
    0) ;;
    2) all_jobs "n/a $NA"; rm -rf "$C"; exit 0 ;;
    *) all_jobs "FAIL the damage could not be made: $(head -c 300 "$C/damage.log")"; exit 0 ;;
  esac
  if [ "$CLASS" != intact ] && sums "$C/ck" | cmp -s - "$SRC/sums"; then
    all_jobs "FAIL the damage left the copy equal to its source"; exit 0
  fi
  # every entry gets an old time: whatever a job writes, moves or removes in the input shows
  find "$C/ck" -exec touch -h -d @1000000000 {} +
  for j in $JOBS; do check "$j"; done
  [ -n "${ZCK_DAMAGE_KEEP:-}" ] || rm -rf "$C"
  exit 0
fi

# ---- the driver
[ $# -eq 3 ] || { echo "usage: damage.sh [--full] [--strict] [--jobs N] ZCKPT ZCKPT_TRAIN ZCK_DAMAGE" >&2; exit 2; }
ZCKPT=$1 TRAIN=$2 DAMAGE=$3
HERE=$(cd "$(dirname "$0")" && pwd)
FIX=${ZCK_FIXTURES:-$HERE/../fixtures}

KNOWN=$HERE/known-failures.txt
for t in timeout truncate cksum xargs; do
  command -v $t >/dev/null || { echo "SKIP: $t not installed"; exit 77; }
done
W=$(mktemp -d "${TMPDIR:-/tmp}/zckpt-damage-XXXXXX")
if [ -n "${ZCK_DAMAGE_KEEP:-}" ]; then echo "work folder: $W"; else trap 'rm -rf "$W"' EXIT; fi
mkdir "$W/src" "$W/runs" "$W/cells" "$W/res"
for st in 1 2 3; do
  # one config per stage, no optimizer block: every run has the same two param groups, so a
  # reshard to another stage resumes under that stage's config
  printf '{"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": %s}, "gradient_clipping": "auto",\n "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}\n' \
    "$st" >"$W/ds_zero$st.json"
done
CONF=$W
SMALL="--per-device-train-batch-size 2 --n-positions 16 --n-embd 16 --n-head 2 --eval-samples 2 --logging-steps 1"
export ZCKPT TRAIN DAMAGE CONF SMALL
export ZCK_DAMAGE_WORK=$W
die() { echo "FAIL: $*"; exit 1; }

# train NAME STAGE RANKS PREC SEED: a run saving at steps 1 and 2
train() {
  "$TRAIN" $SMALL --ranks "$3" --deepspeed "$CONF/ds_zero$2.json" $4 --seed "$5" --max-steps 2 --save-steps 1 \
    --output-dir "$W/runs/$1" >/dev/null 2>"$W/runs/$1.err" || die "zckpt-train $1: $(tail -1 "$W/runs/$1.err")"
}

# source NAME STAGE MF: $W/src/NAME-sSTAGE-MF with info (sourced by the cell workers)
SOURCES=""
new_source() {
  S=$W/src/$1-s$2-$3
  mkdir "$S"
  SOURCES="$SOURCES $1-s$2-$3"
}
# info STAGE WS TAG OLDTAG RANKS PREC
write_info() {
  rstage=$(($1 % 3 + 1)) rws=3
  [ "$2" = 3 ] && rws=2
  cat >"$S/info" <<EOF
STAGE=$1 WS=$2 TAG=$3 OLDTAG=$4 RANKS=$5 PREC='$6' MF=${S##*-} RSTAGE=$rstage RWS=$rws
EOF
}
strip_manifests() { for d in "$@"; do [ -d "$d" ] && rm -f "$d"/global_step*/zckpt-manifest.json; done; }

ds_source() { # FIXTURE
  case=$1 st=$(echo "$1" | cut -c2) ws=$(echo "$1" | cut -c4)
  name=ds
  [ "$FULL" = 1 ] && name=ds:$case
  [ -d "$FIX/deepspeed/$case/ckpt" ] || die "fixture $case missing"
  for mf in nomf mf; do
    new_source "$name" "$st" "$mf"
    cp -r "$FIX/deepspeed/$case/ckpt" "$S/ck"
    rm -f "$S/ck"/*.py
    if [ $mf = mf ]; then
      "$ZCKPT" verify -q --write-manifest "$S/ck" >"$S/wm.log" 2>&1 || die "verify --write-manifest $case: $(cat "$S/wm.log")"
    fi
    write_info "$st" "$ws" "$(cat "$S/ck/latest")" "" "" ""
  done
}

train_source() { # STAGE RANKS PREC NAME
  st=$1 ws=$2 prec=$3 name=$4
  train "$name-s$st" "$st" "$ws" "$prec" 42
  train "$name-s$st-seed7" "$st" "$ws" "$prec" 7
  for mf in nomf mf; do
    new_source "$name" "$st" "$mf"
    cp -r "$W/runs/$name-s$st/checkpoint-2" "$S/ck"
    cp -r "$W/runs/$name-s$st/checkpoint-1" "$S/old"
    cp -r "$W/runs/$name-s$st-seed7/checkpoint-2" "$S/other"
    [ $mf = nomf ] && strip_manifests "$S/ck" "$S/old" "$S/other"
    write_info "$st" "$ws" global_step2 global_step1 "$ws" "$prec"
  done
}

reshard_source() { # STAGE FROM_RUN RANKS PREC NAME: both checkpoints of FROM_RUN resharded to STAGE x RANKS
  st=$1 from=$W/runs/$2 ws=$3 prec=$4 name=$5
  for n in 1 2; do
    "$ZCKPT" reshard "$from/checkpoint-$n" "$W/runs/$name-s$st-$n" --to-stage "$st" --to-world-size "$ws" \
      >/dev/null 2>"$W/runs/$name.err" || die "reshard of $2: $(cat "$W/runs/$name.err")"
  done
  for mf in nomf mf; do
    new_source "$name" "$st" "$mf"
    cp -r "$W/runs/$name-s$st-2" "$S/ck"
    cp -r "$W/runs/$name-s$st-1" "$S/old"
    [ $mf = nomf ] && strip_manifests "$S/ck" "$S/old"
    write_info "$st" "$ws" global_step2 global_step1 "$ws" "$prec"
  done
}

start=$(date +%s)
for st in 1 2 3; do
  ds_source "s${st}w2_bf16"
  train_source "$st" 2 --bf16 train
done
for st in 1 2 3; do reshard_source "$st" "train-s$((st % 3 + 1))" 3 --bf16 reshard; done
if [ "$FULL" = 1 ]; then
  for c in s1w3_fp32 s1w4_bf16 s2w2_fp16 s2w3_bf16 s2w4_fp32 s3w2_fp16 s3w3_fp32 s3w4_bf16; do ds_source "$c"; done
  for st in 1 2 3; do train_source "$st" 3 "" train:w3-fp32; done
  for st in 1 2 3; do reshard_source "$st" "train:w3-fp32-s$((st % 3 + 1))" 4 "" reshard:w4-fp32; done
fi
# every tag folder name must be what the info says
for s in $SOURCES; do
  # shellcheck disable=SC1090
  . "$W/src/$s/info"
  [ -d "$W/src/$s/ck/$TAG" ] || die "source $s has no $TAG"
  sums "$W/src/$s/ck" >"$W/src/$s/sums"
done

CLASSES="intact crc-fp32 crc-exp_avg crc-16bit crc-datapkl copy-r0-r1 swap-r0-r1 old-rank old-optim old-model truncated missing valid-recrc other-run"
for s in $SOURCES; do for c in $CLASSES; do echo "$c.$s"; done; done >"$W/cells.txt"
if [ -n "${ZCK_DAMAGE_ONLY:-}" ]; then grep -E -- "$ZCK_DAMAGE_ONLY" "$W/cells.txt" >"$W/only.txt"; mv "$W/only.txt" "$W/cells.txt"; fi
xargs -P "$PAR" -n 1 sh "$0" <"$W/cells.txt"

# ---- the table: one line per cell "CLASS STAGE MANIFEST SOURCE JOB<TAB>verdict", then awk
while read -r cell; do
  c=${cell%%.*} s=${cell#*.}
  src=${s%-s[123]-*} rest=${s#"$src"-}
  for j in $JOBS; do
    r=$(cat "$W/res/$cell.$j" 2>/dev/null || echo "FAIL no result (the worker died)")
    printf '%s %s %s %s %s\t%s\n' "$c" "${rest%%-*}" "${rest#*-}" "$src" "$j" "$r"
  done
done <"$W/cells.txt" >"$W/results.txt"
[ -f "$KNOWN" ] || { KNOWN=$W/none; : >"$KNOWN"; }
awk -F '\t' -v jobs="$JOBS" -v strict="$STRICT" -v secs=$(($(date +%s) - start)) -v copies="$(wc -l <"$W/cells.txt")" '
  FILENAME == ARGV[1] {   # known-failures.txt: "CLASS STAGE MANIFEST SOURCE JOB  reason"
    if ($0 ~ /^[ \t]*(#|$)/) next
    n = split($0, f, /[ \t]+/)
    key = f[1] " " f[2] " " f[3] " " f[4] " " f[5]
    reason = $0; for (i = 1; i <= 5; i++) sub(/^[ \t]*[^ \t]+/, "", reason); sub(/^[ \t]+/, "", reason)
    known[key] = reason
    next
  }
  {
    split($1, k, " "); row = k[1] " " k[2] " " k[3] " " k[4]
    if (!(row in seen)) { seen[row] = 1; rows[++nrows] = row }
    r = $2; v = ""
    if (r ~ /^n\/a/) { v = "-"; na++; sub(/^n\/a /, "", r); if (!(r in why)) whys[++nwhy] = r; why[r]++ }
    else if (r == "ok") {
      total++; pass++; v = "ok"
      if ($1 in known) { v = "fixed"; fixed++; details = details "fixed  " $1 ": passes now; still listed as: " known[$1] "\n" }
    } else {
      total++; sub(/^FAIL /, "", r)
      if ($1 in known) { v = "known"; nknown++; details = details "known  " $1 ": " r "\n" }
      else { v = "FAIL"; fail++; details = details "FAIL   " $1 ": " r "\n" }
    }
    verdict[$1] = v
  }
  END {
    nj = split(jobs, J, " ")
    sw = 8
    for (i = 1; i <= nrows; i++) { split(rows[i], k, " "); if (length(k[4]) > sw) sw = length(k[4]) }
    printf "%-12s %-2s %-4s %-*s", "class", "st", "mf", sw, "source"
    for (j = 1; j <= nj; j++) printf " %-11s", J[j]
    printf "\n"
    for (i = 1; i <= nrows; i++) {
      split(rows[i], k, " ")
      printf "%-12s %-2s %-4s %-*s", k[1], substr(k[2], 2), k[3], sw, k[4]
      for (j = 1; j <= nj; j++) printf " %-11s", verdict[rows[i] " " J[j]]
      printf "\n"
    }
    printf "\ncells: ok = refused the damaged copy as it should (intact: passed); FAIL; known = listed in known-failures.txt; fixed = passes but still listed; - = not applicable:\n"
    for (i = 1; i <= nwhy; i++) printf "  %s: %d\n", whys[i], why[whys[i]]
    printf "\n%s\n", details
    printf "damage campaign: %d cells, %d ok, %d failed, %d known failures (known-failures.txt), %d fixed but still listed; %d not applicable; %d copies in %d s\n", total, pass, fail, nknown, fixed, na, copies, secs
    exit (fail > 0 || (strict && fixed > 0)) ? 1 : 0
  }' "$KNOWN" "$W/results.txt"
