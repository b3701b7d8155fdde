#!/bin/sh
# cli_manifest_writer.sh: every folder zckpt writes says who wrote it. Its
# zckpt-manifest.json names the tool ("zckpt") and the version `zckpt --version` prints,
# after reshard, to-universal, consolidate into a folder and verify --write-manifest; and
# the manifest holds nothing of the run (time, host, path): the same job twice gives the
# same manifest, byte for byte. (zckpt-train's saves: tests/engine/cli_train.sh.)
# Needs $ZCK_BIN (the zckpt binary) and $ZCK_FIXTURES.
set -u
BIN=${ZCK_BIN:?ZCK_BIN not set}
SRC=${ZCK_FIXTURES:?ZCK_FIXTURES not set}/deepspeed/s2w2_bf16/ckpt
T=$(mktemp -d "${TMPDIR:-/tmp}/zckpt-cli-mw-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
version=$("$BIN" --version | sed -n 's/^zckpt //p')
[ -n "$version" ] || fail "zckpt --version: $("$BIN" --version)"
says_zckpt() { # MANIFEST
  [ -f "$1" ] || fail "no $1"
  grep -qxF '  "tool": "zckpt",' "$1" || fail "$1: no \"tool\": \"zckpt\": $(sed -n 2,6p "$1")"
  grep -qxF "  \"version\": \"$version\"," "$1" || fail "$1: not version $version: $(sed -n 2,6p "$1")"
}

"$BIN" reshard -q --to-world-size 3 "$SRC" "$T/r1" || fail "reshard"
"$BIN" reshard -q --to-world-size 3 "$SRC" "$T/r2" || fail "reshard again"
says_zckpt "$T/r1/global_step2/zckpt-manifest.json"
cmp "$T/r1/global_step2/zckpt-manifest.json" "$T/r2/global_step2/zckpt-manifest.json" ||
  fail "two identical reshards wrote different manifests"
"$BIN" to-universal -q --inject-missing-state "$SRC" "$T/u" || fail "to-universal"
says_zckpt "$T/u/zckpt-manifest.json"
"$BIN" consolidate -q "$SRC" "$T/hf/" || fail "consolidate"
says_zckpt "$T/hf/zckpt-manifest.json"
cp -r "$SRC" "$T/ds"
"$BIN" verify -q --write-manifest "$T/ds" >/dev/null || fail "verify --write-manifest"
says_zckpt "$T/ds/global_step2/zckpt-manifest.json"
echo "ok: every manifest names zckpt $version"
