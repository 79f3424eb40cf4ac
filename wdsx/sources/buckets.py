"""``SCHEME://bucket/key`` URLs of object stores, split into the bucket and the key."""

from __future__ import annotations

from wdsx.core.errors import SourceError


def split_bucket_url(url: str, noun: str = "bucket") -> tuple[str, str]:
    """``("bucket", "path/to/key")`` from ``SCHEME://bucket/path/to/key``; the key may be empty."""
    scheme, _, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise SourceError(url, f"a {scheme}:// URL needs a {noun} name: {scheme}://{noun}/key")
    return bucket, key


def object_of(url: str, noun: str = "bucket") -> tuple[str, str]:
    """Bucket and key of a URL that must name one object."""
    bucket, key = split_bucket_url(url, noun)
    if not key:
        scheme = url.partition("://")[0]
        raise SourceError(url, f"a {scheme}:// URL of a shard needs a key: {scheme}://{noun}/key")
    return bucket, key
