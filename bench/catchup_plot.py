#!/usr/bin/env python3
"""Plot catch-up runs one above the other, e.g. the same broker under two
client setups: produce and tail p99 per second, the backfill shaded.

usage: bench/catchup_plot.py OUT.png LABEL=RUN.json[:BROKER] ...

RUN.json is what `bench/catchup.py --json` writes; BROKER (keel or kafka,
default keel) picks one broker's result from it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from catchup import plot  # noqa: E402


def main() -> None:
    if len(sys.argv) < 3 or any("=" not in a for a in sys.argv[2:]):
        raise SystemExit(__doc__)
    runs = {}
    for arg in sys.argv[2:]:
        label, _, spec = arg.partition("=")
        path, _, broker = spec.partition(":")
        runs[label] = json.loads(Path(path).read_text())["results"][broker or "keel"]
    print(plot(runs, Path(sys.argv[1])))


if __name__ == "__main__":
    main()
