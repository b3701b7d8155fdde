#!/usr/bin/env bash
# update_command_docs.sh [ZCKPT]: puts each command's current --help into the first fenced
# block of docs/commands/zckpt-<command>.md (what cli_docs_help checks); the prose below it
# is left as it is. ZCKPT defaults to build/bin/zckpt.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/bin/zckpt}
for cmd in consolidate reshard to-universal verify inspect convert; do
  page=docs/commands/zckpt-$cmd.md
  help=$("$bin" "$cmd" --help)
  HELP="$help" awk '/^```/ && n < 2 { n++; if (n == 1) { print; print ENVIRON["HELP"] } ; if (n == 2) print; next }
                    n != 1' "$page" >"$page.tmp"
  mv "$page.tmp" "$page"
done
