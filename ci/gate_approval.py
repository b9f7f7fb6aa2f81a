#!/usr/bin/env python3
"""Decide whether a GPU gate run is approved: a maintainer named the PR's exact head commit.

The GPU gate (`.github/workflows/gpu-pr-gate.yml`) is started by a comment on a pull request
or by a manual dispatch, never by the pull request itself, so the workflow that runs is
always the one on the default branch. This script is its first job, on a GitHub-hosted
runner; it reads the event and asks the REST API, and approves when all of these hold:

- the event is a new comment on a pull request whose first line is `/gate <sha>`, or a
  `workflow_dispatch` with the inputs `pr` and `sha`; `<sha>` is a full 40-digit commit
  hash (a short one could name another commit later);
- the workflow runs from the default branch (`GITHUB_REF` is `refs/heads/<default>`);
- the commenter (or dispatcher) has write, maintain or admin permission on the repository
  (`GET /repos/{repo}/collaborators/{user}/permission`: `permission` is `write` or
  `admin`; maintain counts as write there);
- the pull request is open, targets this repository, and its head is that commit now.

Only the event and the API's answers decide; nothing of the pull request's content is read.
On approval it writes `approved=true`, `pr`, `sha`, `base_sha` and `approver` to
`$GITHUB_OUTPUT`; a comment that is no gate command gives `approved=false` and exit 0; a
gate command that is refused prints the reason as an error annotation and exits 1.

Usage (in the workflow; GH_TOKEN needs only read access):
    python3 -m ci.gate_approval --event "$GITHUB_EVENT_PATH" \
        --event-name "$GITHUB_EVENT_NAME" --repo "$GITHUB_REPOSITORY" --ref "$GITHUB_REF" \
        --github-output "$GITHUB_OUTPUT"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

COMMAND = "/gate"
FULL_SHA = re.compile(r"^[0-9a-fA-F]{40}$")
PR_NUMBER = re.compile(r"^[1-9][0-9]{0,9}$")
# The legacy base roles the permission endpoint reports; maintain maps to write there.
WRITE_PERMISSIONS = frozenset({"write", "admin"})

# GET path -> parsed JSON; None when the API answers 404 (no such user, pull request, ...).
GetJson = Callable[[str], "dict | None"]


class Refusal(Exception):
    """A gate command that must not run; the message says why (for the run's log)."""


@dataclass(frozen=True)
class Approval:
    """An approved gate run: pull request number, approved head and base commits, approver."""

    pr: int
    sha: str
    base_sha: str
    approver: str

    def outputs(self) -> dict[str, str]:
        """The step outputs the later jobs read."""
        return {
            "approved": "true",
            "pr": str(self.pr),
            "sha": self.sha,
            "base_sha": self.base_sha,
            "approver": self.approver,
        }


def parse_command(body: str) -> str | None:
    """The commit that a comment's `/gate <sha>` names, lower-case; None if no gate command.

    Only the first line counts. Raises Refusal for `/gate` with no argument, with a short or
    malformed hash, or with anything after the hash.
    """
    if not isinstance(body, str):
        return None
    lines = body.strip().splitlines()
    words = lines[0].split() if lines else []
    if not words or words[0] != COMMAND:
        return None
    if len(words) != 2 or not FULL_SHA.match(words[1]):
        raise Refusal(
            f"write `{COMMAND} <sha>` with the pull request's full 40-digit head commit "
            f"on the first line (got {lines[0].strip()!r})"
        )
    return words[1].lower()


def requested(event_name: str, event: dict) -> tuple[int, str, str] | None:
    """(pull request number, commit, actor) that the event asks to gate; None if none."""
    if event_name == "issue_comment":
        issue = event.get("issue") or {}
        if event.get("action") != "created" or "pull_request" not in issue:
            return None
        sha = parse_command((event.get("comment") or {}).get("body", ""))
        if sha is None:
            return None
        actor = ((event.get("comment") or {}).get("user") or {}).get("login", "")
        return int(issue["number"]), sha, actor
    if event_name == "workflow_dispatch":
        inputs = event.get("inputs") or {}
        pr, sha = str(inputs.get("pr", "")).strip(), str(inputs.get("sha", "")).strip()
        if not PR_NUMBER.match(pr):
            raise Refusal(f"input pr must be a pull request number (got {pr!r})")
        if not FULL_SHA.match(sha):
            raise Refusal(f"input sha must be a full 40-digit commit hash (got {sha!r})")
        return int(pr), sha.lower(), (event.get("sender") or {}).get("login", "")
    raise Refusal(f"event {event_name!r} cannot start the GPU gate")


def authorize(event_name: str, event: dict, repo: str, ref: str, get_json: GetJson):
    """Approval for the gate run that `event` asks for, or None when it asks for none.

    event_name/event: GITHUB_EVENT_NAME and the parsed GITHUB_EVENT_PATH file; repo:
    "owner/name"; ref: GITHUB_REF; get_json: GET of a REST API path (see GetJson).
    Raises Refusal when a gate run was asked for and must not happen.
    """
    req = requested(event_name, event)
    if req is None:
        return None
    pr, sha, actor = req
    default = (event.get("repository") or {}).get("default_branch")
    if not default or ref != f"refs/heads/{default}":
        raise Refusal(f"the gate runs only from the default branch ({default}), not {ref}")
    if not actor:
        raise Refusal("the event names no user")

    perm = get_json(f"/repos/{repo}/collaborators/{urllib.parse.quote(actor)}/permission")
    level = (perm or {}).get("permission", "none")
    if level not in WRITE_PERMISSIONS:
        raise Refusal(
            f"@{actor} has {level!r} permission; approving a GPU run needs write, maintain or admin"
        )

    pull = get_json(f"/repos/{repo}/pulls/{pr}")
    if pull is None:
        raise Refusal(f"#{pr} is not a pull request of {repo}")
    if pull.get("state") != "open":
        raise Refusal(f"pull request #{pr} is {pull.get('state')}, not open")
    base = pull.get("base") or {}
    if (base.get("repo") or {}).get("full_name") != repo:
        raise Refusal(f"pull request #{pr} does not target {repo}")
    head = str((pull.get("head") or {}).get("sha", "")).lower()
    if head != sha:
        raise Refusal(
            f"pull request #{pr}'s head is {head}, the approval names {sha}: review the new "
            f"head and approve it with `{COMMAND} {head}`"
        )
    base_sha = str(base.get("sha", ""))
    if not FULL_SHA.match(base_sha):
        raise Refusal(f"pull request #{pr} has no base commit ({base_sha!r})")
    return Approval(pr=pr, sha=sha, base_sha=base_sha.lower(), approver=actor)


def api_getter(api_url: str, token: str | None, timeout: float = 30.0) -> GetJson:
    """A GetJson over HTTPS for the REST API at `api_url` (GITHUB_API_URL), with `token`."""

    def get_json(path: str) -> dict | None:
        req = urllib.request.Request(api_url.rstrip("/") + path)
        req.add_header("Accept", "application/vnd.github+json")
        req.add_header("X-GitHub-Api-Version", "2022-11-28")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as res:
                return json.load(res)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    return get_json


def write_outputs(path: Path | None, outputs: dict[str, str]) -> None:
    """Append KEY=VALUE lines to the step's output file (values are checked, one line)."""
    for k, v in outputs.items():
        print(f"gate_approval: {k}={v}")
    if path is not None:
        with path.open("a") as f:
            f.writelines(f"{k}={v}\n" for k, v in outputs.items())


def main(argv: list[str] | None = None, get_json: GetJson | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--event", type=Path, required=True, help="GITHUB_EVENT_PATH")
    ap.add_argument("--event-name", required=True, help="GITHUB_EVENT_NAME")
    ap.add_argument("--repo", required=True, help="GITHUB_REPOSITORY (owner/name)")
    ap.add_argument("--ref", required=True, help="GITHUB_REF")
    ap.add_argument("--github-output", type=Path, help="append the outputs here")
    ap.add_argument("--api-url", default=os.environ.get("GITHUB_API_URL", "https://api.github.com"))
    args = ap.parse_args(argv)

    event = json.loads(args.event.read_text())
    if get_json is None:
        get_json = api_getter(args.api_url, os.environ.get("GH_TOKEN"))
    try:
        approval = authorize(args.event_name, event, args.repo, args.ref, get_json)
    except Refusal as exc:
        print(f"::error::GPU gate refused: {exc}")
        write_outputs(args.github_output, {"approved": "false"})
        return 1
    if approval is None:
        print("gate_approval: not a gate command")
        write_outputs(args.github_output, {"approved": "false"})
        return 0
    write_outputs(args.github_output, approval.outputs())
    return 0


if __name__ == "__main__":
    sys.exit(main())
