"""``.npy`` headers parsed in several threads at once (thread workers, decoding threads) while
garbage collections run finalizers: CPython 3.11 fails such concurrent parses with
``SystemError: AST constructor recursion depth mismatch`` unless they are serialised."""

from __future__ import annotations

import gc
import io
import sys
import threading

import numpy as np

from wdsx.codecs.decode import npy_loads
from wdsx.read.npy import parse_header


class Garbage:
    """A reference cycle whose finalizer runs Python code when a collection frees it."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        sum(range(50))


def test_npy_headers_parsed_in_threads_during_collections_never_fail() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    stream = io.BytesIO()
    np.save(stream, array)
    data = stream.getvalue()
    errors: list[str] = []

    def work() -> None:
        for _ in range(1000):
            try:
                assert np.array_equal(npy_loads(data), array)
                source = io.BytesIO(data)
                assert parse_header("x.npy", source.read).shape == (2, 3)
                Garbage()
            except Exception as error:  # the failure this test is about is a SystemError
                errors.append(repr(error))
                return

    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    gc.set_threshold(5, 1, 1)  # and collect often
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
    assert not errors
