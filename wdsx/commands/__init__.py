"""Subcommands of the ``wdsx`` command that look into shards: info, ls, cat, verify, bench."""
