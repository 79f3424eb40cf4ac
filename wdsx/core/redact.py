"""Credentials never reach a message or a log line: URLs are shown with their userinfo and
their signature-like query parameters replaced by ``***``.

A presigned S3 URL (``X-Amz-Signature``, ``X-Amz-Credential``, ``X-Amz-Security-Token``), a GCS
signed URL (``X-Goog-Signature``), an Azure SAS (``sig=``), ``token=`` parameters and
``user:password@`` userinfo all grant access to whoever reads them, and error messages end
up in logs, tracebacks and bug reports. Every :class:`~wdsx.core.errors.WdsxError` passes its
message through :func:`redact_text`, and the ``wdsx`` logger does the same to its records, so
no call site has to remember.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import unquote

MASK = "***"

_SECRET_WORDS = ("signature", "token", "secret", "password", "passwd", "credential", "connection_string")
_SECRET_NAMES = frozenset(("sig", "key", "apikey", "api_key", "access_key", "accesskey", "auth", "code"))
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
_TRAILING = ".,:;)]}"


def secret_name(name: str) -> bool:
    """Whether a parameter or setting called ``name`` holds a secret (a key, a token, a
    password, a signature)."""
    lowered = unquote(name).lower()
    return (
        lowered in _SECRET_NAMES or lowered.endswith("_key") or any(word in lowered for word in _SECRET_WORDS)
    )


def _redact_query(query: str) -> str:
    parts = []
    for part in query.split("&"):
        name, sep, value = part.partition("=")
        parts.append(f"{name}={MASK}" if sep and value and secret_name(name) else part)
    return "&".join(parts)


def redact(url: str) -> str:
    """``url`` with its userinfo and secret query parameters masked; other text unchanged.

    >>> redact("https://user:pw@host/a.tar?X-Amz-Signature=abc&part=1")
    'https://***@host/a.tar?X-Amz-Signature=***&part=1'
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = len(rest)
    for stop in "/?#":
        found = rest.find(stop)
        if 0 <= found < end:
            end = found
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        authority = MASK + "@" + authority.rpartition("@")[2]
    path, qmark, query = tail.partition("?")
    if qmark:
        query, hash_mark, fragment = query.partition("#")
        tail = path + "?" + _redact_query(query) + hash_mark + fragment
    return f"{scheme}://{authority}{tail}"


def _redact_match(match: re.Match[str]) -> str:
    text = match.group(0)
    kept = text.rstrip(_TRAILING)
    return redact(kept) + text[len(kept) :]


def redact_settings(settings: Any) -> Any:
    """Settings (nested dicts, as a store's client takes them) with the values of the secret
    ones (:func:`secret_name`) masked, and URLs in the others redacted."""
    if isinstance(settings, dict):
        return {
            key: MASK if isinstance(key, str) and secret_name(key) and value else redact_settings(value)
            for key, value in settings.items()
        }
    return redact_text(settings) if isinstance(settings, str) else settings


def redact_text(text: str) -> str:
    """``text`` with every URL in it passed through :func:`redact` (a pipe command's URLs too)."""
    return _URL.sub(_redact_match, text) if "://" in text else text


class RedactingFilter(logging.Filter):
    """A logging filter that redacts URLs in the formatted message of every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is logging's to report, not ours
            return True
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def install_log_filter(logger: logging.Logger) -> None:
    """Make ``logger`` redact URLs in what it logs (once per logger)."""
    if not any(isinstance(existing, RedactingFilter) for existing in logger.filters):
        logger.addFilter(RedactingFilter())
