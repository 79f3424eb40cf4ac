"""Store clients made once per process and settings, and made afresh in a forked child.

Creating a client (boto3's, Google's, Azure's) resolves credentials and opens a connection pool,
which costs more than reading a small shard; so each is made once and shared by every thread.
DataLoader workers forked from a process that already read from a store make their own clients
instead of sharing its sockets, and a lock held by one of its threads at the fork is not
inherited.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any


class ClientCache:
    """Clients by key: the settings and the environment variables the store's library reads."""

    def __init__(self, environment_prefixes: Iterable[str] = ()):
        self._prefixes = tuple(environment_prefixes)
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._clients.clear()

    def get(self, settings: object, make: Callable[[], Any]) -> Any:
        """The client made by ``make()`` for ``settings`` and the current environment."""
        environment = sorted(
            (name, value) for name, value in os.environ.items() if name.startswith(self._prefixes)
        )
        key = repr((settings, environment))
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = make()
            return client
