"""webdataset's small helpers in wdsx (tenbin, utils, mix, autodecode, pipeline, multi,
typecheck, cborsiterators), each compared with webdataset's own function on the same inputs."""

from __future__ import annotations

import os
import random
import warnings
from collections import Counter

import numpy as np
import pytest
import webdataset.autodecode as web_autodecode
import webdataset.mix as web_mix
import webdataset.pipeline as web_pipeline
import webdataset.tenbin as web_tenbin
import webdataset.typecheck as web_typecheck
import webdataset.utils as web_utils

import wdsx
from wdsx import autodecode, mix, tenbin, utils
from wdsx.multi import MultiLoader
from wdsx.pipeline import add_length_method

WORDS = ["", "a", "f4", "~TenBin~", "info", "12345678", "u8"]


@pytest.mark.parametrize("word", WORDS)
def test_tenbin_words_match(word):
    assert tenbin.str64(word) == web_tenbin.str64(word)
    assert tenbin.unstr64(tenbin.str64(word)) == web_tenbin.unstr64(web_tenbin.str64(word)) == word


def test_tenbin_constants_and_sizes_match():
    assert (tenbin.magic, tenbin.magic_str, tenbin.magic_bytes) == (
        web_tenbin.magic,
        web_tenbin.magic_str,
        web_tenbin.magic_bytes,
    )
    # webdataset's table spells one name "unit32", which numpy does not know; wdsx's is right.
    assert web_tenbin.short_to_long["u4"] == "unit32"
    assert tenbin.short_to_long == {**web_tenbin.short_to_long, "u4": "uint32"}
    assert all(np.dtype(name) for name in tenbin.short_to_long.values())
    with pytest.raises(Exception) as ours:
        tenbin.str64("ninechars")
    with pytest.raises(Exception) as theirs:
        web_tenbin.str64("ninechars")
    assert type(ours.value) is type(theirs.value)
    for value in (np.zeros((3, 5), "f4"), np.arange(7, dtype="i8"), b"abc", bytearray(b"xy")):
        assert tenbin.bytelen(value) == web_tenbin.bytelen(value)
        assert bytes(tenbin.bytedata(value)) == bytes(web_tenbin.bytedata(value))
    for bad in (3, "text"):
        with pytest.raises(ValueError):
            tenbin.bytelen(bad)
        with pytest.raises(ValueError):
            web_tenbin.bytelen(bad)


def test_tenbin_checks_match_where_webdataset_follows_its_docstring():
    """webdataset's two checks are unused there and inverted in places (its 64-bit check
    refuses the 32-bit types; its info check raises on any pair); wdsx does what their
    docstrings say. They agree on everything else, checked here."""
    supported = [np.zeros(2, dtype) for dtype in ("f2", "f4", "f8", "i1", "i4", "i8", "u1", "u8")]
    assert tenbin.check_acceptable_input_type(supported, True) is None
    assert web_tenbin.check_acceptable_input_type(supported, True) is None
    for checker in (tenbin.check_acceptable_input_type, web_tenbin.check_acceptable_input_type):
        with pytest.raises(ValueError):
            checker([np.zeros(2, "complex64")], True)
    with pytest.raises(ValueError, match="64 bit"):
        tenbin.check_acceptable_input_type([np.zeros(2, "f8")], False)
    assert tenbin.check_acceptable_input_type([np.zeros(2, "f4")], False) is None
    data, infos = [np.zeros(2)], ["a"]
    for required in (None, False, True, []):
        assert repr(tenbin.check_infos(data, infos, required)) == repr(
            web_tenbin.check_infos(data, infos, required)
        )
    for checker in (tenbin.check_infos, web_tenbin.check_infos):
        with pytest.raises(ValueError):
            checker(data, infos, "a")
    assert tenbin.check_infos(data, infos, ["a"]) is data
    with pytest.raises(ValueError, match="doesn't match"):
        tenbin.check_infos(data, infos, ["b"])


@pytest.mark.parametrize(
    ("text", "expr"), [("123", "{}"), ("7", "{} * 6"), ("abc_9", "'{}'"), ("True", "{}")]
)
def test_safe_eval_matches(text, expr):
    assert utils.safe_eval(text, expr) == web_utils.safe_eval(text, expr)


@pytest.mark.parametrize("text", ["__import__('os')", "a.b", "1+1", "x y"])
def test_safe_eval_refuses_what_webdataset_refuses(text):
    for safe_eval in (utils.safe_eval, web_utils.safe_eval):
        with pytest.raises(ValueError, match="illegal characters"):
            safe_eval(text)


def test_lookup_sym_matches():
    for sym, modules in (("sqrt", ["math"]), ("nothing_here", ["math", "os"]), ("join", ["math", "os.path"])):
        assert utils.lookup_sym(sym, modules) is web_utils.lookup_sym(sym, modules)
    assert utils.lookup_sym("shuffle", [".filters"]) is wdsx.filters.shuffle


def test_deprecated_warns_as_webdataset_does():
    def plain(x):
        return x + 1

    for decorate in (utils.deprecated, web_utils.deprecated):
        for wrapped, reason in ((decorate(plain), None), (decorate("use g")(plain), "use g")):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert wrapped(1) == 2
            assert [w.category for w in caught] == [DeprecationWarning]
            expected = "Call to deprecated function plain." + (f" Reason: {reason}" if reason else "")
            assert str(caught[0].message) == expected
            assert wrapped.__name__ == "plain"


def test_obsolete_matches(monkeypatch):
    monkeypatch.delenv("ALLOW_OBSOLETE", raising=False)

    def old(x):
        return x * 2

    messages = []
    for module in (utils, web_utils):
        for wrapped in (module.obsolete(old), module.obsolete(reason="gone")(old)):
            with pytest.raises(module.ObsoleteException) as caught:
                wrapped(3)
            messages.append(str(caught.value))
    assert messages[:2] == messages[2:]
    monkeypatch.setenv("ALLOW_OBSOLETE", "1")
    assert utils.obsolete(old)(3) == web_utils.obsolete(old)(3) == 6


def test_compute_sample_weights_matches():
    pairs = [(100, 1.0), (50, 3.0), (10, 0.5)]
    np.testing.assert_array_equal(
        utils.compute_sample_weights(pairs), web_utils.compute_sample_weights(pairs)
    )


def test_enforce_security_switches_secure_mode(monkeypatch):
    from webdataset.gopen import gopen_pipe as web_gopen_pipe

    from wdsx.gopen import gopen_pipe

    monkeypatch.delenv("WDS_SECURE", raising=False)
    assert utils.enforce_security is False
    utils.enforce_security = True
    monkeypatch.setattr(web_utils, "enforce_security", True)
    assert os.environ["WDS_SECURE"] == "1" and utils.enforce_security is True
    for opener in (gopen_pipe, web_gopen_pipe):
        with pytest.raises(ValueError):
            opener("pipe:cat /dev/null")
    utils.enforce_security = False
    assert os.environ["WDS_SECURE"] == "0" and utils.enforce_security is False


@pytest.mark.parametrize("sizes", [(3, 3), (2, 5), (5, 2, 4), (0, 3)])
def test_round_robin_matches(sizes):
    def sources():
        return [iter(f"{n}-{i}" for i in range(size)) for n, size in enumerate(sizes)]

    assert list(mix.round_robin_shortest(*sources())) == list(web_mix.round_robin_shortest(*sources()))
    assert list(mix.round_robin_longest(*sources())) == list(web_mix.round_robin_longest(*sources()))


@pytest.mark.parametrize("seed", [0, 1, 17])
@pytest.mark.parametrize("probs", [None, [0.2, 0.5, 0.3], [1, 1, 8]])
@pytest.mark.parametrize("longest", [False, True])
def test_random_samples_matches_under_the_same_global_seed(seed, probs, longest):
    def run(random_samples):
        random.seed(seed)
        sources = [iter(range(n * 100, n * 100 + size)) for n, size in enumerate((20, 5, 12))]
        return list(random_samples(sources, probs, longest))

    assert run(mix.random_samples) == run(web_mix.random_samples)


@pytest.mark.parametrize(
    "key",
    ["a.jpg", "sample.JPG", "x.seg.png", "x.png", "jpg", "deep.name.jpeg", "noext", "y.cls"],
)
def test_call_extension_handler_matches(key):
    extensions = ["jpg", "jpeg", "seg.png"]
    assert autodecode.call_extension_handler(key, b"DATA", len, extensions) == (
        web_autodecode.call_extension_handler(key, b"DATA", len, extensions)
    )


def test_pytorch_weights_only_setting(monkeypatch):
    monkeypatch.delenv("WDS_PYTORCH_WEIGHTS_ONLY", raising=False)
    monkeypatch.delenv("WDSX_ALLOW_PICKLE", raising=False)
    assert autodecode.pytorch_weights_only is True  # no unpickling unless the user allows it
    autodecode.pytorch_weights_only = False
    assert os.environ["WDS_PYTORCH_WEIGHTS_ONLY"] == "0" and autodecode.pytorch_weights_only is True
    monkeypatch.setenv("WDSX_ALLOW_PICKLE", "1")
    assert autodecode.pytorch_weights_only is False and wdsx.pytorch_weights_only is False
    wdsx.pytorch_weights_only = True
    assert autodecode.pytorch_weights_only is True
    assert isinstance(web_autodecode.pytorch_weights_only, bool)


def test_add_length_method_matches():
    class Sized:
        size = 11

        def __iter__(self):
            return iter(range(self.size))

    ours, theirs = add_length_method(Sized()), web_pipeline.add_length_method(Sized())
    assert len(ours) == len(theirs) == 11
    assert type(ours).__name__ == type(theirs).__name__ == "Sized_Length"
    assert isinstance(ours, Sized) and list(ours) == list(theirs)


class _WorkerNumbers:
    """A dataset whose items say which worker of how many produced them."""

    def __iter__(self):
        worker, workers = os.environ["WORKER"], os.environ["NUM_WORKERS"]
        return iter([(worker, workers, n) for n in range(3)])


def test_multiloader_runs_the_dataset_in_each_worker():
    items = list(MultiLoader(_WorkerNumbers(), workers=2))
    expected = [(str(w), "2", n) for w in range(2) for n in range(3)]
    assert Counter(items) == Counter(expected)


def test_multiloader_splits_shards_by_worker(shards):
    dataset = wdsx.DataPipeline(
        wdsx.SimpleShardList(shards.urls),
        wdsx.split_by_worker,
        wdsx.tarfile_to_samples(),
        wdsx.to_tuple("__key__"),
    )
    keys = [key for (key,) in MultiLoader(dataset, workers=2)]
    assert sorted(keys) == sorted(shards.keys)


def test_typecheck_lists_webdataset_modules():
    import wdsx.typecheck

    assert wdsx.typecheck.modules == web_typecheck.modules


def test_cbors_samples(tmp_path):
    cbor2 = pytest.importorskip("cbor2")
    path = tmp_path / "data.cbors"
    records = [{"__key__": f"k{n}", "value": n} for n in range(5)]
    with open(path, "wb") as stream:
        for record in records:
            cbor2.dump(record, stream)
    dataset = wdsx.DataPipeline(wdsx.SimpleShardList([str(path)]), wdsx.cbors2_to_samples())
    assert list(dataset) == records
