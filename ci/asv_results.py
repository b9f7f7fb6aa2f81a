"""Read asv's stored results of one commit as {point name: value}, point by point.

A point is one parameter combination of one benchmark, named as `asv continuous` and
`asv compare` print it: `module.Class.method(param, ...)` with asv's own repr of each
parameter (or the bare name when the benchmark has no parameters). Used by the PR gate's
confirmation stage (`ci.confirm`) and the gate study (`tools/dev/gate_study.py`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass


def _stored_points(results_dir, machine, commit, per_key):
    """(point name, item) for each parameter combination of one commit's stored results,
    where per_key(result, key, params) gives one item per combination."""
    from asv.results import iter_results_for_machine_and_hash

    for res in iter_results_for_machine_and_hash(str(results_dir), machine, commit):
        for key in res.get_all_result_keys():
            params = res.get_result_params(key)
            combos = itertools.product(*params) if params else [()]
            for combo, item in zip(combos, per_key(res, key, params), strict=True):
                yield (f"{key}({', '.join(combo)})" if params else key), item


def stored_samples(results_dir, machine, commit):
    """{point name: samples} of one commit's stored results (points without samples left out)."""
    points = _stored_points(
        results_dir, machine, commit, lambda r, k, p: r.get_result_samples(k, p)
    )
    return {name: list(s) for name, s in points if s}


def stored_values(results_dir, machine, commit):
    """{point name: value} (asv's median; None and NaN left out) of one commit's results."""
    points = _stored_points(results_dir, machine, commit, lambda r, k, p: r.get_result_value(k, p))
    return {name: v for name, v in points if v is not None and v == v}


@dataclass(frozen=True)
class Point:
    """One stored parameter combination of one benchmark at one commit.

    name: the point's name as asv compare prints it; benchmark: `module.Class.method`;
    params: asv's string for each parameter, in `param_names` order; value: what the file
    holds, raw (a number, NaN when the process recorded no value, None when it failed);
    ci: the (lower, upper) bounds of asv's 99% interval of the median, None without one.
    """

    name: str
    benchmark: str
    params: tuple[str, ...]
    value: float | None
    ci: tuple[float, float] | None


def _ci(stats):
    try:
        lo, hi = float(stats["ci_99_a"]), float(stats["ci_99_b"])
    except (TypeError, KeyError, ValueError):
        return None
    return (lo, hi) if lo == lo and hi == hi else None


def stored_points(results_dir, machine, commit):
    """{point name: Point} of every parameter combination one commit's result files hold,
    measured or not (n/a values kept raw, for ci.na_reasons.classify); empty when the
    commit has no result file for the machine."""
    from asv.results import iter_results_for_machine_and_hash

    out = {}
    for res in iter_results_for_machine_and_hash(str(results_dir), machine, commit):
        for key in res.get_all_result_keys():
            params = res.get_result_params(key)
            combos = list(itertools.product(*params)) if params else [()]
            values = res.get_result_value(key, params)
            stats = res.get_result_stats(key, params)
            for combo, value, st in zip(combos, values, stats, strict=True):
                name = f"{key}({', '.join(combo)})" if params else key
                out[name] = Point(name, key, tuple(combo), value, _ci(st))
    return out
