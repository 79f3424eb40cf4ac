"""Per-sample stages: map, decode, to_tuple, select, rename... with webdataset's semantics.

Each constructor returns a :class:`~wdsx.stages.base.Stage`, usable in ``DataPipeline(...)``, in
the fluent methods, or directly on an iterator (``wds.map(f)(samples)``). Errors go to the
stage's handler: True skips the item, False ends the stream, raising propagates. None results
of ``map`` drop the item, as in webdataset.
"""

from __future__ import annotations

import builtins
import fnmatch
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from wdsx.codecs.decode import Decoder, ImageHandler, unpickle_loads
from wdsx.core import rng
from wdsx.core.errors import Handler, reraise_exception
from wdsx.stages.base import Count, Run, Stage
from wdsx.state.checkpoint import JsonDict
from wdsx.state.position import Position, PositionTable


def _name(f: Any) -> str:
    return getattr(f, "__qualname__", None) or type(f).__name__


def _note(exn: BaseException, sample: Any) -> None:
    """Attach the sample's key and shard to an exception raised by user code."""
    if isinstance(sample, dict) and hasattr(exn, "add_note"):
        exn.add_note(f"while processing sample {sample.get('__key__')!r} from {sample.get('__url__')}")


class Transform(Stage):
    """A stage applying ``fn`` to each item; None results are dropped.

    ``structural`` marks a transform that only picks, renames or reorders fields: it never
    looks at their values and never drops an item, so the pipeline may hand it values whose
    decoding is left to the batch they end up in (:mod:`wdsx.stages.plan`)."""

    def __init__(
        self,
        fn: Callable[[Any], Any],
        label: str,
        handler: Handler = reraise_exception,
        structural: bool = False,
    ):
        self.fn = fn
        self.label = label
        self.handler = handler
        self.structural = structural

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        fn, handler = self.fn, self.handler
        for sample in upstream:
            try:
                result = fn(sample)
            except Exception as exn:
                _note(exn, sample)
                if handler(exn):
                    continue
                break
            if result is not None:
                yield result

    def replay(self, item: Any) -> Any:
        return self.fn(item)

    def count_after(self, count: Count) -> Count:
        """One output per input (a function returning None, which drops the item, makes an
        epoch shorter than this says)."""
        return count

    def describe(self) -> str:
        return self.label


def map(f: Callable[[Any], Any], handler: Handler = reraise_exception) -> Transform:  # noqa: A001
    """Apply ``f`` to each sample; a dict result keeps the sample's ``__key__``."""

    def apply_f(sample: Any) -> Any:
        result = f(sample)
        if isinstance(sample, dict) and isinstance(result, dict):
            result["__key__"] = sample.get("__key__")
        return result

    return Transform(apply_f, f"map({_name(f)})", handler)


def map_dict(handler: Handler = reraise_exception, **fields: Callable[[Any], Any]) -> Transform:
    """Apply a function per field: ``map_dict(jpg=augment, cls=int)``."""
    if not fields:
        raise ValueError("map_dict needs at least one field=function")

    def apply_fields(sample: dict) -> dict:
        for key, f in fields.items():
            sample[key] = f(sample[key])
        return sample

    return Transform(
        apply_fields, f"map_dict({', '.join(f'{k}={_name(f)}' for k, f in fields.items())})", handler
    )


def map_tuple(*fns: Callable[[Any], Any] | None, handler: Handler = reraise_exception) -> Transform:
    """Apply the i-th function to the i-th element of tuple samples (None: unchanged)."""

    functions = list(fns)

    def apply_elements(sample: tuple | list) -> tuple:
        return tuple(transform_with(sample, functions))

    return Transform(apply_elements, f"map_tuple({', '.join(_name(f) for f in fns)})", handler)


def getfirst(sample: dict, keys: str | list[str], default: Any = None, missing_is_error: bool = True) -> Any:
    """The value of the first of ``keys`` (a list, or a ``"jpg;png"`` string) present."""
    if isinstance(keys, str):
        keys = keys.split(";")
    for key in keys:
        if key in sample:
            return sample[key]
    if missing_is_error:
        raise ValueError(f"none of {keys} in sample fields {list(sample.keys())}")
    return default


def to_tuple(
    *fields: str,
    handler: Handler = reraise_exception,
    missing_is_error: bool = True,
    none_is_error: bool | None = None,
) -> Transform:
    """Turn dict samples into tuples of the named fields; ``"jpg;png"`` takes the first present."""
    if len(fields) == 1 and isinstance(fields[0], str) and " " in fields[0]:
        fields = tuple(fields[0].split())
    specs = [field.split(";") if isinstance(field, str) else list(field) for field in fields]
    if none_is_error is None:
        none_is_error = missing_is_error

    def extract(sample: dict) -> tuple:
        result = tuple(getfirst(sample, spec, None, missing_is_error) for spec in specs)
        if none_is_error and any(value is None for value in result):
            raise ValueError(f"to_tuple{fields}: missing field in sample with fields {list(sample.keys())}")
        return result

    return Transform(extract, f"to_tuple({', '.join(fields)})", handler, structural=True)


def rename(handler: Handler = reraise_exception, keep: bool = True, **names: str) -> Transform:
    """Rename fields: ``rename(image="jpg;png")``; ``keep=False`` drops the other fields."""

    def apply_names(sample: dict) -> dict:
        if not keep:
            return {new: getfirst(sample, old) for new, old in names.items()}
        replaced = {
            old for spec in names.values() for old in (spec.split(";") if isinstance(spec, str) else spec)
        }
        result = {key: value for key, value in sample.items() if key not in replaced}
        result.update({new: getfirst(sample, old) for new, old in names.items()})
        return result

    label = f"rename({', '.join(f'{k}={v}' for k, v in names.items())})"
    return Transform(apply_names, label, handler, structural=True)


def decode(*handlers: Any, handler: Handler = reraise_exception, **options: Any) -> Transform:
    """Decode fields by extension; strings are image specs (``"rgb8"``, ``"pil"``...)."""
    decoder = Decoder([ImageHandler(h) if isinstance(h, str) else h for h in handlers], **options)
    return Transform(
        decoder, f"decode({', '.join(h if isinstance(h, str) else _name(h) for h in handlers)})", handler
    )


def rename_keys(
    *pairs: tuple[str, str],
    keep_unselected: bool = False,
    must_match: bool = True,
    duplicate_is_error: bool = True,
    **names: str,
) -> Transform:
    """Rename fields whose name (lower-cased, directory stripped) matches glob patterns:
    ``rename_keys(image="*.jpg")``; the last matching pattern wins."""
    rules = [(pattern, new) for new, pattern in pairs] + [(pattern, new) for new, pattern in names.items()]

    def apply_rules(sample: dict) -> dict:
        result: dict = {}
        matched = dict.fromkeys((pattern for pattern, _ in rules), False)
        for path, value in sample.items():
            name = path.rsplit("/", 1)[-1].lower()
            target = next((new for pattern, new in reversed(rules) if fnmatch.fnmatch(name, pattern)), None)
            if target is None:
                if keep_unselected:
                    result[path] = value
                continue
            for pattern, _ in rules:
                if fnmatch.fnmatch(name, pattern):
                    matched[pattern] = True
            if target in result:
                if duplicate_is_error:
                    raise ValueError(f"two fields of {list(sample.keys())} are renamed to {target!r}")
                continue
            result[target] = value
        if must_match and not all(matched.values()):
            raise ValueError(f"patterns {[p for p, hit in matched.items() if not hit]} matched no field")
        return result

    return Transform(apply_rules, f"rename_keys({rules})")


def extract_keys(*patterns: str, duplicate_is_error: bool = True, ignore_missing: bool = False) -> Transform:
    """Tuples of the fields matching each glob pattern (``"*.jpg;*.png"``)."""

    def extract(sample: dict) -> tuple:
        result = []
        for pattern in patterns:
            alternatives = pattern.split(";") if isinstance(pattern, str) else pattern
            matches = [
                key
                for key in sample
                if any(fnmatch.fnmatch("." + key, p) or fnmatch.fnmatch(key, p) for p in alternatives)
            ]
            if not matches:
                if ignore_missing:
                    continue
                raise ValueError(f"no field of {list(sample.keys())} matches {pattern!r}")
            if len(matches) > 1 and duplicate_is_error:
                raise ValueError(f"several fields {matches} match {pattern!r}")
            result.append(sample[matches[0]])
        return tuple(result)

    return Transform(extract, f"extract_keys({', '.join(patterns)})")


def decode_text(stream: Any) -> str:
    """xdecode's reader for text fields: the stream's bytes as UTF-8."""
    return stream.read().decode("utf-8")


def decode_bin(stream: Any) -> bytes:
    """xdecode's reader for binary fields: the stream's bytes."""
    return stream.read()


def decode_pickle(stream: Any) -> Any:
    """xdecode's reader for pickled fields: refused unless pickle is allowed, as in ``decode``
    (see :func:`wdsx.codecs.decode.unpickle_loads`)."""
    return unpickle_loads(stream.read())


default_decoders = [("*.bin", decode_bin), ("*.txt", decode_text), ("*.pyd", decode_pickle)]


def xdecode(
    *pairs: tuple[str, Callable],
    must_decode: bool = True,
    defaults: list = default_decoders,
    **by_ext: Callable,
) -> Transform:
    """Decode fields with stream functions chosen by glob pattern; the last match wins."""
    import io

    decoders = list(defaults) + list(pairs) + [("*." + ext, f) for ext, f in by_ext.items()]

    def decode_fields(sample: dict) -> dict:
        result = {}
        for path, data in sample.items():
            if path.startswith("__"):
                result[path] = data
                continue
            name = path.rsplit("/", 1)[-1].lower()
            decoder = next(
                (
                    f
                    for pattern, f in reversed(decoders)
                    if fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch("." + name, pattern)
                ),
                None,
            )
            if decoder is None:
                if must_decode:
                    raise ValueError(f"no decoder for field {path!r}")
                result[path] = data
            elif decoder is False:
                result[path] = data
            else:
                result[path] = decoder(io.BytesIO(data) if isinstance(data, bytes) else data)
        return result

    return Transform(decode_fields, "xdecode")


def associate(associator: Callable[[str], dict] | dict, **_: Any) -> Transform:
    """Merge extra fields looked up by ``__key__`` (a function or a dict) into each sample."""

    def add(sample: dict) -> dict:
        key = sample["__key__"]
        extra = associator(key) if callable(associator) else associator.get(key, {})
        sample.update(extra)
        return sample

    return Transform(add, f"associate({_name(associator)})")


class Select(Stage):
    """Keep the items for which ``predicate`` is true."""

    def __init__(self, predicate: Callable[[Any], bool]):
        self.predicate = predicate

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        predicate = self.predicate
        return (item for item in upstream if predicate(item))

    def describe(self) -> str:
        return f"select({_name(self.predicate)})"


def select(predicate: Callable[[Any], bool]) -> Select:
    """Keep the samples for which ``predicate(sample)`` is true."""
    return Select(predicate)


class _Counter:
    """A stage state that is just a count of upstream items taken this epoch."""

    __slots__ = ("count",)

    def __init__(self, count: int = 0):
        self.count = count

    def to_json(self, table: PositionTable) -> JsonDict:
        return {"count": self.count}

    @classmethod
    def from_json(cls, data: JsonDict, table: PositionTable) -> _Counter:
        return cls(int(data["count"]))

    def held(self) -> list[Position]:
        return []


class Slice(Stage):
    """``itertools.islice`` over the stream, with the count kept in checkpoints."""

    state_key = "slice"
    state_type = _Counter

    def __init__(self, *args: int | None):
        bounds = builtins.slice(*args)
        self.start, self.stop, self.step = bounds.start or 0, bounds.stop, bounds.step or 1

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        return self._slice(upstream, run.attach(index, _Counter)[0])

    def _slice(self, upstream: Iterator, counter: _Counter) -> Iterator:
        start, stop, step = self.start, self.stop, self.step
        if stop is not None and counter.count >= stop:
            return
        for item in upstream:
            number = counter.count
            counter.count = number + 1
            if number >= start and (number - start) % step == 0:
                yield item
            if stop is not None and counter.count >= stop:
                return

    def count_after(self, count: Count) -> Count:
        taken = len(
            range(self.start, count.items if self.stop is None else min(self.stop, count.items), self.step)
        )
        samples = taken if count.single else count.samples * taken // max(1, count.items)
        return Count(taken, samples, count.single)

    def describe(self) -> str:
        return f"slice({self.start}, {self.stop}, {self.step})"


def slice(*args: int | None) -> Slice:  # noqa: A001
    """Like ``itertools.islice(stream, *args)``."""
    return Slice(*args)


class RandomSample(Stage):
    """Keep each item with probability ``p``, from a seeded, checkpointed random stream."""

    state_key = "rsample"
    state_type = _Counter

    def __init__(self, p: float = 0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"rsample probability must be in [0, 1], got {p}")
        self.p = p

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        counter, _ = run.attach(index, _Counter)
        seed = rng.derive_seed("rsample", run.seed, run.epoch, run.topology.consumer, index)
        threshold = int(self.p * 2**64)
        for item in upstream:
            keep = rng.draw(seed, counter.count) < threshold
            counter.count += 1
            if keep:
                yield item

    def describe(self) -> str:
        return f"rsample({self.p})"


def rsample(p: float = 0.5) -> RandomSample:
    """Keep each sample with probability ``p`` (deterministic given the pipeline seed)."""
    return RandomSample(p)


class LogKeys(Stage):
    """Append ``index, key`` lines to a file for every sample passing (webdataset's log_keys)."""

    def __init__(self, logfile: str | None = None):
        self.logfile = logfile

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        if not self.logfile:
            yield from upstream
            return
        with open(self.logfile, "a") as stream:
            for number, sample in enumerate(upstream):
                key = sample.get("__key__") if isinstance(sample, dict) else None
                stream.write(f"{number}\t{run.topology.worker}\t{run.topology.rank}\t{key}\n")
                yield sample

    def describe(self) -> str:
        return "log_keys"


def log_keys(logfile: str | None = None) -> LogKeys:
    return LogKeys(logfile)


class Info(Stage):
    """Print the first ``n`` items (and every ``every``-th) to ``stream``, passing all through."""

    def __init__(
        self,
        fmt: str | None = None,
        n: int = 3,
        every: int = -1,
        width: int = 50,
        stream: Any = None,
        name: str = "",
    ):
        self.fmt, self.n, self.every, self.width, self.stream, self.name = fmt, n, every, width, stream, name

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        stream = self.stream or sys.stderr
        for number, item in enumerate(upstream):
            if number < self.n or (self.every > 0 and (number + 1) % self.every == 0):
                text = self.fmt.format(**item) if self.fmt and isinstance(item, dict) else repr(item)
                print(self.name, number, re.sub(r"\s+", " ", text)[: self.width], file=stream)
            yield item


def info(
    fmt: str | None = None, n: int = 3, every: int = -1, width: int = 50, stream: Any = None, name: str = ""
) -> Info:
    return Info(fmt, n, every, width, stream, name)


def transform_with(sample: list | tuple, transformers: list[Callable | None]) -> list:
    """Apply ``transformers[i]`` to ``sample[i]`` (missing or None transformers: unchanged)."""
    result = list(sample)
    for i, f in enumerate(transformers[: len(result)]):
        if f is not None:
            result[i] = f(result[i])
    return result
