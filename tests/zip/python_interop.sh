#!/bin/sh
# python_interop.sh: Python's zipfile must read what zckpt's zip writer writes (testzip()
# verifies every CRC), plain, with forced ZIP64 records, and past 4 GiB (sparse file; there
# only the small entries are read). Exit 77 (skip) without python3.
# Usage: python_interop.sh PATH/TO/zip_write_sample
set -eu
sample=$1
py=${ZCK_PYTHON3:-python3}
command -v "$py" >/dev/null 2>&1 || { echo "SKIP: no python3"; exit 77; }
"$py" -c 'import zipfile' 2>/dev/null || { echo "SKIP: python3 has no zipfile"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/zckpt-zip-interop-XXXXXX")
trap 'rm -rf "$dir"' EXIT INT TERM
for mode in plain zip64 sparse; do
  "$sample" "$dir/$mode.zip" "$mode"
  "$py" - "$dir/$mode.zip" "$mode" <<'PY'
import sys, zipfile
path, mode = sys.argv[1], sys.argv[2]
want = {"t/data.pkl": 77, "t/byteorder": 6, "t/data/0": 100000, "t/data/1": 0, "t/data/2": 64, "t/version": 2}
if mode == "sparse":
    want["t/hole"] = 1 << 32
with zipfile.ZipFile(path) as z:
    infos = z.infolist()
    got = {i.filename: i.file_size for i in infos}
    assert got == want, (got, want)
    for i in infos:
        assert i.compress_type == zipfile.ZIP_STORED, i.filename
        if i.filename == "t/hole":
            continue
        data = z.read(i.filename)  # checks the CRC
        n = len(data)
        assert data == bytes((k * 13 + n) & 0xff for k in range(n)), i.filename
        # torch's alignment: the data of every entry starts at a multiple of 64
        with open(path, "rb") as f:
            f.seek(i.header_offset + 26)
            hdr = f.read(4)
        start = i.header_offset + 30 + int.from_bytes(hdr[:2], "little") + int.from_bytes(hdr[2:], "little")
        assert start % 64 == 0, (i.filename, start)
    if mode == "sparse":
        assert got["t/hole"] == 1 << 32
        assert z.getinfo("t/version").header_offset > 0xFFFFFFFF
    else:
        bad = z.testzip()
        assert bad is None, bad
print(f"{mode}: python zipfile reads {len(want)} entries")
PY
done
