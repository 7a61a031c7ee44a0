"""``python -m prefect_baton.demo``: same as ``baton demo``."""

import sys

from prefect_baton.demo import main

sys.exit(main())
