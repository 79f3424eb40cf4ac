"""The ``wdsx`` command (:mod:`wdsx.commands.cli`) and its subcommands, one module each: convert,
index, info, ls, cat, verify, bench. They parse arguments and print; the work is done by the
library layers they call."""
