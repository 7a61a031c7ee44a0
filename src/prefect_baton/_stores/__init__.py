"""Stores: the protocol every lease authority implements, its factory, and one package per store
(the SQL ledger, the Redis fast path, the REST client)."""
