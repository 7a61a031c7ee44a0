"""The sync and async client surfaces (``Baton``, ``AsyncBaton``) and the lease keeper."""
