#!/usr/bin/env python3
"""The GPU gate's verdict: the commit status `gpu-gate`, success only for a gate that ran.

The last job of `.github/workflows/gpu-pr-gate.yml` runs whatever happened before it
(`if: always()`), on a GitHub-hosted runner with the default branch's scripts. GitHub
reports a job skipped by its `if:` as successful, so a required check taken from a job's
own result could be met by a gate that never ran; this job instead writes the commit status
`gpu-gate` (the check branch protection requires) on the approved commit itself:

    success  the approval job approved the commit, the gate job (every GPU type of its
             matrix) succeeded, and the pull request's head is still that commit;
    failure  the gate ran and failed (a slowdown, a lost number, a benchmark failure, a
             refused head);
    error    the gate was approved but did not finish (cancelled, skipped, timed out).

The job itself exits 1 unless the status it wrote is success and the pull request's head is
still the gated commit; when the head moved on, the gated commit keeps its status and the new
head has none, so the pull request stays blocked until a maintainer gates the new head. An
event that asked for no gate (a comment that is no `/gate` command) writes nothing and exits
0: the required status stays absent, so nothing is satisfied by it. A refused request (the
approval job failed) writes nothing and exits 1.

Usage (in the workflow; GH_TOKEN with `statuses: write` and `pull-requests: read`):
    python3 -m ci.gate_verdict --repo "$GITHUB_REPOSITORY" --authorize "$AUTH_RESULT" \
        --approved "$APPROVED" --pr "$PR" --sha "$HEAD_SHA" --gate "$GATE_RESULT" \
        --target-url "$RUN_URL"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from ci.gate_approval import FULL_SHA, PR_NUMBER, GetJson, api_getter

CONTEXT = "gpu-gate"
# POST path, JSON body -> None (raises on an HTTP error).
PostJson = Callable[[str, dict], None]


@dataclass(frozen=True)
class Decision:
    """state: the status to write (None: write none); description: its words; code: the
    job's exit code."""

    state: str | None
    description: str
    code: int


def decide(authorize: str, approved: str, gate: str, sha: str, head: str | None) -> Decision:
    """The verdict from the jobs' results (`needs.<job>.result`: success, failure,
    cancelled, skipped), the approval's output and the pull request's current head."""
    if authorize == "skipped" or (authorize == "success" and approved != "true"):
        return Decision(None, "no gate was requested by this event", 0)
    if authorize != "success" or approved != "true":
        return Decision(None, f"the gate request was refused or stopped ({authorize})", 1)
    if gate == "success":
        state, words = "success", "no significant slowdown, no number lost"
    elif gate == "failure":
        state, words = "failure", "slowdown, lost number, benchmark failure or refused run"
    else:
        state, words = "error", f"the gate did not finish ({gate})"
    if head is not None and head != sha:
        return Decision(state, f"{words}; the PR's head moved on to {head[:8]}: gate it", 1)
    return Decision(state, words, 0 if state == "success" else 1)


def api_poster(api_url: str, token: str | None, timeout: float = 30.0) -> PostJson:
    """A PostJson over HTTPS for the REST API at `api_url`, with `token`."""

    def post_json(path: str, body: dict) -> None:
        req = urllib.request.Request(
            api_url.rstrip("/") + path, data=json.dumps(body).encode(), method="POST"
        )
        req.add_header("Accept", "application/vnd.github+json")
        req.add_header("X-GitHub-Api-Version", "2022-11-28")
        req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(req, timeout=timeout):
            pass

    return post_json


def main(
    argv: list[str] | None = None,
    get_json: GetJson | None = None,
    post_json: PostJson | None = None,
) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="GITHUB_REPOSITORY (owner/name)")
    ap.add_argument("--authorize", required=True, help="needs.authorize.result")
    ap.add_argument("--approved", default="", help="needs.authorize.outputs.approved")
    ap.add_argument("--pr", default="", help="needs.authorize.outputs.pr")
    ap.add_argument("--sha", default="", help="needs.authorize.outputs.sha")
    ap.add_argument("--gate", required=True, help="needs.gate.result")
    ap.add_argument("--target-url", default="", help="the run's page")
    ap.add_argument("--api-url", default=os.environ.get("GITHUB_API_URL", "https://api.github.com"))
    args = ap.parse_args(argv)

    token = os.environ.get("GH_TOKEN")
    get_json = get_json or api_getter(args.api_url, token)
    post_json = post_json or api_poster(args.api_url, token)
    head = None
    if args.authorize == "success" and args.approved == "true":
        if not FULL_SHA.match(args.sha) or not PR_NUMBER.match(args.pr):
            print(f"::error::gate_verdict: the approval gave no commit or PR ({args.sha!r}, "
                  f"{args.pr!r})")  # fmt: skip
            return 1
        pull = get_json(f"/repos/{args.repo}/pulls/{args.pr}") or {}
        head = str((pull.get("head") or {}).get("sha", "")).lower() or "unknown"
    d = decide(args.authorize, args.approved, args.gate, args.sha.lower(), head)
    if d.state is not None:
        body = {"state": d.state, "context": CONTEXT, "description": d.description[:140]}
        if re.match(r"^https://", args.target_url):
            body["target_url"] = args.target_url
        post_json(f"/repos/{args.repo}/statuses/{args.sha.lower()}", body)
        print(f"gate_verdict: {CONTEXT} = {d.state} on {args.sha}: {d.description}")
    print(f"{'::error::' if d.code else ''}gate_verdict: {d.description}")
    return d.code


if __name__ == "__main__":
    sys.exit(main())
