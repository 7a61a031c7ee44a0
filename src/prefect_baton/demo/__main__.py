"""``python -m prefect_baton.demo``: same as ``baton demo``."""

import sys

from . import main

sys.exit(main())
