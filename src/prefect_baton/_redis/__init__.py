"""Redis fast path for leases."""
