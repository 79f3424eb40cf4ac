"""The parts of a URL that are not its location: the query, and credentials in its userinfo.

A presigned URL's query string is a signature over one object's path: a file beside the
shard (its manifest, its offset index) cannot be reached by editing that query, so companion
files are looked up at the URL's path with the query left off (:func:`without_query`).
``https://user:password@host/...`` carries HTTP basic credentials, which go into an
``Authorization`` header and never into the request line (:func:`split_userinfo`).
"""

from __future__ import annotations

import base64
from urllib.parse import unquote, urlsplit, urlunsplit


def without_query(url: str) -> str:
    """``url`` without its ``?query`` and ``#fragment``; a local path (which may hold a ``?``
    in a file name) unchanged.

    >>> without_query("https://host/d/shard-000.tar?X-Amz-Signature=abc")
    'https://host/d/shard-000.tar'
    """
    if "://" not in url:
        return url
    return url.split("#", 1)[0].split("?", 1)[0]


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without its ``user:password@`` part, and that part as an HTTP basic
    ``Authorization`` value (None when the URL has none). Percent-escapes in the user name and
    password are decoded, as RFC 3986 spells reserved characters there.

    >>> split_userinfo("https://al%40ice:s3cret@host/a.tar")
    ('https://host/a.tar', 'Basic YWxAaWNlOnMzY3JldA==')
    """
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    return urlunsplit(parts._replace(netloc=host)), f"Basic {token}"
