#!/usr/bin/env bash
# qa_cli.sh ZCKPT MAKE_BIG_CKPT: regressions found by using zckpt as a new user would.
# Every failing run must exit non-zero with one line "zckpt: error: FILE: ..." (or the usage
# line, exit 2), leave nothing at the output and keep the input and earlier outputs intact.
set -u
zckpt="$1"; make_big="$2"
fx="${ZCK_FIXTURES:?}"
ck_src="$fx/deepspeed/s2w2_bf16/ckpt"
[ -d "$ck_src" ] || { echo "SKIP: fixture missing"; exit 77; }
tmp="$(mktemp -d)"; trap 'umount "$tmp/small" 2>/dev/null; rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
# run EXPECTED_RC NEEDLE cmd...: exit code, one stderr line holding NEEDLE
run() {
  local want="$1" needle="$2"; shift 2
  "$@" >out.txt 2>err.txt; local rc=$?
  if [ "$rc" != "$want" ]; then bad "$* -> exit $rc (want $want): $(head -c 300 err.txt)"; return 1; fi
  if [ "$want" != 0 ]; then
    if [ "$(wc -l <err.txt)" != 1 ]; then bad "$* -> stderr is not one line: $(cat err.txt)"; return 1; fi
    if ! grep -qF -- "$needle" err.txt; then bad "$* -> '$(cat err.txt)' lacks '$needle'"; return 1; fi
  fi
  ok
}
tree_sum() { (cd "$1" && find . -type f -exec md5sum {} + | sort | md5sum); }
fresh() { rm -rf ck; cp -r "$ck_src" ck; }

# 1. OUT == the checkpoint, with --overwrite: the input was replaced by its own output.
fresh; before=$(tree_sum ck)
run 1 "ck: is the input" "$zckpt" consolidate -q ck ck --overwrite
run 1 "is the input" "$zckpt" consolidate -q ck/ ./ck/ --overwrite
run 1 "is the input" "$zckpt" reshard -q ck ck --to-world-size 1 --overwrite
run 1 "is the input" "$zckpt" to-universal -q ck ck --inject-missing-state --overwrite
# ... or its tag folder, or a folder holding it
run 1 "tag folder global_step2" "$zckpt" consolidate -q ck ck/global_step2 --overwrite
run 1 "tag folder global_step2" "$zckpt" reshard -q ck ck/global_step2 --to-world-size 1 --overwrite
run 1 "is the input" "$zckpt" consolidate -q ck/global_step2 . --overwrite
[ "$(tree_sum ck)" = "$before" ] && ok || bad "the input checkpoint changed"
# an output inside the checkpoint root is fine (README: to-universal ckpt/ ckpt/universal)
run 0 "" "$zckpt" consolidate -q ck ck/model
run 0 "" "$zckpt" consolidate -q ck ck/model --overwrite
# convert: a folder holding the input is refused; a file converted onto itself is atomic
mkdir -p hf/sub && cp "$fx/safetensors/dtypes.safetensors" hf/sub/model.safetensors
run 1 "is the input" "$zckpt" convert -q hf/sub hf --overwrite
[ -f hf/sub/model.safetensors ] && ok || bad "convert IN-in-OUT deleted the input"
# issue 13.1: a file converted onto itself lost what the conversion changes (fp32 -> bf16,
# or every value of a .pt that is not a tensor); an input file, a link to one, a rank file
# inside the tag folder (or kept elsewhere through a symlink) is refused, by inode
cp "$fx/safetensors/dtypes.safetensors" x.safetensors; xs=$(md5sum <x.safetensors)
run 1 "x.safetensors: is the input x.safetensors" "$zckpt" convert -q x.safetensors x.safetensors --overwrite --dtype bf16
ln -f x.safetensors hard.safetensors; ln -sf x.safetensors soft.safetensors
run 1 "hard.safetensors: is the input x.safetensors" "$zckpt" convert -q x.safetensors hard.safetensors --overwrite
run 1 "soft.safetensors: is the input x.safetensors" "$zckpt" convert -q x.safetensors soft.safetensors --overwrite
[ "$(md5sum <x.safetensors)" = "$xs" ] && ok || bad "convert onto itself changed the input"
cp "$fx/torch/dtypes.pt" self.pt
run 1 "self.pt: is the input self.pt" "$zckpt" convert -q self.pt self.pt --overwrite
fresh; before=$(tree_sum ck); r1=bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt
run 1 "lies inside the input folder ck/global_step2" "$zckpt" consolidate -q ck "ck/global_step2/$r1" --overwrite
run 1 "lies inside the input folder ck/global_step2" "$zckpt" reshard -q ck ck/global_step2/new --to-world-size 1
run 1 "ck/latest: is the input file ck/latest" "$zckpt" consolidate -q ck ck/latest --overwrite
mkdir -p kept; mv "ck/global_step2/$r1" kept/r1.pt; ln -s "$tmp/kept/r1.pt" "ck/global_step2/$r1"
run 1 "kept/r1.pt: is the input file ck/global_step2/$r1" "$zckpt" consolidate -q ck kept/r1.pt --overwrite
run 1 "kept: is the input file ck/global_step2/$r1" "$zckpt" consolidate -q ck kept --overwrite
rm "ck/global_step2/$r1"; mv kept/r1.pt "ck/global_step2/$r1"
[ "$(tree_sum ck)" = "$before" ] && ok || bad "an OUT inside the input changed it"

# 2. --format that an OUT file's suffix overrode was silently ignored
run 2 "--format pt does not fit" "$zckpt" consolidate -q ck o.safetensors --format pt
run 2 "--format both does not fit" "$zckpt" consolidate -q ck o.bin --format both
[ ! -e o.safetensors ] && [ ! -e o.bin ] && ok || bad "output written despite the usage error"
run 0 "" "$zckpt" consolidate -q ck o.bin --format pt

# 3. consolidate --format pt into a folder wrote no zckpt-manifest.json (README: every output folder)
run 0 "" "$zckpt" consolidate -q ck ptdir --format pt
[ -f ptdir/zckpt-manifest.json ] && ok || bad "--format pt folder has no zckpt-manifest.json"

# 4. an option without its value was reported as an unknown option
run 2 "option '--tag' needs a value" "$zckpt" consolidate ck o2 --tag
run 2 "option '--to-world-size' needs a value" "$zckpt" reshard ck o2 --to-world-size
run 2 "option '--threads' needs a value" "$zckpt" verify ck --threads
run 2 "unknown option '-z'" "$zckpt" consolidate -qz ck o2
# 4b. strtod let hexadecimal and leading blanks through as numbers (README: malformed
#     numbers are usage errors)
run 2 "--to-world-size must be a positive integer" "$zckpt" reshard ck o2 --to-world-size 0x2
run 2 "--to-world-size must be a positive integer" "$zckpt" reshard ck o2 --to-world-size " 2"
run 2 "--max-shard-size: cannot read '0x10'" "$zckpt" consolidate ck o2 --max-shard-size 0x10
[ ! -e o2 ] && ok || bad "o2 written despite usage errors"

# 5. an unreadable file was "not a torch .pt/.bin, safetensors file" in inspect
cp "$fx/torch/dtypes.pt" locked.pt
chmod 000 locked.pt
as_user=()
if [ "$(id -u)" = 0 ]; then
  if command -v setpriv >/dev/null; then
    chmod 755 "$tmp"; as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  fi
fi
if [ "$(id -u)" != 0 ] || [ ${#as_user[@]} -gt 0 ]; then
  run 1 "locked.pt: cannot open: Permission denied" "${as_user[@]}" "$zckpt" inspect locked.pt
else
  echo "note: root without setpriv: unreadable-file case skipped"
fi
chmod 644 locked.pt
# 5a. verify of a tag folder that cannot be listed blamed "zckpt-manifest.json: cannot open"
if [ "$(id -u)" != 0 ] || [ ${#as_user[@]} -gt 0 ]; then
  rm -rf c4; cp -r "$ck_src" c4; chmod -R a+rX c4; chmod 000 c4/global_step2
  "${as_user[@]}" "$zckpt" verify c4 >out.txt 2>&1; rc=$?
  [ "$rc" = 1 ] && grep -q "unchecked: c4/global_step2: cannot list the folder: Permission denied" out.txt && ok ||
    bad "verify, unlistable tag folder: exit $rc: $(cat out.txt)"
  chmod 755 c4/global_step2
fi

# 5a2. verify that could not check printed its report only: no "zckpt: error:" line
run 1 "zckpt: error: nonexist: no such file or directory" "$zckpt" verify nonexist

# 5b. inspect of something that is not a file or folder said "no such file or directory"
run 1 "/dev/null: not a regular file or folder" "$zckpt" inspect /dev/null

# 5c. inspect of a universal folder (what to-universal writes) said "no 'latest' file; pass
#     a tag", and inspect has no --tag
uv="$fx/universal/s2w2_fp32_zeronumel"
if [ -d "$uv" ]; then
  run 0 "" "$zckpt" inspect "$uv"
  grep -q "universal checkpoint .*global_step2_universal, from ZeRO-2, world size 2" out.txt && ok || bad "inspect universal: $(head -2 out.txt)"
  run 0 "" "$zckpt" inspect "$uv/global_step2_universal"
  run 0 "" "$zckpt" inspect --json "$uv"
  grep -q '"format":.*"universal"' out.txt && ok || bad "inspect --json universal: $(head -3 out.txt)"
fi

# 5d. KNOWN ISSUE (not changed: tests/verify/test_verify.c case 7 asks for it): verify --tag
#     naming no folder reports DAMAGED (exit 3) for a sound checkpoint
if [ "${ZCK_QA_KNOWN_BUGS:-0}" = 1 ]; then
  "$zckpt" verify ck --tag nosuch >out.txt 2>&1; rc=$?
  [ "$rc" = 1 ] && ok || bad "verify --tag nosuch: exit $rc: $(cat out.txt)"
fi

# 5e. a rank file replaced by another rank's: the ZeRO-3 partitions are padded to one size,
#     so the set added up and verify said clean (and consolidate wrote rank 0's values twice)
s3="$fx/deepspeed/s3w2_bf16/ckpt"
if [ -d "$s3" ]; then
  for f in bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt zero_pp_rank_1_mp_rank_00_model_states.pt; do
    rm -rf c3; cp -r "$s3" c3
    cp "c3/global_step2/${f/rank_1/rank_0}" "c3/global_step2/$f"
    "$zckpt" verify c3 >out.txt 2>&1; rc=$?
    # one damaged: line, the file and what is wrong (the copy check no longer repeats the reader's)
    a0=${f/rank_1/rank_0}; a0=${a0%.pt}
    [ "$rc" = 3 ] && [ "$(grep -c '^damaged: ' out.txt)" = 1 ] &&
      grep -q "^damaged: c3/global_step2/$f: holds rank 0's [a-z ]* (archive '$a0'), expected rank 1\$" out.txt && ok ||
      bad "verify of a copied $f: exit $rc: $(cat out.txt)"
  done
  # consolidate, reshard and to-universal read the copy without a word (wrote rank 0's values twice)
  rm -rf c3; cp -r "$s3" c3
  cp c3/global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt c3/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt
  msg="c3/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt: holds rank 0's optimizer state (archive 'bf16_zero_pp_rank_0_mp_rank_00_optim_states'), expected rank 1"
  run 1 "$msg" "$zckpt" consolidate -q c3 c3out
  run 1 "$msg" "$zckpt" reshard -q c3 c3resh --to-world-size 1
  run 1 "$msg" "$zckpt" to-universal -q c3 c3univ
  [ ! -e c3out ] && [ ! -e c3resh ] && [ ! -e c3univ ] && ok || bad "a refused rank copy left output"
fi

# 5f. a rank file that is a symlink (kept elsewhere) was skipped by verify's data pass:
#     a flipped byte inside one of its tensors gave "clean"
rm -rf c5 store; cp -r "$ck_src" c5; mkdir store
f=bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt
mv "c5/global_step2/$f" store/r1.pt; ln -s "$tmp/store/r1.pt" "c5/global_step2/$f"
# a byte inside the data of the record holding exp_avg (record data/1: not a header byte)
off=$(python3 -c '
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1]); i = [e for e in z.infolist() if e.filename.endswith("/data/1")][0]
print(i.header_offset + 30 + len(i.filename) + len(i.extra) + i.file_size // 2)' store/r1.pt 2>/dev/null)
if [ -n "$off" ]; then
  printf '\x7f' | dd of=store/r1.pt bs=1 seek="$off" conv=notrunc 2>/dev/null
  "$zckpt" verify c5 >out.txt 2>&1; rc=$?
  [ "$rc" = 3 ] && grep -q "damaged: c5/global_step2/$f: zip record .*CRC-32" out.txt && ok || bad "verify, symlinked rank file: exit $rc: $(cat out.txt)"
else
  echo "note: no python3: symlinked-file case skipped"
fi

# 5g. an empty path was taken as a path (": cannot rename output into place")
run 2 "empty path argument" "$zckpt" consolidate ck ""
run 2 "empty path argument" "$zckpt" inspect ""
# 5h. OUT named *.safetensors that exists as a folder: "cannot keep the previous version
#     while replacing it: Operation not permitted"
mkdir -p dir.safetensors
run 1 "dir.safetensors: exists and is a folder" "$zckpt" consolidate -q ck dir.safetensors --overwrite
# 5i. to-universal OUT named *.h5 without --format wrote a DeepSpeed-layout folder called x.h5
run 0 "" "$zckpt" to-universal -q "$fx/deepspeed/s3w2_bf16/ckpt" state.h5
[ -f state.h5 ] && ok || bad "to-universal state.h5 is not one file: $(ls -la state.h5 | head -3)"
run 0 "" "$zckpt" to-universal -q "$fx/deepspeed/s3w2_bf16/ckpt" dsdir.h5 --format ds
[ -d dsdir.h5/zero ] && ok || bad "to-universal --format ds dsdir.h5 is not a folder"
rm -f latest_universal
# 5j. zckpt writes the HDF5 container, but inspect said "not a torch .pt/.bin, safetensors
#     file or checkpoint directory" and verify "nothing zckpt can check" (exit 1)
run 0 "" "$zckpt" inspect state.h5
grep -q "zckpt HDF5 universal container, tag global_step2, from ZeRO-3, world size 2" out.txt && ok || bad "inspect state.h5: $(head -2 out.txt)"
"$zckpt" verify state.h5 >out.txt 2>&1; rc=$?
[ "$rc" = 0 ] && grep -q "hdf5-universal" out.txt && ok || bad "verify state.h5: exit $rc: $(cat out.txt)"
head -c 3000 state.h5 >cut.h5
"$zckpt" verify cut.h5 >out.txt 2>&1; rc=$?
[ "$rc" = 3 ] && grep -q "damaged: cut.h5: " out.txt && ok || bad "verify of a truncated container: exit $rc: $(cat out.txt)"
if [ -f "$fx/hdf5/zstd.h5" ]; then # an HDF5 file that is not zckpt's: could not check
  "$zckpt" verify "$fx/hdf5/zstd.h5" >out.txt 2>&1; rc=$?
  [ "$rc" = 1 ] && grep -q "not a zckpt universal container" out.txt && ok || bad "verify of a foreign HDF5 file: exit $rc: $(cat out.txt)"
fi

# 5k. OUT a symlink to a folder (model -> /bigdisk/model): the output was renamed over the
#     link, replacing it with a folder here and leaving the target empty
rm -rf real lnk; mkdir real; ln -s real lnk
run 0 "" "$zckpt" consolidate -q ck lnk
[ -L lnk ] && [ -f real/model.safetensors ] && ok || bad "consolidate into a symlinked folder: $(ls -la lnk real | tr '\n' ' ')"
run 0 "" "$zckpt" consolidate -q ck lnk/ --overwrite --format both
[ -L lnk ] && [ -f real/pytorch_model.bin ] && ok || bad "--overwrite through a symlinked folder: $(ls -la lnk real | tr '\n' ' ')"
ln -s nowhere dangling
run 1 "dangling: a symlink to a missing path" "$zckpt" reshard -q ck dangling --to-world-size 1
[ -L dangling ] && [ ! -e nowhere ] && ok || bad "dangling link changed"

# 6. SIGINT / SIGTERM during a run left ".OUT.zck-tmp-PID" trees (gigabytes) behind
"$make_big" big --params 6000000 --world 2 >/dev/null || { bad "make_big_ckpt failed"; }
interrupted=0
sigs=(TERM)
env --default-signal=INT true 2>/dev/null && sigs+=(INT) # a background job ignores SIGINT otherwise
for sig in "${sigs[@]}"; do
  for cmd in "consolidate big o1 --format both" "reshard big o1 --to-world-size 3" \
             "to-universal big o1 --inject-missing-state" "to-universal big o1.h5 --format hdf5"; do
    for delay in 0.02 0.05 0.1 0.2; do
      rm -rf o1 o1.h5 latest_universal
      if [ "$sig" = INT ]; then env --default-signal=INT "$zckpt" $cmd -q --threads 1 2>err.txt & else "$zckpt" $cmd -q --threads 1 2>err.txt & fi
      p=$!; sleep "$delay"; kill -"$sig" "$p" 2>/dev/null; wait "$p"; rc=$?
      left=$(ls -A | grep -e zck-tmp || true)
      if [ -n "$left" ]; then bad "$sig during '$cmd' left $left"; fi
      if [ "$rc" != 0 ]; then
        interrupted=$((interrupted + 1))
        # empty: killed before main() set up its signal thread (nothing written yet)
        { [ ! -s err.txt ] || { [ "$(wc -l <err.txt)" = 1 ] && grep -q "^zckpt: error: .*interrupted by SIG$sig" err.txt; }; } && ok ||
          bad "$sig during '$cmd': exit $rc, stderr: $(cat err.txt)"
        # an output is there only when the signal came after its rename into place, and then
        # the line says so
        if ls -A | grep -q -e '^o1'; then
          grep -q "after the output was in place" err.txt && ok || bad "$sig during '$cmd': output left: $(ls -A | tr '\n' ' '): $(cat err.txt)"
        fi
      fi
    done
  done
done
[ "$interrupted" -gt 0 ] && ok || echo "note: no run was slow enough to be interrupted"
# an earlier output survives an interrupted --overwrite
rm -rf o1; "$zckpt" consolidate -q ck o1 || bad "setup: consolidate ck o1"
before=$(tree_sum o1)
for delay in 0.01 0.03 0.06; do
  "$zckpt" consolidate -q big o1 --overwrite --threads 1 2>err.txt & p=$!; sleep "$delay"; kill -TERM "$p" 2>/dev/null; wait "$p"
  if [ "$?" = 0 ] || grep -q "after the output was in place" err.txt; then rm -rf o1; "$zckpt" consolidate -q ck o1; continue; fi
  [ "$(tree_sum o1)" = "$before" ] && ok || bad "interrupted --overwrite changed the earlier output: $(ls -A . o1 | tr '\n' ' ')"
done
ls -A | grep -q zck-tmp && bad "temporaries left: $(ls -A)"

# 7. a full disk: one line, nothing left, the earlier output kept (needs a small tmpfs: root)
mkdir -p small
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=16k tmpfs small 2>/dev/null; then
  "$zckpt" consolidate -q ck small/first || bad "setup: first output does not fit"
  before=$(tree_sum small/first)
  run 1 "small/o.safetensors: write of" "$zckpt" consolidate -q ck small/o.safetensors
  run 1 "No space left on device" "$zckpt" consolidate -q ck small/first --overwrite --format both
  # the message named the temporary tree (small/.r.zck-tmp-PID/.global_step2.zck-tmp-PID/...)
  # and, for pytorch_model.bin, the path twice
  run 1 "zckpt: error: small/r/global_step2/" "$zckpt" reshard -q ck small/r --to-world-size 1
  run 1 "zckpt: error: small/p/pytorch_model.bin: write of" "$zckpt" consolidate -q ck small/p --format pt
  # the message named "model.safetensors" alone, without its folder
  run 1 "zckpt: error: small/h/model.safetensors: write of" "$zckpt" consolidate -q ck small/h --format safetensors
  run 1 "zckpt: error: small/n1/n2/h/model.safetensors: write of" "$zckpt" consolidate -q ck small/n1/n2/h
  [ "$(tree_sum small/first)" = "$before" ] && [ "$(ls -A small)" = first ] && ok || bad "full disk: $(ls -A small)"
  # KNOWN BUG (formats/hdf5, not fixed here): libhdf5's ENOSPC message is several lines
  # (the CLI now joins them) and the process then segfaults in H5F__close_cb at exit.
  if [ "${ZCK_QA_KNOWN_BUGS:-0}" = 1 ]; then
    run 1 "No space left on device" "$zckpt" to-universal -q ck small/u.h5 --format hdf5
  fi
  umount small
else
  echo "note: no tmpfs: full-disk case skipped"
fi

fresh
# issue 13.2: a replacing commit killed between its two renames left OUT missing and the
# earlier output in ".OUT.zck-tmp-P.zck-old-P", which the next run deleted: it is put back
sh -c 'exit 0' & dead=$!; wait "$dead" # a pid that no longer runs
rm -rf o9; "$zckpt" consolidate -q ck o9 || bad "setup: consolidate ck o9"
before=$(tree_sum o9); mv o9 ".o9.zck-tmp-$dead.zck-old-$dead"
run 1 "o9: exists and is not empty" "$zckpt" consolidate -q ck o9
[ -d o9 ] && [ "$(tree_sum o9)" = "$before" ] && ! ls -A | grep -q "^\.o9" && ok || bad "the kept earlier output was not put back: $(ls -A)"
# issue 13.3: killed single-file writers' temporaries were never removed
for o in m3.safetensors u3.h5 x3.pt; do head -c 1000 /dev/zero >".$o.zck-tmp-$dead"; done
run 0 "" "$zckpt" consolidate -q ck m3.safetensors
run 0 "" "$zckpt" to-universal -q "$fx/deepspeed/s3w2_bf16/ckpt" u3.h5
run 0 "" "$zckpt" convert -q self.pt x3.pt
rm -f latest_universal
left=$(ls -A | grep "zck-tmp-$dead" || true)
[ -z "$left" ] && ok || bad "dead writers' temporaries left: $left"
# issue 13.4: two runs writing one new OUT file both exited 0, one output replacing the
# other: a file that appears at OUT while a run writes it is left, the run exits 1
rm -f race.safetensors
"$zckpt" consolidate -q big race.safetensors --threads 1 2>err.txt & p=$!
for i in $(seq 1 5000); do [ -e ".race.safetensors.zck-tmp-$p" ] && break; done
if (set -C; echo other >race.safetensors) 2>/dev/null; then
  wait "$p"; rc=$?
  # (a slow build may reach its own "exists" check after the other file came: also right)
  [ "$rc" = 1 ] && [ "$(cat race.safetensors)" = other ] && grep -q "race.safetensors: appeared while this run wrote it\|race.safetensors: exists" err.txt &&
    [ "$(wc -l <err.txt)" = 1 ] && ok || bad "a second writer's output was replaced: exit $rc, $(cat err.txt)"
else
  wait "$p"; echo "note: the run finished first: concurrent-writer case not exercised"
fi
# issue 13.5: a FIFO as `latest`, zckpt-manifest.json or config.json hung every command
rm -rf c7; cp -r "$ck_src" c7; rm c7/latest; mkfifo c7/latest
run 1 "c7/latest: not a regular file" timeout 20 "$zckpt" consolidate -q c7 o7
run 1 "c7/latest: not a regular file" timeout 20 "$zckpt" reshard -q c7 o7 --to-world-size 1
run 1 "c7/latest: not a regular file" timeout 20 "$zckpt" to-universal -q c7 o7 --inject-missing-state
timeout 20 "$zckpt" verify c7 >out.txt 2>&1; rc=$?
[ "$rc" = 1 ] && grep -q "c7/latest: not a regular file" out.txt && ok || bad "verify, FIFO latest: exit $rc: $(cat out.txt)"
rm -rf c7; cp -r "$ck_src" c7; mkfifo c7/global_step2/zckpt-manifest.json c7/config.json
run 1 "zckpt-manifest.json: not a regular file" timeout 20 "$zckpt" consolidate -q c7 o7
run 1 "zckpt-manifest.json: not a regular file" timeout 20 "$zckpt" reshard -q c7 o7 --to-world-size 1
timeout 20 "$zckpt" verify c7 >out.txt 2>&1; rc=$?
[ "$rc" = 1 ] && grep -q "zckpt-manifest.json: not a regular file" out.txt && ok || bad "verify, FIFO manifest: exit $rc: $(cat out.txt)"
rm c7/global_step2/zckpt-manifest.json
run 0 "" timeout 20 "$zckpt" to-universal -q c7 o7.h5 --inject-missing-state
[ ! -e o7 ] && ok || bad "o7 written"

# issue 13.6: verify said "clean" (as a "torch" folder) where every job refuses: `latest`
# removed, dangling or a loop; a tag with model files but no optimizer states
for how in removed dangling loop; do
  rm -rf c8; cp -r "$ck_src" c8; rm c8/latest
  case $how in dangling) ln -s nowhere c8/latest;; loop) ln -s latest c8/latest;; esac
  "$zckpt" verify c8 >out.txt 2>&1; rc=$?
  [ "$rc" != 0 ] && ! grep -q "result: clean" out.txt && ok || bad "verify, latest $how: exit $rc: $(cat out.txt)"
  run 1 "c8" "$zckpt" consolidate -q c8 o8
done
rm -rf c8; cp -r "$ck_src" c8; rm c8/global_step2/*optim_states.pt
"$zckpt" verify c8 >out.txt 2>&1; rc=$?
[ "$rc" = 1 ] && grep -q "unchecked: c8/global_step2: no \*_optim_states.pt files" out.txt && ok || bad "verify, no optimizer files: exit $rc: $(cat out.txt)"
run 1 "c8/global_step2: no *_optim_states.pt files" "$zckpt" consolidate -q c8 o8

# issue 13.9: a folder OUT replaced by a one-file output with --overwrite failed after all
# the work with "cannot keep the previous version ...: Operation not permitted"
mkdir -p fold.h5/x fold.pt/x
run 1 "fold.h5: exists and is a folder" "$zckpt" to-universal -q "$fx/deepspeed/s3w2_bf16/ckpt" fold.h5 --overwrite
run 1 "fold.pt: exists and is a folder" "$zckpt" convert -q self.pt fold.pt --overwrite
[ -d fold.h5/x ] && [ -d fold.pt/x ] && ok || bad "a refused folder OUT changed"

# issue 14.5: DeepSpeed zero_to_fp32.py's spellings were unknown options; an unknown option
# got no hint
run 0 "" "$zckpt" consolidate -q ck dsnames --max_shard_size 1KB --exclude_frozen_parameters --safe_serialization
[ -f dsnames/model.safetensors.index.json ] && ok || bad "--max_shard_size did not shard: $(ls dsnames | head -3)"
run 2 "unknown option '--overwirte' (did you mean '--overwrite'?)" "$zckpt" consolidate ck o2 --overwirte
run 2 "(did you mean '--to-world-size'?)" "$zckpt" reshard ck o2 --to-worldsize 2
[ ! -e o2 ] && ok || bad "o2 written despite usage errors"

# issue 14.5: inspect --json gave hyperparameters as Python text ("0.004", "False", "(0.9, 0.999)")
run 0 "" "$zckpt" inspect --json ck
grep -q '"lr":[[:space:]]*0.004,' out.txt && grep -q '"amsgrad":[[:space:]]*false' out.txt &&
  grep -q '"betas":[[:space:]]*\[0.9, 0.999\]' out.txt && grep -q '"foreach":[[:space:]]*null' out.txt && ok ||
  bad "inspect --json: hyperparameters not JSON values: $(grep -m3 '"lr"\|"betas"\|"amsgrad"' out.txt)"

# issue 14.5: verify FILE.safetensors said "checked: 0 files, 0 bytes read ... clean"
"$zckpt" verify x.safetensors >out.txt 2>&1; rc=$?
[ "$rc" = 0 ] && grep -q "checked: 1 file.*, $(wc -c <x.safetensors) bytes read" out.txt && ok || bad "verify x.safetensors: exit $rc: $(cat out.txt)"

# issue 14.5: errors carried the spec's item ids ("(DS-76)")
run 1 "in the model states; pass --inject-missing-state" "$zckpt" to-universal -q ck o2
grep -q "(DS-" err.txt && bad "a spec code in an error: $(cat err.txt)" || ok
[ ! -e o2 ] && ok || bad "o2 written"

# make_big_ckpt --help started writing 12 GB into ./--help
(cd "$tmp" && "$make_big" --help >out.txt 2>&1); rc=$?
[ "$rc" = 0 ] && grep -q "usage: make_big_ckpt" out.txt && [ ! -e ./--help ] && ok || bad "make_big_ckpt --help: exit $rc, $(ls -A | head -3)"
(cd "$tmp" && "$make_big" mb --parms 10 >out.txt 2>&1); rc=$?
[ "$rc" = 2 ] && [ ! -e mb ] && ok || bad "make_big_ckpt with a misspelt option: exit $rc"

# an oversized `latest` was "0 bytes" (zck__read_small_file read the size after closing the file)
rm -rf c6; cp -r "$ck_src" c6; head -c 5000 /dev/zero | tr '\0' 'a' >c6/latest
run 1 "c6/latest: 5000 bytes, more than the 4096 expected" "$zckpt" consolidate -q c6 o6
# convert of an unreadable file was "not a torch .pt/.bin, ..."
if [ "$(id -u)" != 0 ] || [ ${#as_user[@]} -gt 0 ]; then
  chmod 000 locked.pt
  run 1 "locked.pt: cannot open: Permission denied" "${as_user[@]}" "$zckpt" convert locked.pt "$tmp/unlocked.safetensors"
  chmod 644 locked.pt
fi
# a dtype safetensors cannot hold: the message named no file
if [ -f "$fx/torch/extra_dtypes.pt" ]; then
  run 1 "extra_dtypes.pt: tensor c" "$zckpt" convert -q "$fx/torch/extra_dtypes.pt" cx.safetensors
fi

echo "qa_cli: $pass passed, $fail failed"
[ "$fail" = 0 ]
