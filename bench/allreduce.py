"""Allreduce only: ``python -m bench.allreduce`` is ``python -m bench.collectives --ops allreduce``.

    erdmarun -n 4 python -m bench.allreduce --max-size 16MiB
"""
import os
import sys

if __package__ in (None, ""):  # run as a file: python bench/allreduce.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.collectives import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(default_ops=("allreduce",)))
