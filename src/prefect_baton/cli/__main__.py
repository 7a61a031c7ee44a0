"""``python -m prefect_baton.cli``: the ``baton`` command."""

from prefect_baton.cli import main

raise SystemExit(main())
