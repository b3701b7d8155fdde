#!/usr/bin/env bash
# exports_test.sh LIBZCKPT ZCK_H: libzckpt.so exports exactly the functions zck.h declares
# (ZCK_API), nothing internal (zck__*, planner, executor, formats) and nothing missing.
set -euo pipefail
lib="$1"; hdr="$2"
command -v nm >/dev/null 2>&1 || { echo "SKIP: no nm"; exit 77; }
want=$(sed -nE 's/^ZCK_API[^(]*[^a-z0-9_](zck_[a-z0-9_]+)\(.*/\1/p' "$hdr" | sort -u)
have=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWiu]$/ {print $3}' | sed 's/@.*//' | sort -u)
[ -n "$want" ] || { echo "FAIL: no ZCK_API declarations found in $hdr"; exit 1; }
extra=$(comm -13 <(echo "$want") <(echo "$have"))
missing=$(comm -23 <(echo "$want") <(echo "$have"))
rc=0
if [ -n "$extra" ]; then echo "FAIL: $(echo "$extra" | wc -l) symbols exported that zck.h does not declare:"; echo "$extra" | head -20; rc=1; fi
if [ -n "$missing" ]; then echo "FAIL: declared in zck.h but not exported:"; echo "$missing"; rc=1; fi
[ "$rc" = 0 ] && echo "$(echo "$want" | wc -l) exported symbols, all declared in zck.h"
exit "$rc"
