"""Shards that an earlier plan left at a destination, and their removal.

A re-run with other settings (another ``maxcount``, more or fewer inputs) plans other shards
under the same pattern: ``out/train-%06d.tar`` cut into 4 shards where an earlier run wrote 8.
The new run overwrites ``train-000000.tar`` to ``train-000003.tar``; ``train-000004.tar`` to
``train-000007.tar`` would stay, and a reader given the folder or a glob would read their
samples a second time. So once the new plan's manifest is in place, the shards that earlier
runs wrote under the same manifest name, and that the new plan does not include, are removed:
the ones the earlier manifest lists, and, for a run that never finished, the ones its
completion records name. A file that no writing run left there is never touched.

Stores have no delete here: at a remote destination such shards are reported, for the user to
remove.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Sequence

from wdsx.read.manifest import Manifest, natural_key
from wdsx.sources import SourceOptions, local_path
from wdsx.write.records import plan_of, read_record, record_url

__all__ = [
    "earlier_shards",
    "forget_earlier_manifest",
    "remove_earlier_shards",
    "remove_shards",
    "set_aside_earlier_manifest",
]

log = logging.getLogger("wdsx")


def earlier_shards(
    urls: Sequence[str], manifest_url: str, plan_id: str, options: SourceOptions | None
) -> list[str]:
    """The shards that earlier plans wrote beside ``manifest_url`` and that are not among
    ``urls`` (this plan's): those the manifest there lists, unless it is this plan's, and, at a
    local destination, those named by completion records of other plans. To be read before
    this plan's manifest replaces the earlier one."""
    directory = posixpath.dirname(manifest_url)
    names: set[str] = set()
    for url in (manifest_url, set_aside_url(manifest_url)):
        manifest = Manifest.load(url, options)
        if manifest is not None and plan_of(manifest) != plan_id:
            names.update(entry.name for entry in manifest.shards)
    names.update(_recorded_elsewhere(directory, plan_id))
    names -= {posixpath.basename(url) for url in urls}
    return [posixpath.join(directory, name) for name in sorted(names, key=natural_key)]


def set_aside_url(manifest_url: str) -> str:
    """Where an earlier plan's manifest waits while a new plan writes (a hidden name, which
    readers never look for)."""
    directory, name = posixpath.split(manifest_url)
    return posixpath.join(directory, f".{name}.earlier")


def set_aside_earlier_manifest(manifest_url: str, plan_id: str, options: SourceOptions | None) -> None:
    """Before this plan writes any shard: move a local manifest of another plan to
    :func:`set_aside_url`. This plan rewrites shards that manifest may list, and a run killed
    midway must not leave readers a manifest whose counts no longer match the files (they
    would read the rewritten shards' samples by the old counts); :func:`earlier_shards` still
    reads it there. A remote one stays (readers refuse a shard with more samples than it says)."""
    path, aside = local_path(manifest_url), local_path(set_aside_url(manifest_url))
    if path is None or aside is None:
        return
    manifest = Manifest.load(manifest_url, options)
    if manifest is None or plan_of(manifest) == plan_id:
        return
    try:
        os.replace(path, aside)
    except FileNotFoundError:  # another rank set it aside first
        return
    log.info("moved %s, an earlier plan's manifest, aside until this plan writes its own", path)


def forget_earlier_manifest(manifest_url: str) -> None:
    """Once this plan's manifest is in place and the earlier plan's shards are gone: remove
    the earlier manifest set aside."""
    _unlink(local_path(set_aside_url(manifest_url)))


def _recorded_elsewhere(directory: str, plan_id: str) -> list[str]:
    """Shards named by the completion records of other plans in a local ``directory``."""
    path = local_path(directory or ".")
    if path is None or not os.path.isdir(path):
        return []
    names = []
    for entry in os.listdir(path):
        if not (entry.startswith(".") and entry.endswith(".json")):
            continue
        try:
            record = read_record(os.path.join(path, entry), None)
        except ValueError:  # not a record: some other hidden file
            continue
        if isinstance(record, dict) and record.get("fingerprint") not in (None, plan_id):
            names.append(entry[1 : -len(".json")])
    return names


def remove_earlier_shards(urls: Sequence[str]) -> tuple[list[str], list[str]]:
    """Remove the shards at ``urls`` (from :func:`earlier_shards`) and their completion
    records; returns the URLs removed, and the remote ones left in place (logged as a warning)."""
    removed, left = remove_shards(urls)
    if removed:
        log.info("removed %d shards that an earlier plan wrote here: %s", len(removed), ", ".join(removed))
    if left:
        log.warning(
            "%d shards that an earlier plan wrote are still beside this dataset's, and a reader given "
            "their folder or a glob reads them too; remove them: %s",
            len(left),
            ", ".join(left),
        )
    return removed, left


def remove_shards(urls: Sequence[str]) -> tuple[list[str], list[str]]:
    """Remove the local shards at ``urls`` and their completion records; returns the URLs
    removed and the remote ones, which stay."""
    removed, left = [], []
    for url in urls:
        path = local_path(url)
        if path is None:
            left.append(url)
        elif any([_unlink(path), _unlink(local_path(record_url(url)))]):
            removed.append(url)
    return removed, left


def _unlink(path: str | None) -> bool:
    """Remove the file at ``path``; False when there is none (another rank finishing at the
    same moment may have removed it)."""
    if path is None:
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
