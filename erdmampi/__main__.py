"""``python -m erdmampi script.py``: run a script, aborting the job on an uncaught exception."""

from .run import main

main()
