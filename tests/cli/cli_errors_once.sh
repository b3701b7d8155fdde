#!/usr/bin/env bash
# cli_errors_once.sh: a path that is not there is one line on stderr (`zckpt: error: PATH:
# ...: no such file or directory`), exit 1 and nothing on stdout, for every command that reads a
# checkpoint (verify printed a report of nothing checked besides the error line).
set -u
bin=${ZCK_BIN:?}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
missing="$tmp/not-there"
for cmd in "verify" "verify --json" "inspect" "consolidate -q" "reshard -q --to-world-size 1" "to-universal -q" "convert -q"; do
  case $cmd in verify*|inspect) args=("$missing") ;; *) args=("$missing" "$tmp/out") ;; esac
  # shellcheck disable=SC2086
  "$bin" $cmd "${args[@]}" >"$tmp/out.txt" 2>"$tmp/err.txt"; rc=$?
  [ $rc = 1 ] || { echo "FAIL: $cmd: exit $rc, expected 1"; fail=1; }
  [ -s "$tmp/out.txt" ] && { echo "FAIL: $cmd: stdout is not empty:"; cat "$tmp/out.txt"; fail=1; }
  [ "$(wc -l <"$tmp/err.txt")" = 1 ] && grep -qi "^zckpt: error: .*not-there.*: no such file or directory" "$tmp/err.txt" ||
    { echo "FAIL: $cmd: stderr is not the one error line:"; cat "$tmp/err.txt"; fail=1; }
  [ -e "$tmp/out" ] && { echo "FAIL: $cmd: wrote $tmp/out"; fail=1; }
done
[ $fail = 0 ] && echo "ok: each error once"
exit $fail
