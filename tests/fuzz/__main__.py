"""``python -m tests.fuzz``: run a fuzz campaign (``make fuzz``), or replay one input.

python -m tests.fuzz --inputs 1000000 --workers 2          # a campaign; exit 1 on failures
python -m tests.fuzz --seed 1 --replay 123456 --save out/  # one input, in this process
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable

from tests.fuzz import campaign, target


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs to run")
    parser.add_argument("--seed", type=int, default=1, help="campaign seed (inputs are a function of it)")
    parser.add_argument("--start", type=int, default=0, help="index of the first input")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--timeout", type=float, default=5.0, help="watchdog seconds per input")
    parser.add_argument("--memory-mb", type=int, default=512, help="memory cap per worker, above its start")
    parser.add_argument("--json", help="also write the summary here as JSON")
    parser.add_argument("--replay", type=int, help="run only this input, in this process, and describe it")
    parser.add_argument("--save", help="with --replay: write the input's bytes into this folder")
    return parser


def _replay(args: argparse.Namespace) -> int:
    bases, originals = campaign.prepare(args.seed, 64)
    with tempfile.TemporaryDirectory() as scratch:
        item, kind, detail = campaign.run_one(args.seed, args.replay, bases, originals, scratch, args.timeout)
    print(f"input {item.index}: {item.base.name} + {', '.join(item.mutations)} ({len(item.data)} bytes)")
    print(f"outcome: {kind} {detail}")
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        path = os.path.join(args.save, f"input-{args.seed}-{item.index}.bin")
        with open(path, "wb") as stream:
            stream.write(item.data)
        print(f"saved {path}")
    return 1 if kind in target.FAILURES else 0


def _progress(every: float) -> Callable[[campaign.Summary], None]:
    last = [0.0]

    def show(summary: campaign.Summary) -> None:
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
                    "inputs": summary.inputs,
                    "seconds": summary.seconds,
                    "outcomes": dict(summary.outcomes),
                    "failures": summary.failures,
                },
                stream,
                indent=1,
            )
    return 1 if summary.failed else 0


if __name__ == "__main__":
    sys.exit(main())
