"""One lock held around every use of Python's ``ast`` module by wdsx and the numpy functions it
calls: ``.npy`` headers are Python literals, which numpy and wdsx parse with ``ast``.

CPython 3.11 keeps the counter that guards the conversion of a parse tree into Python objects
in state that all threads share. When two threads convert at once and a garbage collection
runs Python code (a ``__del__`` or a finalizer) in the middle of one conversion, the other
thread's conversion fails with ``SystemError: AST constructor recursion depth mismatch``.
Thread workers and decoding threads parse ``.npy`` headers at the same time, so every such
parse in wdsx holds :data:`AST_LOCK`; it costs a few microseconds per header. (Code outside
wdsx that uses ``ast`` in other threads at the same time can still meet the bug; newer
Pythons keep that state per call.)
"""

from __future__ import annotations

import threading

AST_LOCK = threading.Lock()
