"""Registers the remote schemes. Each backend imports its client library lazily."""

from __future__ import annotations
