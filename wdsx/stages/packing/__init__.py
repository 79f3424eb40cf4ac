"""The parts of sequence packing (:mod:`wdsx.stages.pack`): where documents go
(:mod:`~wdsx.stages.packing.strategies`), how a row is laid out (:mod:`~wdsx.stages.packing.rows`)
and what a checkpoint keeps (:mod:`~wdsx.stages.packing.state`)."""
