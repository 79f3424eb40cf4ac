"""Install hints for wdsx's optional dependencies, worded to work for everyone: for a user who
installed wdsx from a package index (``pip install zstandard``) and for one holding a checkout
of the repository (``pip install -e '.[zstd]'``), for whom asking pip for wdsx by name with an
extra would fetch another copy of wdsx from the index."""

from __future__ import annotations

import re
from importlib import metadata

_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def extra_packages(extra: str) -> list[str]:
    """The distributions that wdsx's ``extra`` installs, as the installed wdsx's metadata lists
    them; empty when wdsx's metadata is not found (a checkout on ``sys.path``)."""
    try:
        requirements = metadata.requires("wdsx") or []
    except metadata.PackageNotFoundError:
        return []
    packages = []
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        found = _MARKER.search(marker)
        name = _NAME.match(spec.strip())
        if found and found.group(1) == extra and name:
            packages.append(name.group(0))
    return packages


def install_hint(extra: str, packages: str) -> str:
    """``install PACKAGES (pip install PACKAGES, or pip install -e '.[EXTRA]' in a wdsx
    checkout)``; ``packages`` names what to install when wdsx's metadata does not list the
    extra's distributions."""
    names = " ".join(extra_packages(extra)) or packages
    return f"install {names} (pip install {names}, or pip install -e '.[{extra}]' in a wdsx checkout)"
