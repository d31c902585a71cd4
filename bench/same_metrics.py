"""Whether two runs computed the same thing: every metric of two ``metrics.jsonl`` files, step
by step, bit for bit, except the ones that measure time (timing, throughput, MFU, memory).

    python bench/same_metrics.py RUN_A/metrics.jsonl RUN_B/metrics.jsonl

Prints one JSON line per file pair: steps and metrics compared, and each metric that differs
(at most 20) with its first differing step. Exits 1 when any compared metric differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Metrics of wall-clock time and of the host: they differ between any two runs.
TIMED = ("timing_s/", "timing_per_token_ms/", "perf/", "time/")


def steps(path: Path) -> dict[int, dict[str, float]]:
    """{step: metrics} of a metrics.jsonl file, without the timed ones."""
    found: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        data = {k: v for k, v in record["data"].items() if not k.startswith(TIMED)}
        found.setdefault(record["step"], {}).update(data)
    return found


def compare(a: Path, b: Path) -> dict[str, object]:
    """The comparison of two runs' metrics as one JSON-ready dict."""
    left, right = steps(a), steps(b)
    differing: dict[str, int] = {}
    compared = 0
    for step in sorted(set(left) | set(right)):
        one, two = left.get(step, {}), right.get(step, {})
        for key in sorted(set(one) | set(two)):
            compared += 1
            if one.get(key) != two.get(key) and key not in differing:
                differing[key] = step
    return {
        "a": str(a),
        "b": str(b),
        "steps": len(set(left) | set(right)),
        "metrics_compared": compared,
        "identical": not differing,
        "differing": dict(list(differing.items())[:20]),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    result = compare(Path(argv[0]), Path(argv[1]))
    print(json.dumps(result))
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
