"""ci/gate_verdict.py: the commit status gpu-gate is success only for a gate that ran on
the PR's current head and passed; the job fails otherwise."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci import gate_verdict  # noqa: E402

SHA, NEW = "a" * 40, "b" * 40


@pytest.mark.parametrize(
    "authorize,approved,gate,head,state,code",
    [
        ("success", "true", "success", SHA, "success", 0),  # the only passing case
        ("success", "true", "failure", SHA, "failure", 1),
        ("success", "true", "cancelled", SHA, "error", 1),
        ("success", "true", "skipped", SHA, "error", 1),  # a skipped gate is no success
        ("success", "true", "success", NEW, "success", 1),  # the head moved on: job fails
        ("failure", "false", "skipped", None, None, 1),  # a refused /gate
        ("cancelled", "", "skipped", None, None, 1),
        ("skipped", "", "skipped", None, None, 0),  # a comment that asked for no gate
        ("success", "false", "skipped", None, None, 0),
    ],
)
def test_decide(authorize, approved, gate, head, state, code):
    d = gate_verdict.decide(authorize, approved, gate, SHA, head)
    assert (d.state, d.code) == (state, code), d.description


def run(argv_extra, head=SHA):
    posts = []
    gets = []

    def get_json(path):
        gets.append(path)
        return {"head": {"sha": head}}

    argv = ["--repo", "org/repo", "--target-url", "https://github.com/org/repo/actions/runs/1",
            *argv_extra]  # fmt: skip
    code = gate_verdict.main(argv, get_json, lambda path, body: posts.append((path, body)))
    return code, posts, gets


def test_main_writes_the_status_on_the_approved_commit():
    code, posts, gets = run(["--authorize", "success", "--approved", "true", "--pr", "7",
                             "--sha", SHA, "--gate", "success"])  # fmt: skip
    assert code == 0 and gets == ["/repos/org/repo/pulls/7"]
    ((path, body),) = posts
    assert path == f"/repos/org/repo/statuses/{SHA}"
    assert body["state"] == "success" and body["context"] == "gpu-gate"
    assert body["target_url"].startswith("https://")


def test_main_fails_a_gate_that_did_not_pass_or_a_moved_head(capsys):
    code, posts, _ = run(["--authorize", "success", "--approved", "true", "--pr", "7",
                          "--sha", SHA, "--gate", "skipped"])  # fmt: skip
    assert code == 1 and posts[0][1]["state"] == "error"
    code, posts, _ = run(["--authorize", "success", "--approved", "true", "--pr", "7",
                          "--sha", SHA, "--gate", "success"], head=NEW)  # fmt: skip
    assert code == 1 and "moved on to bbbbbbbb" in capsys.readouterr().out


def test_main_writes_nothing_without_an_approval():
    code, posts, gets = run(["--authorize", "skipped", "--gate", "skipped"])
    assert (code, posts, gets) == (0, [], [])
    code, posts, gets = run(["--authorize", "failure", "--gate", "skipped"])
    assert (code, posts, gets) == (1, [], [])
    # an approval without a well-formed commit or PR number writes nothing either
    code, posts, _ = run(["--authorize", "success", "--approved", "true", "--pr", "7",
                          "--sha", "abc", "--gate", "success"])  # fmt: skip
    assert (code, posts) == (1, [])
