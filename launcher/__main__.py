"""``python -m erdmampi.launcher`` is ``erdmarun``."""
import sys

from .cli import main

sys.exit(main())
