"""`tools/dev/gpu_queue.sh`: a queue of GPU jobs run within a budget, in the background, and
polled (run here on the CPU with shell commands for jobs; this host has no GPU)."""

import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools/dev/gpu_queue.sh"
QUEUE = """\
# a comment, then a blank line

first    5    any  sleep 2; echo hi > $JOB_OUT/file.txt; echo "path=$PYTHONPATH"
fails    5    any  exit 3
h200     5    H200 echo never > $JOB_OUT/ran
big      1000 any  echo never > $JOB_OUT/ran
slow     1    any  sleep 30
last     5    any  echo "quoted 'words' kept" > $JOB_OUT/file.txt
"""


def queue(tmp_path, *args):
    env = {
        "PATH": "/usr/bin:/bin",
        "BG_DIR": str(tmp_path / "bg"),
        "QUEUE_DIR": str(tmp_path / "queue"),
        "QUEUE_SITE": str(tmp_path / "site"),
        "WHEELHOUSE": str(tmp_path / "no-wheelhouse"),
        "OUT": str(tmp_path / "out"),
    }
    return subprocess.run(["bash", str(TOOL), *args], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_jobs_run_in_order_within_the_budget_and_come_back_packed(tmp_path):
    (tmp_path / "out").mkdir()
    qfile = tmp_path / "q.queue"
    qfile.write_text(QUEUE)
    started = queue(tmp_path, "start", str(qfile), "100", "1")
    assert started.returncode == 3, started.stdout + started.stderr  # still running
    done = queue(tmp_path, "poll", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    status = {
        line.split()[0]: line.split()[1]
        for line in (tmp_path / "queue/queue.txt").read_text().splitlines()[1:]
    }
    assert status == {
        "first": "ok",
        "fails": "rc=3",
        "h200": "gpu",  # this host's GPU is "none"
        "big": "budget",  # 1000 s expected, 100 s of budget
        "slow": "rc=124",  # stopped at twice its expected second
        "last": "ok",
    }
    with tarfile.open(tmp_path / "out/queue.tgz") as tar:
        names = set(tar.getnames())
        assert {"./queue.txt", "./queue.log", "./first/file.txt", "./first/log"} <= names
        assert not any(n.endswith("/ran") for n in names)
        text = tar.extractfile("./last/file.txt").read().decode()
    assert text == "quoted 'words' kept\n"
    log = (tmp_path / "queue/first/log").read_text()
    assert f"path={tmp_path / 'site'}:{ROOT / 'src'}:{ROOT}" in log


def test_the_pending_queue_parses(tmp_path):
    """The shipped queue: every job line has a name, a whole number of seconds and a place."""
    lines = [
        line.split(None, 3)
        for line in (ROOT / "tools/dev/queues/pending.queue").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines
    for name, expected, where, command in lines:
        assert name.replace("_", "").replace("-", "").isalnum()
        assert int(expected) > 0
        assert where == "any" or where.isalnum()
        assert command.strip()
    assert len({line[0] for line in lines}) == len(lines)


def test_usage_errors(tmp_path):
    assert queue(tmp_path).returncode == 2
    assert queue(tmp_path, "start", str(tmp_path / "missing.queue"), "10").returncode == 2
    assert queue(tmp_path, "stop").returncode == 2
