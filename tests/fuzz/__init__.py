"""A fuzzing harness for wdsx's reading API: mutated and truncated shards must end in a wdsx
error or in exactly the samples tar's rules give, within a time and memory budget.

- :mod:`tests.fuzz.tarbytes`: tar headers, pax records and checksums as raw bytes;
- :mod:`tests.fuzz.corpus`: the small, valid shards that inputs start from;
- :mod:`tests.fuzz.mutate`: the mutations (bit flips, header fields, extended headers, zero
  blocks, block edits, truncation, compressed-stream damage);
- :mod:`tests.fuzz.oracle`: what an input should give, from Python's ``tarfile`` and
  webdataset's grouping (independent of wdsx);
- :mod:`tests.fuzz.target`: one input through wdsx's public reading API, classified;
- :mod:`tests.fuzz.campaign`: many inputs in worker processes, each under a watchdog and a
  memory cap, summarised by outcome class (``python -m tests.fuzz``, ``make fuzz``).
"""
