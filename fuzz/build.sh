#!/usr/bin/env bash
# Build the libFuzzer harnesses fuzz/c/fuzz_<target>.c into build/fuzz/fuzz_<target>
# (clang -g -O1 -fsanitize=fuzzer,address,undefined; see fuzz/README.md).
#
#   fuzz/build.sh [fuzz_<target> ...]     default: every fuzz/c/fuzz_*.c
#
# A harness names what it needs besides itself in comment lines among its
# first 20 lines (paths relative to the repository root):
#   // fuzz-sources: ext/src/erdma_nat.c
#   // fuzz-cflags: -DSOMETHING
# Every harness gets ext/include and ext/src on its include path and links
# ngtcp2/GnuTLS.  A harness is rebuilt only when it, a source it names or an
# engine header is newer than its binary.  ERDMA_FUZZ_BUILD moves the output.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${ERDMA_FUZZ_BUILD:-$ROOT/build/fuzz}"
CC="${CC:-clang}"
command -v "$CC" >/dev/null || { echo "fuzz/build.sh: $CC not found (apt-get install clang)" >&2; exit 2; }
mkdir -p "$OUT"

PKGS=(libngtcp2 libngtcp2_crypto_gnutls gnutls)
read -r -a PKG_CFLAGS <<<"$(pkg-config --cflags "${PKGS[@]}" 2>/dev/null || true)"
read -r -a PKG_LIBS <<<"$(pkg-config --libs "${PKGS[@]}" 2>/dev/null || true)"
# UBSan findings abort like ASan's, so libFuzzer keeps the input
BASE=(-g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
      -fno-omit-frame-pointer -Iext/include -Iext/src)

if [ $# -gt 0 ]; then
    HARNESSES=()
    for t in "$@"; do
        t="${t%.c}"; t="${t##*/}"
        [ -f "fuzz/c/$t.c" ] || { echo "fuzz/build.sh: no fuzz/c/$t.c" >&2; exit 2; }
        HARNESSES+=("fuzz/c/$t.c")
    done
else
    shopt -s nullglob
    HARNESSES=(fuzz/c/fuzz_*.c)
fi

fail=0
for h in "${HARNESSES[@]}"; do
    name="$(basename "$h" .c)"
    read -r -a srcs <<<"$(head -n 20 "$h" | sed -n 's|^// fuzz-sources:||p' | tr '\n' ' ')"
    read -r -a cflags <<<"$(head -n 20 "$h" | sed -n 's|^// fuzz-cflags:||p' | tr '\n' ' ')"
    bin="$OUT/$name"
    stale=0
    if [ ! -x "$bin" ]; then
        stale=1
    else
        for f in "$h" "${srcs[@]}" ext/src/*.h ext/include/*.h "$0"; do
            if [ "$f" -nt "$bin" ]; then stale=1; break; fi
        done
    fi
    if [ "$stale" -eq 0 ]; then
        echo "fuzz/build.sh: $name is up to date"
        continue
    fi
    echo "fuzz/build.sh: building $name"
    if "$CC" "${BASE[@]}" "${PKG_CFLAGS[@]}" "${cflags[@]}" -o "$bin.tmp" "$h" "${srcs[@]}" \
            "${PKG_LIBS[@]}" -lpthread; then
        mv -f "$bin.tmp" "$bin"
    else
        rm -f "$bin.tmp"
        echo "fuzz/build.sh: building $name FAILED" >&2
        fail=1
    fi
done
exit "$fail"
