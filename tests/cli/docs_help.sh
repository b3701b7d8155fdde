#!/usr/bin/env bash
# docs_help.sh: each docs/commands/zckpt-<command>.md opens with that command's --help,
# word for word, so the reference pages cannot drift from the program.
set -u
src=${ZCK_SOURCE_DIR:?}; bin=${ZCK_BIN:?}
fail=0
for cmd in consolidate reshard to-universal verify inspect convert; do
  page="$src/docs/commands/zckpt-$cmd.md"
  [ -f "$page" ] || { echo "FAIL: no page $page"; fail=1; continue; }
  # the first fenced block of the page
  documented=$(awk '/^```/ { n++; next } n == 1' "$page")
  if [ "$documented" != "$("$bin" "$cmd" --help)" ]; then
    echo "FAIL: docs/commands/zckpt-$cmd.md differs from 'zckpt $cmd --help' (scripts/update_command_docs.sh puts it in):"
    diff <(echo "$documented") <("$bin" "$cmd" --help) | head -10
    fail=1
  fi
done
[ $fail = 0 ] && echo "ok: every command page holds its --help"
exit $fail
