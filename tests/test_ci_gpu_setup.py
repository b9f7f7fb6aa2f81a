"""ci/gpu_setup.py: persistent caches outside the workspace and the asv machine entry."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci import gpu_setup  # noqa: E402

CONF = """{
    // asv allows comments in its configuration
    "version": 1,
    "project": "demo",
    "repo": ".",
    "env_dir": ".asv/env",
}
"""


def test_caches_linked_and_job_env_written(tmp_path, monkeypatch):
    work, cache, home = tmp_path / "work", tmp_path / "cache", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "asv.conf.json").write_text(CONF)
    (home / ".asv-machine.json").write_text(
        json.dumps({"other": {"machine": "other"}, "version": 1})
    )
    (cache / "wheelhouse").mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("ATTNBENCH_WHEELHOUSE", raising=False)
    github_env = tmp_path / "github_env"
    args = ["--machine", "h200", "--purpose", "pr", "--cache-root", str(cache),
            "--github-env", str(github_env)]  # fmt: skip
    assert gpu_setup.main(args) == 0

    env_dir = work / ".asv" / "env"
    assert env_dir.is_symlink() and env_dir.resolve() == (cache / "pr" / "asv-env").resolve()
    lines = dict(line.split("=", 1) for line in github_env.read_text().splitlines())
    host_site = lines.pop("ATTNBENCH_HOST_SITE")
    assert lines == {
        "TRITON_CACHE_DIR": str(cache / "pr" / "triton"),
        "ATTNBENCH_SMOKE": "0",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(cache / "wheelhouse"),
    }
    import torch

    assert str(Path(torch.__file__).parents[1]) in host_site.split(os.pathsep)
    assert (cache / "pr" / "triton").is_dir()
    entry = json.loads((home / ".asv-machine.json").read_text())["h200"]
    assert entry["machine"] == "h200" and entry["torch"] and entry["triton"] and entry["arch"]
    assert "other" in json.loads((home / ".asv-machine.json").read_text())  # kept

    # a second job relinks; a purpose switch points the link at the other cache
    args[3] = "main"
    assert gpu_setup.main([*args, "--no-machine"]) == 0
    assert env_dir.resolve() == (cache / "main" / "asv-env").resolve()


def test_real_env_dir_is_left_alone(tmp_path, capsys):
    target = tmp_path / "env"
    target.mkdir()
    (target / "keep").write_text("x")
    gpu_setup.link_env_dir(target, tmp_path / "cache")
    assert not target.is_symlink() and (target / "keep").exists()
    assert "leaving it" in capsys.readouterr().out


def test_no_wheelhouse_no_pip_settings(tmp_path):
    env = gpu_setup.job_env(tmp_path, "main", tmp_path / "absent")
    assert "PIP_NO_INDEX" not in env and "PIP_FIND_LINKS" not in env
