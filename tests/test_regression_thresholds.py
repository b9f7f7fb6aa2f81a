"""asv.conf.json's regressions_thresholds against the suite's own benchmark list.

asv reads every increase as a regression, so a higher-is-better figure (a rate) must match
the exclusion pattern, and a cost (time, memory) must keep the site's threshold. The list
comes from asv_runner's own discovery, the one `asv run` uses, in each mode of the suite
(smoke, the default GPU suite, the nightly sweep, the seed's view that the main job runs
at HEAD: discovery touches no GPU, so all of them can be listed on a CPU). The rule: a
benchmark's unit says which side it is on; "seconds" and "bytes" are costs, any other unit
is a rate. A new rate named outside the naming rule in asv.conf.json therefore fails here.
The host-paced times (`track_time_eager`, `track_time_host`, in every class) are costs with
a threshold of their own (HOST_THRESHOLD), since they move more between runs than graph
replays.
"""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from _suite_list import list_suites

ROOT = Path(__file__).resolve().parents[1]
COST_UNITS = {"seconds", "bytes"}
SITE_THRESHOLD = 0.02
# The site's history is one process per commit, judged by its median: the host figures'
# spread of a single process (up to 1.5-2x, docs/measurement.md) needs more than the gate's
# low-quantile factor.
HOST_THRESHOLD = 0.3
HOST_FIGURE = re.compile(r"\.track_time_(eager|host)\b")
EXCLUDED = 1e6  # a relative change no benchmark can show


@pytest.fixture(scope="module")
def suite():
    """{mode: [{name, unit, params, version}]} of every benchmark asv discovers."""
    return {mode: listed["benchmarks"] for mode, listed in list_suites().items()}


def threshold(entry_name: str) -> float:
    """asv 0.6.6's own threshold lookup for one entry of the regressions page."""
    from asv.plugins.regressions import _GraphDataFilter
    from asv.util import load_json

    conf = SimpleNamespace(**load_json(str(ROOT / "asv.conf.json"), js_comments=True))
    graph = SimpleNamespace(params={"branch": "main"})
    return _GraphDataFilter(conf, None, {})._get_threshold(graph, None, entry_name)


def entry_names(bench: dict) -> list[str]:
    """The names asv gives a benchmark's data sets: `name(p1, p2, ...)` per parameter set,
    as in asv.plugins.regressions (one set is enough; the name's method part decides)."""
    if not bench["params"]:
        return [bench["name"]]
    first = [axis[0] for axis in bench["params"]]
    return [f"{bench['name']}({', '.join(first)})"]


def test_every_mode_lists_benchmarks(suite):
    assert set(suite) == {"smoke", "default", "nightly", "view", "smoke-view"}
    for mode, benches in suite.items():
        assert any(b["unit"] == "seconds" for b in benches), mode
    names = {b["name"] for benches in suite.values() for b in benches}
    # The rates left in the suite, the device ceilings, are in the list that is checked; the
    # derived rates are tools/report.py's now and no benchmark of the suite.
    assert {"ceilings.CopyRate.track_copy_gb_per_s", "ceilings.Matmul.track_bf16_tflops"} <= names
    assert not [n for n in names if n.startswith("common.")]  # common.py is no benchmark module
    retired = {"kda.KdaBandwidth.track_pct_of_copy_rate", "nsa.NsaForward.track_tokens_per_s",
               "nsa.NsaBackward.track_tflops", "nsa.NsaForward.track_pct_of_matmul"}  # fmt: skip
    assert not retired & names


def test_every_rate_is_excluded_and_every_cost_is_kept(suite):
    seen = {}
    for benches in suite.values():
        for b in benches:
            seen[b["name"]] = b
    for b in seen.values():
        for entry in entry_names(b):
            got = threshold(entry)
            if b["unit"] in COST_UNITS and HOST_FIGURE.search(entry):
                assert b["unit"] == "seconds" and got == HOST_THRESHOLD, (
                    f"{entry} is a host-paced time: its threshold is {HOST_THRESHOLD}"
                )
            elif b["unit"] in COST_UNITS:
                assert got == SITE_THRESHOLD, f"{entry} ({b['unit']}) is a cost: keep it at 2%"
            else:
                assert got >= EXCLUDED, (
                    f"{entry} has unit {b['unit']!r}, a higher-is-better figure: name it by "
                    "the rule in asv.conf.json's regressions_thresholds, or give it a cost unit"
                )


def test_the_check_can_fail():
    """A rate named outside the rule keeps the 2% threshold (so the test above flags it)."""
    assert threshold("kda.KdaBandwidth.track_copy_rate(1)") == SITE_THRESHOLD
    assert threshold("nsa.NsaForward.track_tokens_per_s(4096)") >= EXCLUDED
    assert threshold("ceilings.Matmul.track_bf16_tflops") >= EXCLUDED
    # The ceilings' names before benchmarks/ceilings.py: their stored history stays excluded.
    assert threshold("common.Matmul.track_bf16_tflops") >= EXCLUDED
    assert threshold("common.CopyRate.track_copy_gb_per_s") >= EXCLUDED
    assert threshold("nsa.NsaForward.track_time(4096, 'per_s')") == SITE_THRESHOLD


def test_host_paced_times_have_their_own_threshold(suite):
    """Every class's eager and host figures get the host threshold; the graph and cold
    figures, and a name that only starts like one, keep the site's."""
    names = {b["name"] for benches in suite.values() for b in benches}
    host = sorted(n for n in names if HOST_FIGURE.search(n))
    classes = {n.rsplit(".", 1)[0] for n in host}
    assert {"nsa.NsaAutograd", "nsa.NsaSeedBackward"} <= classes, host
    for name in host:
        assert threshold(f"{name}(4096)") == HOST_THRESHOLD, name
    for name in ("nsa.NsaAutograd.track_time_host(4096, 'seed')",
                 "nsa.NsaSeedBackward.track_time_eager(4096)",
                 "nsa.NsaForward.track_time_host"):  # fmt: skip
        assert threshold(name) == HOST_THRESHOLD, name
    for name in ("nsa.NsaForward.track_time(4096)", "nsa.NsaForward.track_time_cold(4096)",
                 "nsa.NsaForward.track_time_hosted(4096)",
                 "nsa.NsaForward.track_peak_vram_bytes(4096)"):  # fmt: skip
        assert threshold(name) == SITE_THRESHOLD, name
