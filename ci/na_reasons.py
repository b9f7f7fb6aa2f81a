"""Why a benchmark point has no value: one encoding for the report, the site and the gate.

asv 0.6.6 keeps, per benchmark and parameter combination of a result file, one of:

    a number   measured
    NaN        the process ran and recorded no value: `setup` raised NotImplementedError
               (a point the suite skips by choice: an API the commit lacks, a size a
               preset does not run, a dense matrix larger than the device) or the method
               returned NaN (benchmarks/common.py's `oom_as_nan`, after an out-of-memory
               error)
    null       the process failed (an exception, a crash, a timeout)
    absent     never run: the combination is not in the grid of the suite that ran (the
               default suite runs no dense reference), or the benchmark is not in the file

asv cannot tell an out-of-memory NaN from a skip. A benchmark that hits an OOM therefore
also appends one line to an OOM log (`record_oom`), a JSON object per line:

    {"commit": "<40 hex>", "benchmark": "nsa.NsaForward.track_time",
     "params": ["4096", "'reference'", "'seed'", "'recent'"], "reason": "out-of-memory"}

`params` are asv's strings (each value's repr, in `param_names` order). The log of a
machine lives next to its results, `<results>/<machine>/na_reasons.jsonl` (asv reads only
`*.json` there). A NaN point with a matching line is out of memory; without one it is
skipped. So an OOM is reported only where one was recorded.

The writer in a benchmark process cannot import this module (asv_runner makes only the
`benchmarks` package importable there), so benchmarks/common.py writes the same line
itself: the path from the environment (`ATTNBENCH_NA_LOG`, exported by the job that runs
asv) and the commit from `ASV_COMMIT` (asv sets it for every benchmark process).
`record_oom` here is the reference writer, for tests and tools.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

LOG_NAME = "na_reasons.jsonl"


class NaReason(enum.Enum):
    """The reason a point has no value; `.value` is the code CSV files carry."""

    OUT_OF_MEMORY = "out-of-memory"
    FAILED = "failed"
    SKIPPED = "skipped"
    NOT_RUN = "not-run"

    @property
    def label(self) -> str:
        """Words for tables, plot legends and summaries."""
        return LABELS[self]


LABELS = {
    NaReason.OUT_OF_MEMORY: "out of memory",
    NaReason.FAILED: "failed",
    NaReason.SKIPPED: "skipped by choice",
    NaReason.NOT_RUN: "not run",
}


def is_measured(value) -> bool:
    """A finite number (bools are not figures)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def classify(value, present: bool = True, oom: bool = False) -> NaReason | None:
    """The reason a stored asv value is missing; None for a measured value.

    value: one entry of a result file's `result` list (number, NaN or None); present: the
    combination is in the file at all; oom: the OOM log holds a line for this point.
    """
    if not present:
        return NaReason.NOT_RUN
    if value is None:
        return NaReason.FAILED
    if is_measured(value):
        return None
    return NaReason.OUT_OF_MEMORY if oom else NaReason.SKIPPED


def log_path(results_dir: str | Path, machine: str) -> Path:
    """Where a machine's OOM log lives."""
    return Path(results_dir) / machine / LOG_NAME


def record_oom(path: str | Path, commit: str, benchmark: str, params: Sequence[str]) -> None:
    """Append one out-of-memory line to the log at `path` (parent directories created).

    commit: the commit measured (asv exports it as ASV_COMMIT); benchmark: asv's name,
    `module.Class.method`; params: asv's strings for the point, in `param_names` order.
    """
    line = {
        "commit": str(commit),
        "benchmark": str(benchmark),
        "params": [str(p) for p in params],
        "reason": NaReason.OUT_OF_MEMORY.value,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def load_oom(path: str | Path) -> set[tuple[str, str, tuple[str, ...]]]:
    """(commit, benchmark, params) of every OOM line in the log; empty when there is none.

    Lines that are not JSON objects with those keys are ignored (a log cut short by a
    crash still yields its complete lines).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return set()
    out = set()
    for line in text.splitlines():
        try:
            rec = json.loads(line)
            if rec.get("reason") != NaReason.OUT_OF_MEMORY.value:
                continue
            out.add((str(rec["commit"]), str(rec["benchmark"]), tuple(map(str, rec["params"]))))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def is_oom(log: set, commit: str, benchmark: str, params: Sequence[str]) -> bool:
    """The log (from `load_oom`) holds this point; `commit` may be a prefix of 8+ chars."""
    key = tuple(map(str, params))
    return any(
        b == benchmark and p == key and (c.startswith(commit) or commit.startswith(c))
        for c, b, p in log
        if min(len(c), len(commit)) >= 8
    )


# What `asv compare` prints in place of a value, and the reasons each can stand for: it
# shows NaN and a benchmark missing from one side's results alike.
COMPARE_CELLS = {
    "n/a": (NaReason.SKIPPED, NaReason.OUT_OF_MEMORY, NaReason.NOT_RUN),
    "failed": (NaReason.FAILED,),
}


def compare_note(cells: Iterable[str]) -> str:
    """A line explaining the value-less cells of `asv compare` rows among `cells` (e.g. the
    Before and After cells of every row); "" when there is none."""
    found = {c.strip() for c in cells} & set(COMPARE_CELLS)
    parts = []
    for cell in (c for c in COMPARE_CELLS if c in found):
        labels = [LABELS[r] for r in COMPARE_CELLS[cell]]
        words = labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " or " + labels[-1]
        parts.append(f"`{cell}`: {words}")
    return "; ".join(parts)


def describe(reasons: Iterable[NaReason | None]) -> str:
    """The distinct reasons of a set of points, in a fixed order: "out of memory, not run";
    "" when every point was measured."""
    found = {r for r in reasons if r is not None}
    return ", ".join(LABELS[r] for r in NaReason if r in found)
