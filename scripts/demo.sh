#!/usr/bin/env bash
# Set up erdmampi (without the mpi4py reference build, which only the tests
# need) and run an example with 4 processes on this machine:
#
#   bash scripts/demo.sh [-n NPROCS] [pi|ring|allreduce_numpy|parallel_sum_obj|all]
#
# The default is pi (hpc_examples/pi.py).
set -euo pipefail

NP=4
DEMOS=()
while [ $# -gt 0 ]; do
    case "$1" in
        -n) NP="${2:?-n needs a number}"; shift 2 ;;
        -h|--help) sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
        all) DEMOS+=(pi ring allreduce_numpy parallel_sum_obj); shift ;;
        *) DEMOS+=("${1%.py}"); shift ;;
    esac
done
[ ${#DEMOS[@]} -gt 0 ] || DEMOS=(pi)

cd "$(dirname "${BASH_SOURCE[0]}")/.."
for d in "${DEMOS[@]}"; do
    [ -f "hpc_examples/$d.py" ] || { echo "[demo] no such example: hpc_examples/$d.py" >&2; exit 2; }
done

bash scripts/setup.sh --no-mpi4py

# shellcheck disable=SC1091
source .venv/bin/activate
for d in "${DEMOS[@]}"; do
    echo "[demo] erdmarun -n $NP python hpc_examples/$d.py"
    erdmarun -n "$NP" python "hpc_examples/$d.py"
done
