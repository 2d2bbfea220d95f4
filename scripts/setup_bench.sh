#!/usr/bin/env bash
# Install what the benchmark suite (bench/) needs beyond the test setup:
# torch==2.13.0 (a local CPU build, for the torch.distributed gloo stack)
# matplotlib (the PNG plot), and blosc2 + zstandard (the references of the
# codec benchmark, python -m bench.codecs) into the project virtualenv (.venv).
# Run scripts/setup.sh first. The tests do not need any of this.
#
#   bash scripts/setup_bench.sh
#
# Pin torch to 2.13.0: that version resolves to a local CPU-only wheel here,
# any other spec pulls gigabytes of CUDA packages.
set -euo pipefail

say() { printf '[setup_bench] %s\n' "$*"; }
die() { printf '[setup_bench] ERROR: %s\n' "$*" >&2; exit 1; }

case "${1:-}" in
    -h|--help) sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    "") ;;
    *) die "unknown option: $1 (see --help)" ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VPY="$ROOT/.venv/bin/python"
[ -x "$VPY" ] || die "$VPY not found: run scripts/setup.sh first"

if "$VPY" -c 'import torch, matplotlib; assert torch.__version__.startswith("2.13.0")' 2>/dev/null; then
    say "torch $("$VPY" -c 'import torch; print(torch.__version__)') and matplotlib present"
else
    say "installing torch==2.13.0 (CPU) and matplotlib (about a minute)"
    "$VPY" -m pip install -q "torch==2.13.0" matplotlib
fi
if "$VPY" -c 'import blosc2, zstandard' 2>/dev/null; then
    say "blosc2 $("$VPY" -c 'import blosc2; print(blosc2.__version__)') and zstandard present"
else
    say "installing blosc2 and zstandard (codec benchmark references)"
    "$VPY" -m pip install -q "blosc2==4.14.1" "zstandard==0.25.0"
fi
"$VPY" -c 'import torch.distributed as d; assert d.is_available() and d.is_gloo_available()' \
    || die "torch is installed but torch.distributed/gloo is not available"
say "done. Quick check: .venv/bin/python -m bench.run_all --quick"
