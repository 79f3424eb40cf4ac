"""Writing one planned shard: run the user's function on each of its inputs, write the
samples it returns into the shard (atomically), then leave a completion record beside it.

The record (``.<shard>.json``) says which plan the shard belongs to and what it holds; "record
present, plan the same, shard at the recorded size" is how a re-run knows a shard is done, and
the records are what the manifest is merged from (:mod:`wdsx.write.records`).
"""

from __future__ import annotations

import posixpath
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from wdsx.core.errors import WriteError
from wdsx.read.manifest import ShardEntry
from wdsx.sources import SourceOptions
from wdsx.write.plan import ShardJob
from wdsx.write.records import record_url, write_record
from wdsx.write.writer import TarWriter

__all__ = ["JobRunner", "SampleFunction", "WriteError", "samples_of"]

SampleFunction = Callable[[Any], "dict[str, Any] | Iterable[dict[str, Any]] | None"]
"""What turns one input into samples: a sample dict, an iterable of them, or None (no sample)."""


def samples_of(result: Any, input_number: int) -> Iterable[dict[str, Any]]:
    """The samples of one input's result, each with a key: a sample without ``__key__`` gets the
    input's number (``000000042``), further samples of the same input ``000000042_1``, ..."""
    if result is None:
        return
    for index, sample in enumerate([result] if isinstance(result, dict) else result):
        if not isinstance(sample, dict):
            raise TypeError(f"a sample must be a dict of fields, not {type(sample).__name__}")
        if "__key__" not in sample:
            key = f"{input_number:09d}" if index == 0 else f"{input_number:09d}_{index}"
            sample = {"__key__": key, **sample}
        yield sample


@dataclass(frozen=True)
class JobRunner:
    """Writes shard jobs with one sample function (picklable, so that it can be sent to a worker
    process or a Ray task).

    An input whose function raises is left out and reported (``skipped``), unless ``strict``;
    samples it gave before raising stay. Warnings raised while an input is handled are recorded
    with it instead of spilling onto stderr.
    """

    to_samples: SampleFunction
    strict: bool = False
    describe: Callable[[Any], str] = str
    """How an input is named in reports (its path, its record's key...)."""
    options: SourceOptions | None = None
    encoder: bool = True
    """Encode fields by extension, as ``TarWriter`` does; False: fields must already be bytes."""

    def __call__(self, job: ShardJob, progress: Callable[[int], object] = lambda n: None) -> dict[str, Any]:
        skipped: list[tuple[str, str]] = []
        noted: list[tuple[str, str]] = []
        with TarWriter(job.url, encoder=self.encoder, options=self.options) as writer:
            for input_number, item in job.inputs:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        for sample in samples_of(self.to_samples(item), input_number):
                            writer.write(sample)
                    except Exception as exn:
                        if writer.closed:  # the shard itself failed (a full disk): not this input
                            raise
                        reason = f"{type(exn).__name__}: {exn}"
                        if self.strict:
                            raise WriteError(f"{self.describe(item)}: {reason} (strict)") from exn
                        skipped.append((self.describe(item), reason))
                noted += [(self.describe(item), f"{w.category.__name__}: {w.message}") for w in caught]
                progress(1)
        entry = ShardEntry(posixpath.basename(job.url), writer.count, writer.bytes_written, writer.sha256)
        record = {"fingerprint": job.plan_id, "shard": asdict(entry), "skipped": skipped, "warnings": noted}
        write_record(record_url(job.url), record, self.options)
        return record
