"""Every name of webdataset's ``filters`` and ``tariterators`` modules, private helpers
included (third-party code imports ``_shuffle``, ``url_opener``, ``meta_prefix``...), works in
wdsx with webdataset's signature and behaviour.

Signatures are checked against webdataset 0.2.86, 0.2.111 (in a subprocess each) and 1.0.2;
behaviour against webdataset 1.0.2, on the same inputs.
"""

from __future__ import annotations

import io
import pickle
import random

import numpy as np
import pytest
import webdataset
import webdataset.filters
import webdataset.tariterators

import wdsx.filters
import wdsx.tariterators
from tests.fixtures.releases import run_with_release

DESCRIBE = """
import inspect, types

SIMPLE = (type(None), bool, int, float, str)


def default_of(parameter):
    value = parameter.default
    if value is inspect.Parameter.empty:
        return "<required>"
    if isinstance(value, SIMPLE):
        return repr(value)
    if callable(value) and hasattr(value, "__name__"):
        return "function " + value.__name__
    return "<object>"


def describe(module):
    # name -> ("value", repr) for constants, or ("callable", curried, [(name, kind, default)])
    result = {}
    for name, value in vars(module).items():
        if name.startswith("__") or isinstance(value, types.ModuleType):
            continue
        if getattr(value, "__module__", module.__name__) != module.__name__:
            continue
        if not callable(value):
            result[name] = ["value", repr(value) if isinstance(value, SIMPLE) else "<object>"]
            continue
        try:
            signature = inspect.signature(value)
        except (TypeError, ValueError):
            result[name] = ["callable", False, None]
            continue
        parameters = [[p.name, p.kind.name, default_of(p)] for p in signature.parameters.values()]
        result[name] = ["callable", type(value).__name__ == "RestCurried", parameters]
    return result
"""

VERSIONS = ["0.2.86", "0.2.111", "1.0.2"]

ACCEPTED = {
    ("0.2.86", "filters", "_shuffle"): "0.2.111 put seed= before handler=; wdsx follows the later order",
    ("0.2.86", "filters", "shuffle"): "0.2.111 put seed= before handler=; wdsx follows the later order",
}
"""(version, module, name) or (module, name): why wdsx's signature may differ there."""


def described(version: str) -> dict:
    if version == webdataset.__version__:
        namespace: dict = {}
        exec(DESCRIBE, namespace)
        return {
            name: namespace["describe"](getattr(webdataset, name)) for name in ("filters", "tariterators")
        }
    code = DESCRIBE + "\nimport webdataset.filters, webdataset.tariterators\n"
    code += "result = {name: describe(getattr(webdataset, name)) for name in ('filters', 'tariterators')}"
    return run_with_release(version, code)


class _Holder:
    """A stand-in module holding one value, so that ``describe`` takes it as defined there."""

    def __init__(self, value):
        self.__name__ = getattr(value, "__module__", None)
        self.value = value


def our_parameters(value) -> list:
    namespace: dict = {}
    exec(DESCRIBE, namespace)
    return namespace["describe"](_Holder(value))["value"][2]


def incompatibilities(theirs: list, ours: list) -> list[str]:
    """How a call written for ``theirs`` (parameter descriptions) could fail or change meaning
    with ``ours``."""
    problems = []
    variadic = {kind for _, kind, _ in ours if kind.startswith("VAR_")}
    ours_fixed = [p for p in ours if not p[1].startswith("VAR_")]
    theirs_fixed = [p for p in theirs if not p[1].startswith("VAR_")]
    for index, (name, kind, default) in enumerate(theirs_fixed):
        if index >= len(ours_fixed) or ours_fixed[index][0] != name:
            problems.append(f"parameter {index} is {name!r} in webdataset")
            continue
        _, our_kind, our_default = ours_fixed[index]
        if kind != our_kind and kind != "KEYWORD_ONLY":
            problems.append(f"{name} is {our_kind} instead of {kind}")
        if "<object>" not in (default, our_default) and default != our_default:
            problems.append(f"{name}: default {our_default} instead of {default}")
    for _, kind, _ in theirs:
        if kind.startswith("VAR_") and kind not in variadic:
            problems.append(f"no {kind} parameter")
    problems += [
        f"extra parameter {p[0]} has no default"
        for p in ours_fixed[len(theirs_fixed) :]
        if p[2] == "<required>"
    ]
    return problems


@pytest.mark.parametrize(
    "version",
    [pytest.param(v, marks=pytest.mark.slow) if v != webdataset.__version__ else v for v in VERSIONS],
)  # other releases: installed once, each imported in a subprocess
def test_every_name_exists_with_webdatasets_signature(version):
    faces = {"filters": wdsx.filters, "tariterators": wdsx.tariterators}
    problems = []
    for module_name, names in described(version).items():
        face = faces[module_name]
        for name, (what, *details) in names.items():
            if not hasattr(face, name):
                problems.append(f"{module_name}.{name} is missing")
                continue
            value = getattr(face, name)
            if what == "value":
                if details[0] != "<object>" and repr(value) != details[0]:
                    problems.append(f"{module_name}.{name} is {value!r}, not {details[0]}")
                continue
            curried, parameters = details
            if parameters is None or {(version, module_name, name), (module_name, name)} & set(ACCEPTED):
                continue
            mine = our_parameters(value)
            theirs = parameters[1:] if curried else parameters
            problems += [f"{module_name}.{name}: {p}" for p in incompatibilities(theirs, mine)]
    assert problems == []


def plain(value):
    """A comparable form: arrays as lists, tuples and lists alike."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def records():
    return [{"__key__": f"k{i}", "txt": f"text {i}".encode(), "cls": str(i % 3).encode()} for i in range(7)]


def rows():
    return [{"__key__": f"k{i}", "label": i % 3, "score": i / 2} for i in range(7)]


GENERATORS = [
    ("_map", rows, (lambda s: None if s["label"] == 1 else {"double": s["label"] * 2},), {}),
    ("_select", rows, (lambda s: s["label"] != 2,), {}),
    ("_to_tuple", rows, ("__key__ label",), {}),
    ("_to_tuple", rows, ("__key__", "missing;label", "nothing"), {"missing_is_error": False}),
    ("_rename", rows, (), {"keep": False, "y": "label", "key": "__key__"}),
    ("_associate", rows, ({"k1": {"extra": 1}},), {}),
    ("_map_dict", rows, (), {"label": lambda v: v + 10}),
    ("_extract_keys", rows, ("label", "score;nothing"), {}),
    ("_rename_keys", rows, (), {"target": "label", "keep_unselected": True}),
    ("_decode", records, (), {}),
    ("_xdecode", records, (), {"txt": lambda stream: stream.read().upper(), "must_decode": False}),
    ("_log_keys", rows, (), {}),
    ("_rsample", rows, (1.0,), {}),
    ("_rsample", rows, (0.0,), {}),
    ("_info", rows, (), {"stream": io.StringIO()}),
]


@pytest.mark.parametrize(("name", "make", "args", "kw"), GENERATORS, ids=[g[0] for g in GENERATORS])
def test_each_generator_yields_what_webdatasets_yields(name, make, args, kw):
    theirs = list(getattr(webdataset.filters, name)(iter(make()), *args, **kw))
    ours = list(getattr(wdsx.filters, name)(iter(make()), *args, **kw))
    assert plain(ours) == plain(theirs)


def test_batching_generators_yield_what_webdatasets_yield():
    tuples = [(f"k{i}", i, np.full(2, i)) for i in range(7)]
    theirs = list(webdataset.filters._batched(iter(tuples), 3))
    ours = list(wdsx.filters._batched(iter(tuples), 3))
    assert plain(ours) == plain(theirs)
    assert plain(list(wdsx.filters._unbatched(iter(ours)))) == plain(
        list(webdataset.filters._unbatched(iter(theirs)))
    )
    lists = [[1, 2], [3], [4, 5, 6]]
    assert list(wdsx.filters._unlisted(iter(lists))) == list(webdataset.filters._unlisted(iter(lists)))
    mapped = list(wdsx.filters._map_tuple(iter(tuples), str, None, lambda a: a.sum()))
    assert plain(mapped) == plain(
        list(webdataset.filters._map_tuple(iter(tuples), str, None, lambda a: a.sum()))
    )


def test_field_specs_and_decoder_lookup_follow_webdataset():
    for spec in ["jpg;png cls", ["jpg;png", "cls"], "txt"]:
        assert wdsx.filters.parse_field_spec(spec) == webdataset.filters.parse_field_spec(spec)
    decoders = [
        ("*.txt", "text"),
        ("*.TXT", "upper"),
        ("*.jpg", "image"),
        ("*.seg.jpg", "segment"),
        ("*", "any"),
    ]
    for path in ["a.txt", "dir/b.JPG", "x.seg.jpg", "noext", ".hidden", "__key__", "dir/__url__"]:
        ours = wdsx.filters.find_decoder(decoders, path)
        theirs = webdataset.filters.find_decoder(decoders, path)
        if callable(theirs):
            assert ours("value") == theirs("value") == "value"
        else:
            assert ours == theirs
    assert wdsx.filters.find_decoder(decoders[:1], "a.bin") is None


def test_collation_helpers_follow_webdataset():
    columns = [[1, 2, 3], [0.5, 1.5], [np.zeros(2), np.ones(2)], ["a", "b"], [b"x", b"y"]]
    for column in columns:
        for tensors, scalars in [(True, True), (False, False)]:
            ours = wdsx.filters.combine_values(column, tensors, scalars)
            assert plain(ours) == plain(webdataset.filters.combine_values(column, tensors, scalars))
    row = ("k", 1, b"z")
    assert wdsx.filters.tuple2dict(row) == webdataset.filters.tuple2dict(row)
    assert wdsx.filters.tuple2dict({"a": 1}) == {"a": 1}
    assert wdsx.filters.dict2tuple({1: "b", 0: "a"}) == webdataset.filters.dict2tuple({1: "b", 0: "a"})


def keep_every(data, step, offset=0):
    return (item for i, item in enumerate(data) if i % step == offset)


def test_curried_filters_call_and_pickle_as_in_webdataset():
    curried = wdsx.filters.RestCurried(keep_every)(3, offset=1)
    theirs = webdataset.filters.RestCurried(keep_every)(3, offset=1)
    assert isinstance(curried, wdsx.filters.FilterFunction)
    assert list(curried(range(10))) == list(theirs(range(10))) == [1, 4, 7]
    assert repr(curried) == repr(theirs)
    again = pickle.loads(pickle.dumps(curried))
    assert (again.f, again.args, again.kw) == (keep_every, (3,), {"offset": 1})
    pipeline = wdsx.DataPipeline(lambda: iter(range(10)), curried)
    assert list(pipeline) == [1, 4, 7]


def test_shardlist_and_module_constants_follow_webdataset():
    pattern = "shard-{000..004}.tar"
    assert list(wdsx.tariterators.shardlist(pattern)) == list(webdataset.tariterators.shardlist(pattern))
    urls = [f"shard-{i}.tar" for i in range(20)]
    random.seed(5)
    theirs = list(webdataset.tariterators.shardlist(urls, shuffle=True))
    random.seed(5)
    assert list(wdsx.tariterators.shardlist(urls, shuffle=True)) == theirs
    for name in ("trace", "meta_prefix", "meta_suffix"):
        assert getattr(wdsx.tariterators, name) == getattr(webdataset.tariterators, name)


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("filters", ["reraise_exception", "pipelinefilter", "PipelineStage"]),
        ("tariterators", ["reraise_exception"]),
    ],
)
def test_nothing_is_refused_and_imported_helpers_are_there_too(module, imported):
    face = getattr(wdsx, module)
    assert getattr(face, "ABSENT", {}) == {}
    for name in imported:
        assert getattr(face, name) is not None
