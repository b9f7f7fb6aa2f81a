"""ci/gpu_setup.py: persistent caches outside the workspace and the asv machine entry."""

import json
import os
import sys
from pathlib import Path

import pytest

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
            "--github-env", str(github_env), "--no-cuda-check"]  # fmt: skip
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


def test_cuda_check_passes_a_working_probe_and_names_the_device():
    probe = "print('Fake GPU')"
    assert gpu_setup.check_cuda(probe=probe) == "Fake GPU"


@pytest.mark.parametrize(
    "probe,words",
    [
        ("raise SystemExit('torch.cuda.is_available() is False')", "is_available() is False"),
        ("import os; os.abort()", "failed (exit -6)"),  # a crash of the probe's process
        ("raise RuntimeError('CUDA error: no kernel image')", "no kernel image"),
    ],
)
def test_cuda_check_refuses_a_failing_probe(probe, words):
    with pytest.raises(gpu_setup.CudaUnusable, match="tiny CUDA operation") as info:
        gpu_setup.check_cuda(probe=probe)
    assert words in str(info.value)


def test_cuda_check_refuses_a_hang():
    with pytest.raises(gpu_setup.CudaUnusable, match="did not finish in 0.5 s"):
        gpu_setup.check_cuda(probe="import time; time.sleep(30)", timeout=0.5)


def test_the_real_probe_stops_the_job_without_cuda(tmp_path, capsys):
    """On this CPU host the real probe fails: main stops before touching anything."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a working GPU")
    github_env = tmp_path / "github_env"
    args = ["--machine", "h200", "--purpose", "pr", "--cache-root", str(tmp_path / "c"),
            "--github-env", str(github_env)]  # fmt: skip
    assert gpu_setup.main(args) == 1
    out = capsys.readouterr()
    assert "::error::gpu_setup: CUDA does not work on this runner" in out.out
    assert "is_available() is False" in out.err
    assert not github_env.exists() and not (tmp_path / "c").exists()
