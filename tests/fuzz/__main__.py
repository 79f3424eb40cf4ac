"""``python -m tests.fuzz``: run a fuzz campaign (``make fuzz``), or replay one input.

python -m tests.fuzz --inputs 1000000 --workers 2            # a campaign; exit 1 on failures
python -m tests.fuzz --surfaces jsonl,npy --inputs 20000     # some surfaces only
python -m tests.fuzz --seed 1 --replay 123456 --save out/    # one input, in this process
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable

from tests.fuzz import campaign, surfaces
from tests.fuzz.outcomes import FAILURES


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs to run")
    parser.add_argument("--seed", type=int, default=1, help="campaign seed (inputs are a function of it)")
    parser.add_argument(
        "--surfaces",
        default=",".join(surfaces.NAMES),
        help=f"comma-separated surfaces to attack, of {','.join(surfaces.NAMES)} (default: all; "
        f"'new' stands for {','.join(surfaces.NEW)}); input i belongs to the (i mod n)-th",
    )
    parser.add_argument("--start", type=int, default=0, help="index of the first input")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--timeout", type=float, default=5.0, help="watchdog seconds per input")
    parser.add_argument("--memory-mb", type=int, default=512, help="memory cap per worker, above its start")
    parser.add_argument("--json", help="also write the summary here as JSON")
    parser.add_argument("--replay", type=int, help="run only this input, in this process, and describe it")
    parser.add_argument("--save", help="with --replay: write the input's bytes into this folder")
    return parser


def _surface_names(text: str) -> tuple[str, ...]:
    names = [name for part in text.split(",") for name in (surfaces.NEW if part == "new" else [part])]
    unknown = sorted(set(names) - set(surfaces.NAMES))
    if unknown or not names:
        raise SystemExit(f"unknown surfaces {unknown}; there are {', '.join(surfaces.NAMES)}")
    return tuple(names)


def _replay(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        built = campaign.prepare(_surface_names(args.surfaces), args.seed, scratch)
        surface = campaign.surface_of(args.replay, built)
        item, kind, detail = campaign.run_one(surface, args.seed, args.replay, scratch, args.timeout)
    mutations = ", ".join(item.mutations)
    print(f"input {args.replay}: {surface.name}:{item.what} + {mutations} ({len(item.data)} bytes)")
    print(f"outcome: {kind} {detail}")
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        path = os.path.join(args.save, f"input-{args.seed}-{item.index}.bin")
        with open(path, "wb") as stream:
            stream.write(item.data)
        print(f"saved {path}")
    return 1 if kind in FAILURES else 0


def _progress(every: float) -> Callable[[campaign.Summary], None]:
    """Print the count every ``every`` seconds, and each failure as soon as it is reported."""
    last = [0.0]
    shown = [0]

    def show(summary: campaign.Summary) -> None:
        for index, kind, what, detail in summary.failures[shown[0] :]:
            print(f"  failure: input {index} {kind} {what}: {detail}", flush=True)
        shown[0] = len(summary.failures)
        if time.monotonic() - last[0] >= every:
            last[0] = time.monotonic()
            print(
                f"  {summary.inputs} inputs, {summary.failed} failures, {summary.seconds:.0f} s", flush=True
            )

    return show


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.replay is not None:
        return _replay(args)
    summary = campaign.run_campaign(
        args.seed,
        args.inputs,
        surfaces=_surface_names(args.surfaces),
        start=args.start,
        workers=args.workers,
        timeout=args.timeout,
        memory_mb=args.memory_mb,
        progress=_progress(60.0),
    )
    print(summary.table())
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(
                {
                    "seed": summary.seed,
                    "surfaces": summary.surfaces,
                    "inputs": summary.inputs,
                    "seconds": summary.seconds,
                    "outcomes": dict(summary.outcomes),
                    "by_surface": {name: dict(counts) for name, counts in summary.by_surface.items()},
                    "failures": summary.failures,
                },
                stream,
                indent=1,
            )
    return 1 if summary.failed else 0


if __name__ == "__main__":
    sys.exit(main())
