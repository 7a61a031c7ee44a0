"""The decision core: every lease rule, validation and scope rule, with no I/O."""
