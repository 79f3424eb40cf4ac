"""Exceptions that say where bad input was found, and webdataset's error-handler protocol.

A handler receives an exception and decides: return True to skip the item and continue,
False to stop the stream quietly, or raise to propagate. wdsx's handlers never sleep.
"""

from __future__ import annotations

import logging
import tarfile
from collections.abc import Callable
from typing import Any

from wdsx.core.redact import install_log_filter, redact_text

log = logging.getLogger("wdsx")
install_log_filter(log)

Handler = Callable[[BaseException], bool]
"""An error handler: True skips the failing item, False ends the stream, raising propagates."""


class WdsxError(Exception):
    """Base class of every error wdsx raises on purpose. Its message never shows credentials:
    URLs in it are redacted (:func:`~wdsx.core.redact.redact_text`)."""

    def __init__(self, *args: Any):
        super().__init__(*(redact_text(arg) if isinstance(arg, str) else arg for arg in args))


MEMBER_SHOWN = 80
"""Characters of a member name an error message shows at most (a corrupt header's name field
can be any 100 bytes, a bad pax record any length)."""


def shown_name(name: str, limit: int = MEMBER_SHOWN) -> str:
    """``name`` as a message shows it: quoted with non-printable characters escaped, and
    shortened in the middle when longer than ``limit`` characters."""
    if len(name) > limit:
        half = limit // 2
        return f"{name[:half]!r}...{name[-half:]!r}"
    return repr(name)


class ShardError(WdsxError, tarfile.ReadError):
    """A shard could not be read: names the shard URL, the tar member and its byte offset.

    It also subclasses ``tarfile.ReadError`` so code written for webdataset that catches
    that keeps working. Built from a single message (as torch does when it re-raises an error
    from a DataLoader worker), the fields are None.
    """

    def __init__(
        self, url: str, offset: int | None = None, reason: str | None = None, member: str | None = None
    ):
        self.offset = offset
        self.member = member
        self.reason = reason
        if reason is None:
            self.url = None
            super().__init__(url)
            return
        self.url = url
        where = f"at byte offset {offset}" if offset is not None else "at an unknown offset"
        name = f"member {shown_name(member)} " if member else ""
        super().__init__(f"{url}: {reason} ({name}{where})")


class DuplicateFieldError(ShardError, ValueError):
    """A sample with one field twice (two members of one key and extension, one after the
    other): also the ``ValueError`` webdataset's grouping raises for it."""


class TrailingDataError(ShardError):
    """Something other than zero padding follows a shard's end-of-archive marker: another
    archive, whose samples would otherwise be lost unseen, or bytes after the end of its
    compressed stream. Every sample before the marker is whole, and is delivered before this
    is raised."""


class NoSamplesError(ShardError, ValueError):
    """A reader read shards and found no sample in any of them: webdataset's "No samples found"
    error (a ValueError there too), naming the shards read."""

    MESSAGE = (
        "No samples found in dataset; perhaps you have fewer shards than workers.\n"
        "Turn off using empty_check=False in the WebDataset constructor."
    )

    def __init__(self, urls: Any):
        if isinstance(urls, str):  # rebuilt from its message (unpickling)
            super().__init__(urls)
            return
        shown = ", ".join(list(urls)[:3]) + (f" and {len(urls) - 3} more" if len(urls) > 3 else "")
        super().__init__(f"{self.MESSAGE} (read {len(urls)} shard(s): {shown})")
        self.url = urls[0] if urls else None


class SourceError(WdsxError, OSError):
    """A shard could not be opened or fetched; names the URL and what the store said."""

    def __init__(self, url: str, reason: str | None = None):
        self.url = url if reason is not None else None
        self.reason = reason
        super().__init__(f"{url}: {reason}" if reason is not None else url)


class MissingShardError(SourceError, FileNotFoundError):
    """A local shard that does not exist: also the ``FileNotFoundError`` webdataset's ``open``
    raises for it."""


class RefusedError(SourceError, ValueError):
    """A URL refused by policy (secure mode, ``allow_pipe=False``) rather than by its store:
    a ``ValueError``, as webdataset raises for it, and a :class:`SourceError` naming the URL."""


class DecodingError(WdsxError, ValueError):
    """A field of a sample failed to decode; names the shard, the sample key, the field (``k``,
    webdataset's name for it) and where the sample starts in the shard (``offset``: the byte
    offset of its first tar member or JSONL line, the row of a ``.npy`` shard), when known."""

    def __init__(
        self,
        url: Any = None,
        key: Any = None,
        k: Any = None,
        sample: Any = None,
        cause: Any = None,
        offset: int | None = None,
    ):
        self.url = url
        self.key = key
        self.k = k
        self.sample = sample
        self.offset = offset
        if key is None and k is None:  # a bare message
            super().__init__(url)
            return
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        where = ""
        if offset is not None:
            row = isinstance(url, str) and url.split("?", 1)[0].endswith(".npy")
            where = f" (row {offset})" if row else f" (the sample starts at byte offset {offset})"
        super().__init__(f"cannot decode field {k!r} of sample {key!r} in shard {url}{where}{detail}")

    def __reduce__(self) -> tuple:
        # The sample can be large or unpicklable; keep the identifying fields and the message.
        return (type(self), (self.url, self.key, self.k, None, None, self.offset), {"args": self.args})


class EncodingError(WdsxError, ValueError):
    """A sample that cannot be written as given: a key or field name that would not read back
    as written, or a value no encoder takes. Names the sample's key, the field and the shard
    (when known) and says why. Writers raise it before any byte of the sample is written, so
    the writer can go on with the next sample."""

    def __init__(self, reason: str, key: Any = None, field: Any = None, url: str | None = None):
        self.reason = reason
        self.key = key
        self.field = field
        self.url = url
        super().__init__(self._message())

    def _message(self) -> str:
        where = []
        if self.key is not None:
            where.append(f"sample {_shown(self.key)}")
        if self.field is not None:
            where.append(f"field {_shown(self.field)}")
        shard = f" (shard {self.url})" if self.url is not None else ""
        return ", ".join(where) + (": " if where else "") + self.reason + shard

    def located(self, url: str | None) -> EncodingError:
        """This error, naming shard ``url`` (a writer adds it to what its encoder raised)."""
        if url is not None and self.url is None:
            self.url = url
            self.args = (self._message(),)
        return self

    def __reduce__(self) -> tuple:
        # A refused key or field can be any object: its repr always pickles, and the message
        # stays the one the error was raised with.
        key, field = (
            value if value is None or isinstance(value, str) else repr(value)
            for value in (self.key, self.field)
        )
        return (type(self), (self.reason, key, field, self.url), {"args": self.args})


def _shown(name: Any) -> str:
    return shown_name(name) if isinstance(name, str) else shown_name(repr(name))[1:-1]


class StateError(WdsxError, ValueError):
    """A checkpoint cannot be saved or restored exactly; says what differs."""


class NotResumableError(StateError):
    """The pipeline holds something wdsx cannot checkpoint exactly."""


class WriteError(WdsxError):
    """Writing a dataset cannot go on: an input failed with ``strict``, or no input gave a
    sample at all."""

    report: Any = None
    """The run's report (:class:`~wdsx.WriteReport`), when it got that far."""


class UnsupportedError(WdsxError, NotImplementedError):
    """Something webdataset offers that wdsx deliberately does not do; the message says what to
    use instead."""


class AbsentNameError(UnsupportedError, AttributeError):
    """A webdataset module name that wdsx leaves out. It is an AttributeError, so ``hasattr``
    is False, ``getattr(module, name, default)`` gives the default and
    ``try: from wdsx.x import name / except ImportError`` falls back, as for any missing name;
    the message (shown in ``ImportError``'s too) says what to use instead."""


def reraise_exception(exn: BaseException) -> bool:
    """Handler: propagate the exception (the default)."""
    raise exn


def ignore_and_continue(exn: BaseException) -> bool:
    """Handler: skip the failing item silently."""
    return True


def ignore_and_stop(exn: BaseException) -> bool:
    """Handler: end the stream silently."""
    return False


def warn_and_continue(exn: BaseException) -> bool:
    """Handler: log the error and go on with the next item or shard."""
    log.warning("skipping after error: %s", exn)
    return True


def warn_and_stop(exn: BaseException) -> bool:
    """Handler: log the error and end the stream."""
    log.warning("stopping after error: %s", exn)
    return False
