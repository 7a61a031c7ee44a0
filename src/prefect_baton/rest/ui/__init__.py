"""The assets of the live page served at ``/ui`` (see :mod:`prefect_baton.rest._ui`)."""
