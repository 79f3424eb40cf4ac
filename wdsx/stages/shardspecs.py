"""webdataset's YAML dataset specs (``MultiShardSample``) and its other shard-spec helpers.

A spec names several datasets, each a list of shard patterns under an optional ``prefix`` and
``bucket``, and says how many of its shards an epoch takes: all of them, ``choose: n`` drawn
without replacement, or ``resample: n`` drawn with replacement::

    prefix: s3://my-bucket/
    datasets:
      - name: web
        shards: web-{000000..000099}.tar
        choose: 10
      - name: books
        shards: [books-{0000..0009}.tar]
        resample: 5

The epoch's shards are then shuffled together. Given ``set_epoch(seed)``, the list is a pure
function of the seed and the same, shard for shard, as webdataset's. YAML is read with
``yaml.safe_load`` (PyYAML is imported only here, when a spec file is read): a spec cannot
construct Python objects.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import braceexpand

from wdsx.core.env import seed_from_environment
from wdsx.core.utilities import is_iterable
from wdsx.sources.listing import expand_urls
from wdsx.stages.shardlists import SimpleShardList

log = logging.getLogger("wdsx")

default_rng = random.Random(seed_from_environment())
"""The generator of a ``MultiShardSample`` that was given no ``set_epoch``. webdataset's is
unseeded; wdsx's starts from ``WDS_SEED`` (0 by default), so runs repeat."""

_SPEC_KEYS = {"prefix", "datasets", "buckets"}
_DATASET_KEYS = {"buckets", "name", "shards", "resample", "choose"}


def expand(text: str) -> str:
    """``text`` with ``$VAR``/``${VAR}`` and a leading ``~`` expanded (``os.path``'s rules)."""
    return os.path.expanduser(os.path.expandvars(text))


def envlookup(match: Any) -> str:
    """The value of ``WDS_<name>`` for a regex match whose first group is ``<name>``."""
    key = "WDS_" + match.group(1)
    if key not in os.environ:
        raise KeyError(f"missing environment variable {key}")
    return os.environ[key]


def expand_source(source: Any, max_urls: int = int(1e9)) -> list[str]:
    """A shard list from a pattern string, a list (as is), or any iterable (its first
    ``max_urls`` items)."""
    if isinstance(source, str):
        return expand_urls(source)
    if isinstance(source, list):
        return source
    if is_iterable(source):
        return list(islice(source, max_urls))
    raise ValueError(f"cannot handle {type(source)}")


@dataclass
class MSSource:
    """One dataset of a spec: its name, its shard URLs, and how an epoch draws from them
    (``perepoch`` shards without replacement, or ``resample`` with; -1: all of them once)."""

    name: str = ""
    perepoch: int = -1
    resample: int = -1
    urls: list[str] = field(default_factory=list)


def _read_spec(spec: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(spec, dict):
        return spec
    import yaml

    with open(spec) as stream:
        loaded = yaml.safe_load(stream)
    if not isinstance(loaded, dict):
        raise ValueError(f"{spec}: a dataset spec must be a YAML mapping with a 'datasets' list")
    return loaded


def _checked_keys(where: str, given: Iterable[str], allowed: set[str]) -> None:
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def parse_sources(spec: dict[str, Any], where: str = "{dict}") -> list[MSSource]:
    """The datasets a spec describes, their shard patterns expanded."""
    _checked_keys(where, spec, _SPEC_KEYS)
    prefix = expand(spec.get("prefix", ""))
    sources = []
    for number, dataset in enumerate(spec["datasets"]):
        _checked_keys(f"{where}: dataset {number}", dataset, _DATASET_KEYS)
        buckets = [
            expand(bucket) for bucket in _as_list(dataset.get("buckets", spec.get("buckets", [])))
        ] or [""]
        if len(buckets) != 1:
            raise ValueError(f"{where}: dataset {number} names {len(buckets)} buckets; one is supported")
        bucket = buckets[0]
        urls = [
            prefix + os.path.join(bucket, url)
            for pattern in _as_list(dataset["shards"])
            for url in braceexpand.braceexpand(expand(pattern))
        ]
        resample = dataset.get("resample", -1)
        choose = dataset.get("choose", -1)
        if choose > len(urls):
            raise ValueError(f"perepoch {choose} must be no greater than the number of shards")
        if choose > 0 and resample > 0:
            raise ValueError("specify only one of perepoch or choose")
        name = dataset.get("name", "@" + bucket)
        sources.append(MSSource(name=name, urls=urls, perepoch=choose, resample=resample))
        log.info("dataset spec %s: %s has %d shards, takes %d per epoch", where, name, len(urls), choose)
    return sources


class MultiShardSample:
    """The shards of a YAML dataset spec (a file name, or the spec as a dict), as
    ``{"url": ...}`` items: each dataset's draw for the epoch, shuffled together."""

    def __init__(self, fname: str | dict[str, Any]):
        self.epoch = -1
        self.parse_spec(fname)

    def parse_spec(self, fname: str | dict[str, Any]) -> None:
        """Read the spec into :attr:`sources`."""
        self.rng = default_rng
        self.sources = parse_sources(_read_spec(fname), "{dict}" if isinstance(fname, dict) else fname)

    def set_epoch(self, seed: int) -> None:
        """Draw the next epochs from ``random.Random(seed)``."""
        self.rng = random.Random(seed)

    def get_shards_for_epoch(self) -> list[str]:
        """This epoch's shard URLs."""
        result: list[str] = []
        for source in self.sources:
            if source.resample > 0:
                result += self.rng.choices(source.urls, k=source.resample)
            elif source.perepoch > 0:
                chosen = list(source.urls)
                self.rng.shuffle(chosen)
                result += chosen[: source.perepoch]
            else:
                result += source.urls
        self.rng.shuffle(result)
        return result

    def __iter__(self) -> Iterator[dict[str, str]]:
        return ({"url": url} for url in self.get_shards_for_epoch())


def shardspec(spec: str) -> SimpleShardList | MultiShardSample:
    """The shard list a spec string names: a YAML dataset spec (``.yaml``/``.yml``) or a
    URL pattern."""
    if spec.endswith((".yaml", ".yml")):
        return MultiShardSample(spec)
    return SimpleShardList(spec)
