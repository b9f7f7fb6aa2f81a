"""ci/gate_approval.py: a GPU gate run needs a maintainer's `/gate <sha>` for the exact head."""

import http.server
import json
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci import gate_approval as ga  # noqa: E402

REPO = "attnbench/attnbench"
MAIN = "refs/heads/main"
HEAD = "a" * 40
BASE = "b" * 40


def comment_event(body=f"/gate {HEAD}", user="maint", action="created", on_pr=True):
    issue = {"number": 7}
    if on_pr:
        issue["pull_request"] = {"url": f"https://api.github.com/repos/{REPO}/pulls/7"}
    return {
        "action": action,
        "issue": issue,
        "comment": {"body": body, "user": {"login": user}},
        "repository": {"full_name": REPO, "default_branch": "main"},
        "sender": {"login": user},
    }


def dispatch_event(pr="7", sha=HEAD, user="maint"):
    return {
        "inputs": {"pr": pr, "sha": sha},
        "repository": {"full_name": REPO, "default_branch": "main"},
        "sender": {"login": user},
    }


def pull(head=HEAD, state="open", base_repo=REPO):
    return {
        "state": state,
        "head": {"sha": head, "repo": {"full_name": "someone/fork"}},
        "base": {"sha": BASE, "ref": "main", "repo": {"full_name": base_repo}},
    }


def api(perms=None, pulls=None):
    """A fake GetJson: users' permission levels and pull requests by number; 404 -> None."""
    perms = {"maint": "write", "owner": "admin"} if perms is None else perms
    pulls = {7: pull()} if pulls is None else pulls
    calls = []

    def get_json(path):
        calls.append(path)
        parts = path.strip("/").split("/")
        assert parts[:3] == ["repos", *REPO.split("/")], path
        if parts[3] == "collaborators" and parts[5] == "permission":
            level = perms.get(parts[4])
            return None if level is None else {"permission": level, "role_name": level}
        if parts[3] == "pulls":
            return pulls.get(int(parts[4]))
        raise AssertionError(f"unexpected API call {path}")

    get_json.calls = calls
    return get_json


def test_parse_command():
    assert ga.parse_command(f"/gate {HEAD}") == HEAD
    assert ga.parse_command(f"  /gate   {HEAD.upper()}  \nlooks good") == HEAD
    assert ga.parse_command("LGTM") is None
    assert ga.parse_command("") is None
    assert ga.parse_command(f"please /gate {HEAD}") is None  # only a leading command counts
    assert ga.parse_command(f"/gateway {HEAD}") is None
    assert ga.parse_command(None) is None
    for bad in ("/gate", "/gate abc1234", f"/gate {HEAD[:39]}g", f"/gate {HEAD} {HEAD}"):
        with pytest.raises(ga.Refusal, match="40-digit"):
            ga.parse_command(bad)


def test_maintainer_comment_for_the_head_is_approved():
    get = api()
    got = ga.authorize("issue_comment", comment_event(), REPO, MAIN, get)
    assert got == ga.Approval(pr=7, sha=HEAD, base_sha=BASE, approver="maint")
    assert got.outputs() == {
        "approved": "true", "pr": "7", "sha": HEAD, "base_sha": BASE, "approver": "maint",
    }  # fmt: skip
    assert get.calls == [f"/repos/{REPO}/collaborators/maint/permission", f"/repos/{REPO}/pulls/7"]
    # admin (and maintain, which the endpoint reports as write) approve too
    assert ga.authorize("issue_comment", comment_event(user="owner"), REPO, MAIN, api())


@pytest.mark.parametrize("level", ["read", "none", None])
def test_without_write_permission_refused(level):
    get = api(perms={"maint": "write"} | ({"rando": level} if level else {}))
    with pytest.raises(ga.Refusal, match="@rando has"):
        ga.authorize("issue_comment", comment_event(user="rando"), REPO, MAIN, get)
    assert not any("/pulls/" in c for c in get.calls)  # refused before the PR is looked at


def test_head_moved_since_the_approval_refused():
    newer = "c" * 40
    get = api(pulls={7: pull(head=newer)})
    with pytest.raises(ga.Refusal, match=f"head is {newer}, the approval names {HEAD}"):
        ga.authorize("issue_comment", comment_event(), REPO, MAIN, get)


@pytest.mark.parametrize(
    "pulls, match",
    [
        ({}, "not a pull request"),
        ({7: pull(state="closed")}, "is closed"),
        ({7: pull(base_repo="someone/fork")}, "does not target"),
    ],
)
def test_pull_request_state_refused(pulls, match):
    with pytest.raises(ga.Refusal, match=match):
        ga.authorize("issue_comment", comment_event(), REPO, MAIN, api(pulls=pulls))


def test_only_from_the_default_branch():
    for ref in ("refs/heads/feature", "refs/pull/7/merge", ""):
        with pytest.raises(ga.Refusal, match="default branch"):
            ga.authorize("issue_comment", comment_event(), REPO, ref, api())


def test_comments_that_ask_for_nothing():
    get = api()
    for event in (
        comment_event(body="nice work"),
        comment_event(on_pr=False),  # a comment on an issue, not a PR
        comment_event(action="edited"),  # an edited comment never approves
    ):
        assert ga.authorize("issue_comment", event, REPO, MAIN, get) is None
    assert get.calls == []


def test_other_events_refused():
    for name in ("pull_request", "pull_request_target", "pull_request_review", "push"):
        with pytest.raises(ga.Refusal, match="cannot start"):
            ga.authorize(name, comment_event(), REPO, MAIN, api())


def test_dispatch():
    got = ga.authorize("workflow_dispatch", dispatch_event(sha=HEAD.upper()), REPO, MAIN, api())
    assert got == ga.Approval(pr=7, sha=HEAD, base_sha=BASE, approver="maint")
    with pytest.raises(ga.Refusal, match="input pr"):
        ga.authorize("workflow_dispatch", dispatch_event(pr="7; rm -rf /"), REPO, MAIN, api())
    with pytest.raises(ga.Refusal, match="input sha"):
        ga.authorize("workflow_dispatch", dispatch_event(sha="main"), REPO, MAIN, api())
    with pytest.raises(ga.Refusal, match="@rando"):
        ga.authorize("workflow_dispatch", dispatch_event(user="rando"), REPO, MAIN, api())


def run_main(tmp_path, event_name, event, get_json):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path, out = tmp_path / "event.json", tmp_path / "out"
    path.write_text(json.dumps(event))
    argv = ["--event", str(path), "--event-name", event_name, "--repo", REPO, "--ref", MAIN,
            "--github-output", str(out)]  # fmt: skip
    code = ga.main(argv, get_json=get_json)
    lines = out.read_text().splitlines() if out.exists() else []
    return code, dict(line.split("=", 1) for line in lines)


def test_main_outputs(tmp_path, capsys):
    code, out = run_main(tmp_path, "issue_comment", comment_event(), api())
    assert code == 0 and out["approved"] == "true" and out["sha"] == HEAD
    assert out["base_sha"] == BASE and out["pr"] == "7"

    code, out = run_main(tmp_path / "x", "issue_comment", comment_event(body="hi"), api())
    assert (code, out) == (0, {"approved": "false"})

    code, out = run_main(tmp_path / "y", "issue_comment", comment_event(user="rando"), api())
    assert (code, out) == (1, {"approved": "false"})
    assert "::error::GPU gate refused: @rando" in capsys.readouterr().out


@pytest.fixture()
def fake_api_server():
    """A local HTTP server answering like the REST API; records each request's headers."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            seen.append((self.path, dict(self.headers)))
            if self.path == f"/repos/{REPO}/collaborators/maint/permission":
                body, code = {"permission": "write", "role_name": "maintain"}, 200
            elif self.path == f"/repos/{REPO}/pulls/7":
                body, code = pull(), 200
            elif self.path.endswith("/boom"):
                body, code = {"message": "server error"}, 500
            else:
                body, code = {"message": "Not Found"}, 404
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_api_getter_over_http(fake_api_server, tmp_path, monkeypatch):
    url, seen = fake_api_server
    get = ga.api_getter(url, "tok123")
    assert get(f"/repos/{REPO}/pulls/7")["head"]["sha"] == HEAD
    assert get(f"/repos/{REPO}/pulls/8") is None  # 404
    with pytest.raises(Exception, match="500"):
        get(f"/repos/{REPO}/boom")
    headers = seen[0][1]
    assert headers["Authorization"] == "Bearer tok123"
    assert headers["Accept"] == "application/vnd.github+json"

    # the whole command, as the workflow runs it, against the same server
    monkeypatch.setenv("GH_TOKEN", "tok456")
    path, out = tmp_path / "event.json", tmp_path / "out"
    path.write_text(json.dumps(comment_event()))
    argv = ["--event", str(path), "--event-name", "issue_comment", "--repo", REPO,
            "--ref", MAIN, "--github-output", str(out), "--api-url", url]  # fmt: skip
    assert ga.main(argv) == 0
    assert f"sha={HEAD}" in out.read_text().splitlines()
    assert seen[-1][1]["Authorization"] == "Bearer tok456"
