#!/usr/bin/env bash
# cli_ds_spellings.sh: to-universal takes ds_to_universal.py's spellings (--input_folder,
# --output_folder, --inject_missing_state) and writes what the positional form writes.
set -u
bin=${ZCK_BIN:?}; ck=${ZCK_FIXTURES:?}/deepspeed/s2w2_bf16/ckpt
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
"$bin" to-universal -q --inject-missing-state "$ck" "$tmp/a/uni" || { echo "FAIL: positional form"; fail=1; }
"$bin" to-universal -q --input_folder "$ck" --output_folder "$tmp/b/uni" --inject_missing_state ||
  { echo "FAIL: ds_to_universal.py's spellings refused"; fail=1; }
diff -r "$tmp/a" "$tmp/b" >/dev/null || { echo "FAIL: the two forms wrote different files"; fail=1; }
# one path given both ways is a usage error (exit 2), not a third argument taken silently
"$bin" to-universal -q --input_folder "$ck" "$ck" "$tmp/c/uni" 2>/dev/null; rc=$?
[ $rc = 2 ] || { echo "FAIL: --input_folder plus two paths: exit $rc, expected 2"; fail=1; }
[ $fail = 0 ] && echo "ok: ds_to_universal.py's spellings"
exit $fail
