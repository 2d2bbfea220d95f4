#!/usr/bin/env bash
# Prepare a Debian 12 machine for erdmampi: system packages, the project
# virtualenv (.venv), mpi4py built against Debian's MPICH (the reference used
# by the tests) and an editable install of erdmampi (compiles the C engine).
#
# Safe to re-run: each step is skipped when its result is already there,
# except the last, which rebuilds the engine when its sources changed.
# Works as root, or through sudo for the apt step.
#
#   bash scripts/setup.sh [--no-mpi4py]
#
#   --no-mpi4py   skip the mpi4py reference build (about 5 minutes of
#                 compiling); the demos do not need it, the tests do.
#
# Environment: PYTHON=/path/to/python3 picks the interpreter for a new .venv
# (default /usr/bin/python3, else python3 on PATH).
set -euo pipefail

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
trap 'printf "[setup] ERROR: command failed (line %s): %s\n" "$LINENO" "$BASH_COMMAND" >&2' ERR

WITH_MPI4PY=1
for arg in "$@"; do
    case "$arg" in
        --no-mpi4py) WITH_MPI4PY=0 ;;
        -h|--help) sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option: $arg (see --help)" ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"

# --- 1. system packages -----------------------------------------------------
APT_PACKAGES=(
    build-essential pkg-config python3-dev python3-venv
    libngtcp2-dev libngtcp2-crypto-gnutls-dev libgnutls28-dev gnutls-bin
    mpich libmpich-dev ngtcp2-client ngtcp2-server
    openssh-server openssh-client coturn iproute2 nftables iperf3 conntrack ethtool
    dpdk dpdk-dev libdpdk-dev
    clang libclang-rt-14-dev  # fuzz/: libFuzzer's runtime is only a Recommends of clang
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
    if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    say "system packages: all ${#APT_PACKAGES[@]} present"
else
    command -v apt-get >/dev/null || die "apt-get not found: this script targets Debian 12"
    if [ "$(id -u)" -eq 0 ]; then
        SUDO=()
    elif command -v sudo >/dev/null; then
        SUDO=(sudo)
    else
        die "not root and sudo is missing; install as root: apt-get install -y ${missing[*]}"
    fi
    say "system packages: installing ${missing[*]}"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}"
fi

for pc in libngtcp2 libngtcp2_crypto_gnutls gnutls; do
    pkg-config --exists "$pc" || die "pkg-config cannot find $pc after the apt step"
done
command -v mpicc >/dev/null || die "mpicc not found after installing mpich"

# --- 2. the project virtualenv (PEP 668: never pip-install into the system) --
if [ -x "$VPY" ] && "$VPY" -c 'import sys, pip' >/dev/null 2>&1; then
    say "virtualenv: $VENV ($("$VPY" -c 'import sys; print("Python %d.%d.%d" % sys.version_info[:3])'))"
else
    if [ -n "${PYTHON:-}" ]; then
        BASE_PY="$PYTHON"
    elif [ -x /usr/bin/python3 ]; then
        BASE_PY=/usr/bin/python3
    else
        BASE_PY="$(command -v python3)" || die "no python3 found"
    fi
    if [ -e "$VENV" ]; then
        say "virtualenv: $VENV is broken; recreating it with $BASE_PY"
        "$BASE_PY" -m venv --clear "$VENV"
    else
        say "virtualenv: creating $VENV with $BASE_PY"
        "$BASE_PY" -m venv "$VENV"
    fi
    "$VPY" -c 'import pip' || die "the new virtualenv has no pip (is python3-venv installed?)"
fi

# --- 3. Python dependencies ---------------------------------------------------
PY_PACKAGES=(setuptools wheel cffi numpy pytest pytest-timeout aioquic numba cryptography atheris
             sphinx myst-parser)
if "$VPY" - "${PY_PACKAGES[@]}" >/dev/null 2>&1 <<'EOF'
import sys
from importlib.metadata import version
for name in sys.argv[1:]:
    version(name)
EOF
then
    say "python packages: ${PY_PACKAGES[*]} present"
else
    say "python packages: installing ${PY_PACKAGES[*]}"
    "$VPY" -m pip install -q "${PY_PACKAGES[@]}"
fi
# torch for the "erdma" torch.distributed backend (erdmampi.torch) and its
# tests against gloo; 2.13.0 is the CPU wheel (other versions pull CUDA)
if "$VPY" -c "import torch" >/dev/null 2>&1; then
    say "torch present"
else
    say "python packages: installing torch==2.13.0"
    "$VPY" -m pip install -q torch==2.13.0
fi

# --- 4. mpi4py built against Debian's MPICH (the reference implementation) ---
mpi4py_ok() {
    "$VPY" - >/dev/null 2>&1 <<'EOF'
import re, subprocess
from mpi4py import MPI
assert "MPICH" in MPI.Get_library_version()
# linked to the system libmpich (/lib or /usr/lib), not one bundled in a wheel
libs = subprocess.run(["ldd", MPI.__file__], capture_output=True, text=True).stdout
assert any("libmpich" in l and re.search(r"=> (/usr)?/lib/", l) for l in libs.splitlines()), libs
EOF
}

if [ "$WITH_MPI4PY" -eq 0 ]; then
    say "mpi4py: skipped (--no-mpi4py); the tests need it"
elif mpi4py_ok; then
    say "mpi4py: present, linked to Debian MPICH"
else
    say "mpi4py: building against Debian MPICH (MPICC=mpicc, takes ~5 minutes)"
    MPICC=mpicc "$VPY" -m pip install -q --force-reinstall --no-deps --no-binary mpi4py mpi4py
    mpi4py_ok || die "mpi4py was built but does not load Debian's MPICH"
    say "mpi4py: OK"
fi

# --- 5. erdmampi itself (editable; compiles the cffi C engine) ---------------
say "erdmampi: pip install -e . (compiling the C engine)"
# _membuf was once built per Python version; a leftover would shadow the
# _membuf.abi3.so built now (the import system prefers the versioned name)
rm -f "$ROOT"/erdmampi/_membuf.cpython-*.so "$ROOT"/build/lib.*/erdmampi/_membuf.cpython-*.so
if ! "$VPY" -m pip install -q --no-deps --no-build-isolation -e "$ROOT"; then
    die "building erdmampi failed (see the compiler output above)"
fi
"$VPY" -c 'import erdmampi._erdma' \
    || die "erdmampi installed but its engine module erdmampi._erdma does not import"
[ -x "$VENV/bin/erdmarun" ] || die "erdmarun was not installed into $VENV/bin"
"$VENV/bin/erdmarun" --help >/dev/null || die "erdmarun is installed but does not start"
say "erdmampi: OK ($VENV/bin/erdmarun)"

say "done. Activate with: source .venv/bin/activate"
