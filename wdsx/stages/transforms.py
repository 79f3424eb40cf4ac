"""Per-sample stages: map, decode, to_tuple, select, rename... with webdataset's semantics.

Each constructor returns a :class:`~wdsx.stages.base.Stage`, usable in ``DataPipeline(...)``, in
the fluent methods, or directly on an iterator (``wds.map(f)(samples)``). Errors go to the
stage's handler: True skips the item, False ends the stream, raising propagates. None results
of ``map`` drop the item, as in webdataset.

The function a :class:`Transform` applies is an instance of a module-level class holding the
stage's arguments, never a closure: a pipeline is pickled to reach DataLoader workers started
with ``spawn`` or ``forkserver``, and pickle cannot name a function local to a factory.
"""

from __future__ import annotations

import builtins
import fnmatch
import inspect
import io
import re
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

from wdsx.codecs.decode import Decoder, ImageHandler, unpickle_loads
from wdsx.core import rng
from wdsx.core.errors import Handler, reraise_exception
from wdsx.stages.base import Count, Run, Stage
from wdsx.stages.helpers import find_decoder
from wdsx.state import validate
from wdsx.state.checkpoint import JsonDict
from wdsx.state.position import Position, PositionTable


def _name(f: Any) -> str:
    return getattr(f, "__qualname__", None) or type(f).__name__


def cheapest_call(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``fn``, or, for an instance of a class whose ``__call__`` is written in Python, that
    ``__call__`` bound to it: the same call, without the look-up through the class that
    calling the instance itself pays on every item (it triples the cost of a small call)."""
    method = inspect.getattr_static(type(fn), "__call__", None)
    if isinstance(method, types.FunctionType):
        return types.MethodType(method, fn)
    return fn


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
        fn, handler = cheapest_call(self.fn), self.handler
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
    return Transform(KeepingKey(f), f"map({_name(f)})", handler)


class KeepingKey:
    """``map``'s function: ``f`` of the sample, a dict result given the sample's ``__key__``."""

    __slots__ = ("f",)

    def __init__(self, f: Callable[[Any], Any]):
        self.f = f

    def __call__(self, sample: Any) -> Any:
        result = self.f(sample)
        if isinstance(sample, dict) and isinstance(result, dict):
            result["__key__"] = sample.get("__key__")
        return result


def map_dict(handler: Handler = reraise_exception, **fields: Callable[[Any], Any]) -> Transform:
    """Apply a function per field: ``map_dict(jpg=augment, cls=int)``."""
    if not fields:
        raise ValueError("map_dict needs at least one field=function")
    return Transform(
        FieldFunctions(fields),
        f"map_dict({', '.join(f'{k}={_name(f)}' for k, f in fields.items())})",
        handler,
    )


class FieldFunctions:
    """``map_dict``'s function: each named field of a dict sample replaced by its function of it."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Callable[[Any], Any]]):
        self.fields = fields

    def __call__(self, sample: dict) -> dict:
        for key, f in self.fields.items():
            sample[key] = f(sample[key])
        return sample


def map_tuple(*fns: Callable[[Any], Any] | None, handler: Handler = reraise_exception) -> Transform:
    """Apply the i-th function to the i-th element of tuple samples (None: unchanged)."""
    return Transform(ElementFunctions(list(fns)), f"map_tuple({', '.join(_name(f) for f in fns)})", handler)


class ElementFunctions:
    """``map_tuple``'s function: element i of a tuple or list sample replaced by function i of
    it (None, or no function i: unchanged); the result is a tuple."""

    __slots__ = ("functions",)

    def __init__(self, functions: list[Callable[[Any], Any] | None]):
        self.functions = functions

    def __call__(self, sample: tuple | list) -> tuple:
        return tuple(transform_with(sample, self.functions))


def getfirst(a: dict, keys: str | list[str], default: Any = None, missing_is_error: bool = True) -> Any:
    """The value in the dict ``a`` of the first of ``keys`` (a list, or a ``"jpg;png"``
    string) present (the parameter's name is webdataset's)."""
    if isinstance(keys, str):
        keys = keys.split(";")
    for key in keys:
        if key in a:
            return a[key]
    if missing_is_error:
        raise ValueError(f"none of {keys} in sample fields {list(a.keys())}")
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
    if none_is_error is None:
        none_is_error = missing_is_error
    extract = FieldTuple(fields, missing_is_error, none_is_error)
    return Transform(extract, f"to_tuple({', '.join(fields)})", handler, structural=True)


class FieldTuple:
    """``to_tuple``'s function: the tuple of a dict sample's values for ``fields``, each the
    first present of its ``;``-separated alternatives (or of its list of them)."""

    __slots__ = ("fields", "specs", "missing_is_error", "none_is_error")

    def __init__(self, fields: tuple, missing_is_error: bool, none_is_error: bool):
        self.fields = fields
        self.specs = [field.split(";") if isinstance(field, str) else list(field) for field in fields]
        self.missing_is_error = missing_is_error
        self.none_is_error = none_is_error

    def __call__(self, sample: dict) -> tuple:
        missing_is_error = self.missing_is_error
        result = tuple([getfirst(sample, spec, None, missing_is_error) for spec in self.specs])
        if self.none_is_error and any(value is None for value in result):
            raise ValueError(
                f"to_tuple{self.fields}: missing field in sample with fields {list(sample.keys())}"
            )
        return result


def rename(handler: Handler = reraise_exception, keep: bool = True, **names: str) -> Transform:
    """Rename fields: ``rename(image="jpg;png")``; ``keep=False`` drops the other fields."""
    label = f"rename({', '.join(f'{k}={v}' for k, v in names.items())})"
    return Transform(RenamedFields(names, keep), label, handler, structural=True)


class RenamedFields:
    """``rename``'s function: each new name given the first present of its old names; with
    ``keep``, the fields not renamed stay, else only the renamed ones are left."""

    __slots__ = ("names", "keep", "replaced")

    def __init__(self, names: dict[str, Any], keep: bool):
        self.names = names
        self.keep = keep
        self.replaced = {
            old for spec in names.values() for old in (spec.split(";") if isinstance(spec, str) else spec)
        }

    def __call__(self, sample: dict) -> dict:
        if not self.keep:
            return {new: getfirst(sample, old) for new, old in self.names.items()}
        replaced = self.replaced
        result = {key: value for key, value in sample.items() if key not in replaced}
        result.update({new: getfirst(sample, old) for new, old in self.names.items()})
        return result


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
    return Transform(
        PatternRenaming(rules, keep_unselected, must_match, duplicate_is_error), f"rename_keys({rules})"
    )


class PatternRenaming:
    """``rename_keys``'s function: each field whose lower-cased file name matches a rule's glob
    pattern renamed to that rule's name (the last matching rule wins)."""

    __slots__ = ("rules", "keep_unselected", "must_match", "duplicate_is_error")

    def __init__(
        self, rules: list[tuple[str, str]], keep_unselected: bool, must_match: bool, duplicate_is_error: bool
    ):
        self.rules = rules
        self.keep_unselected = keep_unselected
        self.must_match = must_match
        self.duplicate_is_error = duplicate_is_error

    def __call__(self, sample: dict) -> dict:
        rules = self.rules
        result: dict = {}
        matched = dict.fromkeys((pattern for pattern, _ in rules), False)
        for path, value in sample.items():
            name = path.rsplit("/", 1)[-1].lower()
            target = next((new for pattern, new in reversed(rules) if fnmatch.fnmatch(name, pattern)), None)
            if target is None:
                if self.keep_unselected:
                    result[path] = value
                continue
            for pattern, _ in rules:
                if fnmatch.fnmatch(name, pattern):
                    matched[pattern] = True
            if target in result:
                if self.duplicate_is_error:
                    raise ValueError(f"two fields of {list(sample.keys())} are renamed to {target!r}")
                continue
            result[target] = value
        if self.must_match and not all(matched.values()):
            raise ValueError(f"patterns {[p for p, hit in matched.items() if not hit]} matched no field")
        return result


def extract_keys(*patterns: str, duplicate_is_error: bool = True, ignore_missing: bool = False) -> Transform:
    """Tuples of the fields matching each glob pattern (``"*.jpg;*.png"``)."""
    return Transform(
        PatternTuple(patterns, duplicate_is_error, ignore_missing), f"extract_keys({', '.join(patterns)})"
    )


class PatternTuple:
    """``extract_keys``'s function: the tuple of a dict sample's values whose field names
    (with or without a leading dot) match each pattern's ``;``-separated globs."""

    __slots__ = ("patterns", "duplicate_is_error", "ignore_missing")

    def __init__(self, patterns: tuple[str, ...], duplicate_is_error: bool, ignore_missing: bool):
        self.patterns = patterns
        self.duplicate_is_error = duplicate_is_error
        self.ignore_missing = ignore_missing

    def __call__(self, sample: dict) -> tuple:
        result = []
        for pattern in self.patterns:
            alternatives = pattern.split(";") if isinstance(pattern, str) else pattern
            matches = [
                key
                for key in sample
                if any(fnmatch.fnmatch("." + key, p) or fnmatch.fnmatch(key, p) for p in alternatives)
            ]
            if not matches:
                if self.ignore_missing:
                    continue
                raise ValueError(f"no field of {list(sample.keys())} matches {pattern!r}")
            if len(matches) > 1 and self.duplicate_is_error:
                raise ValueError(f"several fields {matches} match {pattern!r}")
            result.append(sample[matches[0]])
        return tuple(result)


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
    decoders = list(defaults) + list(pairs) + [("*." + ext, f) for ext, f in by_ext.items()]
    return Transform(StreamDecoding(decoders, must_decode), "xdecode")


class StreamDecoding:
    """``xdecode``'s function: each field but the ``__`` ones decoded by the function of the
    last ``(glob pattern, function)`` pair matching its name (see
    :func:`~wdsx.stages.helpers.find_decoder`), given the bytes as a stream; a False
    function leaves the field as it is, and so does no match unless ``must_decode``."""

    __slots__ = ("decoders", "must_decode")

    def __init__(self, decoders: list[tuple[str, Any]], must_decode: bool):
        self.decoders = decoders
        self.must_decode = must_decode

    def __call__(self, sample: dict) -> dict:
        result = {}
        for path, data in sample.items():
            if path.startswith("__"):
                result[path] = data
                continue
            decoder = find_decoder(self.decoders, path)
            if decoder is None:
                if self.must_decode:
                    raise ValueError(f"no decoder for field {path!r}")
                result[path] = data
            elif decoder is False:
                result[path] = data
            else:
                result[path] = decoder(io.BytesIO(data) if isinstance(data, bytes) else data)
        return result


def associate(associator: Callable[[str], dict] | dict, **_: Any) -> Transform:
    """Merge extra fields looked up by ``__key__`` (a function or a dict) into each sample."""
    return Transform(Associated(associator), f"associate({_name(associator)})")


class Associated:
    """``associate``'s function: the sample updated with the fields ``associator`` gives its
    ``__key__`` (a function of the key, or a dict by key)."""

    __slots__ = ("associator",)

    def __init__(self, associator: Callable[[str], dict] | dict):
        self.associator = associator

    def __call__(self, sample: dict) -> dict:
        key = sample["__key__"]
        associator = self.associator
        extra = associator(key) if callable(associator) else associator.get(key, {})
        sample.update(extra)
        return sample


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
        return cls(validate.integer(validate.mapping(data), "count"))

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
