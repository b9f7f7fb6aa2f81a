"""scripts/bootstrap.sh on the hosts a user may have, simulated on the CPU.

A GPU host is simulated with ATTNBENCH_GPU_HOST=1 and stand-in packages (a `torch` that
says it is a CUDA build, `triton`, `numpy`, each with its dist-info) placed where a venv, a
conda env or the system's user site would hold them. The script runs in a scratch copy of
the repository with ATTNBENCH_SKIP_INSTALL=1, so it stops once .venv and torch are set.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOST_VERSIONS = {"torch": "2.11.0+cu130", "triton": "3.6.0", "numpy": "2.1.0"}


def _fake_packages(site: Path, cuda: str | None = "13.0") -> None:
    """Importable stand-ins for torch/triton/numpy, with metadata pip can read."""
    site.mkdir(parents=True, exist_ok=True)
    for name, version in HOST_VERSIONS.items():
        pkg = site / name
        pkg.mkdir(exist_ok=True)
        body = f"__version__ = {version!r}\n"
        if name == "torch":
            body += "from . import version\n"
            (pkg / "version.py").write_text(f"cuda = {cuda!r}\n")
        (pkg / "__init__.py").write_text(body)
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")


def _site_of(prefix: Path) -> Path:
    return Path(sysconfig.get_path("purelib", vars={"base": str(prefix)}))


def _make_venv(prefix: Path) -> Path:
    venv.EnvBuilder(with_pip=False).create(prefix)
    return prefix / "bin" / "python"


@pytest.fixture
def repo(tmp_path):
    """A scratch copy of what bootstrap.sh needs from the repository."""
    work = tmp_path / "repo"
    for rel in ("scripts/bootstrap.sh", "scripts/host.sh", "tools/asv_host_site.py"):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, work / rel)
    return work


def _base_python() -> str:
    """The interpreter without any venv or torch: stands for the system's python3."""
    return str(Path(sys._base_executable).resolve())


def _run(repo: Path, env_extra: dict, path_first: Path | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "CONDA"))}
    env.pop("PYTHON", None)
    # The first python3 on PATH: the caller's pick, else a directory holding only the base
    # interpreter (no torch), like a fresh login shell.
    plain = repo.parent / "plainbin"
    plain.mkdir(exist_ok=True)
    for name in ("python3", "python"):
        link = plain / name
        if not link.exists():
            link.symlink_to(_base_python())
    first = [str(path_first)] if path_first else []
    env["PATH"] = os.pathsep.join([*first, str(plain), env["PATH"]])
    env.update(ATTNBENCH_SKIP_INSTALL="1", **env_extra)
    return subprocess.run(
        ["bash", str(repo / "scripts/bootstrap.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _venv_torch(repo: Path) -> tuple[str, str]:
    out = subprocess.run(
        [
            str(repo / ".venv/bin/python"),
            "-c",
            "import importlib.metadata as m, torch; "
            "print(torch.__file__); print(m.version('torch'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0], out[1]


def _assert_reuses(repo: Path, site: Path, res) -> None:
    assert res.returncode == 0, res.stdout + res.stderr
    path, version = _venv_torch(repo)
    assert Path(path).resolve().is_relative_to(site.resolve())
    assert version == HOST_VERSIONS["torch"]
    constraints = (repo / ".venv/host-constraints.txt").read_text()
    assert f"torch=={HOST_VERSIONS['torch']}" in constraints
    assert "triton==3.6.0" in constraints
    assert "installing torch" not in res.stdout
    # pip sees the host's torch as installed: the project's `torch>=2.11` adds nothing.
    dry = subprocess.run(
        [str(repo / ".venv/bin/python"), "-m", "pip", "install", "--dry-run", "--no-index"]
        + ["-c", str(repo / ".venv/host-constraints.txt"), "torch>=2.11", "triton"],
        capture_output=True,
        text=True,
    )
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "Would install" not in dry.stdout


def test_gpu_host_torch_in_a_venv(repo, tmp_path):
    host_py = _make_venv(tmp_path / "hostvenv")
    site = _site_of(tmp_path / "hostvenv")
    _fake_packages(site)
    res = _run(repo, {"ATTNBENCH_GPU_HOST": "1"}, path_first=host_py.parent)
    _assert_reuses(repo, site, res)
    # Idempotent: a second call keeps the .venv it made.
    again = _run(repo, {"ATTNBENCH_GPU_HOST": "1"}, path_first=host_py.parent)
    assert again.returncode == 0 and "reuses it" not in again.stdout


def test_gpu_host_torch_in_a_conda_env(repo, tmp_path):
    prefix = tmp_path / "conda-env"
    _make_venv(prefix)
    (prefix / "conda-meta").mkdir()
    site = _site_of(prefix)
    _fake_packages(site)
    # python3 on PATH is the plain one; only CONDA_PREFIX leads to torch.
    res = _run(repo, {"ATTNBENCH_GPU_HOST": "1", "CONDA_PREFIX": str(prefix)})
    _assert_reuses(repo, site, res)


def test_gpu_host_torch_in_the_system_site(repo, tmp_path):
    userbase = tmp_path / "userbase"
    site = Path(sysconfig.get_path("purelib", f"{os.name}_user", vars={"userbase": str(userbase)}))
    _fake_packages(site)
    res = _run(repo, {"ATTNBENCH_GPU_HOST": "1", "PYTHONUSERBASE": str(userbase)})
    _assert_reuses(repo, site, res)


def test_gpu_host_without_cuda_torch_stops_with_a_clear_error(repo, tmp_path):
    host_py = _make_venv(tmp_path / "cpuvenv")
    _fake_packages(_site_of(tmp_path / "cpuvenv"), cuda=None)
    res = _run(repo, {"ATTNBENCH_GPU_HOST": "1"}, path_first=host_py.parent)
    assert res.returncode == 1
    assert "no interpreter here imports a" in res.stderr and "CUDA build of torch" in res.stderr
    assert "download.pytorch.org/whl/cu" in res.stderr
    assert not (repo / ".venv").exists()


def _stub_venv(repo: Path, pip_config: str) -> Path:
    """A .venv whose python has no torch and logs every pip install it is asked for."""
    log = repo / "pip.log"
    stub = repo / ".venv/bin/python"
    stub.parent.mkdir(parents=True)
    stub.write_text(
        "#!/usr/bin/env bash\n"
        # pip writes its listing line by line: FAKE_PIP_CONFIG_MORE comes after a pause, as
        # the rest of a listing does after a reader that stopped early.
        'if [ "$1 $2 $3" = "-m pip config" ]; then printf %s "$FAKE_PIP_CONFIG"\n'
        '  if [ -n "${FAKE_PIP_CONFIG_MORE:-}" ]; then\n'
        '    sleep 0.5; printf %s "$FAKE_PIP_CONFIG_MORE"\n'
        "  fi\n"
        "  exit 0\n"
        "fi\n"
        'if [ "$1 $2 $3" = "-m pip install" ]; then echo "${@:4}" >>' + str(log) + "; exit 0; fi\n"
        "exit 1\n"
    )
    stub.chmod(0o755)
    return log


@pytest.mark.parametrize(
    "config, from_cpu_index",
    [
        ("", True),
        ("global.find-links='/opt/wheels'\n", False),
        (":env:.index-url='https://mirror.example/simple'\n", False),
    ],
)
def test_cpu_host_gets_the_cpu_build(repo, config, from_cpu_index):
    log = _stub_venv(repo, config)
    res = _run(repo, {"ATTNBENCH_GPU_HOST": "0", "FAKE_PIP_CONFIG": config})
    assert res.returncode == 0, res.stdout + res.stderr
    calls = log.read_text().splitlines()
    torch_call = next(c for c in calls if "torch==2.13.0" in c)
    assert ("--index-url https://download.pytorch.org/whl/cpu" in torch_call) == from_cpu_index
    assert any("triton==3.6.0" in c for c in calls)


def test_a_source_listed_before_more_lines_is_seen(repo):
    """pip lists the environment's settings first and writes line by line: the check must
    read the whole listing (a `grep -q` in a pipe stops at its first match, the rest of the
    listing then meets a broken pipe, and under pipefail that read as "no source")."""
    log = _stub_venv(repo, "")
    env = {
        "ATTNBENCH_GPU_HOST": "0",
        "FAKE_PIP_CONFIG": ":env:.find-links='/opt/wheels'\n",
        "FAKE_PIP_CONFIG_MORE": "global.timeout='60'\n",
    }
    res = _run(repo, env)
    assert res.returncode == 0, res.stdout + res.stderr
    torch_call = next(c for c in log.read_text().splitlines() if "torch==2.13.0" in c)
    assert "--index-url" not in torch_call, torch_call


# ------------------------------------------------------------ scripts/test.sh's pytest passes
STUB_PYTHON = """#!/usr/bin/env bash
echo "$* | CVD=${CUDA_VISIBLE_DEVICES-unset} REQ=${ATTNBENCH_REQUIRE_GPU-unset}" >> "$CALLS"
case "$*" in
    *"-m gpu"*) exit "${GPU_PASS_RC:-0}" ;;
    *"-m not gpu"*) exit "${CPU_PASS_RC:-0}" ;;
esac
"""


def _test_sh(tmp_path, gpu_host, gpu_pass_rc=0, cpu_pass_rc=0):
    """scripts/test.sh in a scratch copy whose set-up steps and .venv python are stubs that
    record each call: (exit code, the pytest calls with their GPU-related environment)."""
    work = tmp_path / "repo"
    (work / "scripts").mkdir(parents=True)
    for rel in ("scripts/test.sh", "scripts/host.sh"):
        shutil.copy(ROOT / rel, work / rel)
    for rel in ("scripts/bootstrap.sh", "scripts/ci_tools.sh"):
        (work / rel).write_text("true\n")
    py = work / ".venv/bin/python"
    py.parent.mkdir(parents=True)
    py.write_text(STUB_PYTHON)
    py.chmod(0o755)
    calls = tmp_path / "calls"
    env = dict(os.environ, CALLS=str(calls), ATTNBENCH_GPU_HOST=gpu_host,
               GPU_PASS_RC=str(gpu_pass_rc), CPU_PASS_RC=str(cpu_pass_rc))  # fmt: skip
    for var in (
        "CUDA_VISIBLE_DEVICES",
        "ATTNBENCH_REQUIRE_GPU",
        "PYTEST_WORKERS",
        "PYTEST_GPU_WORKERS",
    ):
        env.pop(var, None)
    proc = subprocess.run(["bash", str(work / "scripts/test.sh"), "-k", "x"], env=env,
                          capture_output=True, text=True)  # fmt: skip
    pytest_calls = [c for c in calls.read_text().splitlines() if c.startswith("-m pytest")]
    return proc.returncode, pytest_calls


PYTEST_CALL = "-m pytest --dist loadfile --no-loadscope-reorder"


def test_test_sh_runs_one_pass_on_a_cpu_host(tmp_path):
    code, calls = _test_sh(tmp_path, "0")
    assert code == 0
    assert calls == [f"{PYTEST_CALL} -n auto -k x | CVD=unset REQ=unset"]


def test_test_sh_hides_the_gpu_then_requires_it_on_a_gpu_host(tmp_path):
    code, calls = _test_sh(tmp_path, "1")
    assert code == 0
    assert calls == [
        f"{PYTEST_CALL} -n auto -m not gpu -k x | CVD= REQ=unset",
        f"{PYTEST_CALL} -n 4 -m gpu -k x | CVD=unset REQ=1",
    ]


@pytest.mark.parametrize(
    ("cpu_rc", "gpu_rc", "expected"), [(0, 5, 0), (5, 0, 0), (0, 1, 1), (1, 0, 1), (2, 1, 2)]
)
def test_test_sh_pass_exit_codes(tmp_path, cpu_rc, gpu_rc, expected):
    """Both passes run whatever the first one's result; the command fails with the first
    failing pass's code, and a pass that selects no test (pytest's exit 5) is no failure."""
    code, calls = _test_sh(tmp_path, "1", gpu_pass_rc=gpu_rc, cpu_pass_rc=cpu_rc)
    assert code == expected and len(calls) == 2


def test_gpu_pass_without_a_visible_gpu_is_an_error(tmp_path):
    env = dict(os.environ, ATTNBENCH_REQUIRE_GPU="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                           "no:cacheprovider", str(ROOT / "tests/test_package.py")], cwd=ROOT,
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "ATTNBENCH_REQUIRE_GPU=1" in proc.stderr


# ------------------------------------------------------------ scripts/main.sh's steps
MAIN_STUB_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$1 $2" in
    "-c "*) printf 'smoke\\nVIEWSEL\\n' ;;
    "tools/asv_host_site.py --print") echo /host/site ;;
    "-m asv")
        # asv run: a result file for the machine it names, as asv writes one per commit
        if [ "$3" = run ]; then
            m=$(sed -n 's/.*--machine \\([^ ]*\\).*/\\1/p' <<<"$*")
            mkdir -p "results/$m" && touch "results/$m/0123abcd-env.json"
        fi ;;
esac
exit 0
"""


def _main_sh(tmp_path, **env_vars):
    """scripts/main.sh in a scratch git repository whose set-up, npm and .venv python are
    stubs that record each call: (exit code, the recorded calls, stderr)."""
    work = tmp_path / "repo"
    (work / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts/main.sh", work / "scripts/main.sh")
    (work / "scripts/bootstrap.sh").write_text('echo "bootstrap" >> "$CALLS"\n')
    py = work / ".venv/bin/python"
    py.parent.mkdir(parents=True)
    py.write_text(MAIN_STUB_PYTHON)
    py.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "npm").write_text('#!/bin/sh\necho "npm $*" >> "$CALLS"\nexit 1\n')
    (bin_dir / "npm").chmod(0o755)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t",
                                                 "commit", "-qm", "c1"]):  # fmt: skip
        subprocess.run(["git", *args], cwd=work, check=True, capture_output=True)
    calls = tmp_path / "calls"
    calls.write_text("")
    env = dict(os.environ, CALLS=str(calls), PATH=f"{bin_dir}:{os.environ['PATH']}",
               ATTNBENCH_MACHINE="m", **env_vars)  # fmt: skip
    for var in ("ATTNBENCH_COMMITS", "ATTNBENCH_VIEW", "ATTNBENCH_WHEELHOUSE", "ATTNBENCH_BENCH"):
        if var not in env_vars:
            env.pop(var, None)
    proc = subprocess.run(["bash", str(work / "scripts/main.sh")], cwd=work, env=env,
                          capture_output=True, text=True)  # fmt: skip
    return proc.returncode, calls.read_text().splitlines(), proc.stderr


def test_main_sh_runs_the_commits_then_the_view(tmp_path):
    code, calls, err = _main_sh(tmp_path)
    assert code == 0, err
    runs = [c for c in calls if c.startswith("-m asv run")]
    assert runs[0].startswith("-m asv run HASHFILE:.asv/commits.txt --machine m ")
    assert runs[1].startswith("-m asv run HEAD^! --machine m-view -b VIEWSEL ")
    reports = [c for c in calls if c.startswith("tools/report.py")]
    assert [r.split("--machine ")[1].split()[0] for r in reports] == ["m", "m-view"]


def test_main_sh_runs_one_shard_and_keeps_the_other_shards_results(tmp_path):
    """ATTNBENCH_BENCH: step 3 selects those benchmarks, and skips per benchmark (asv's
    --skip-existing), not per commit, so a second shard of a measured commit still runs."""
    code, calls, err = _main_sh(tmp_path, ATTNBENCH_BENCH="^kda\\.", ATTNBENCH_VIEW="0")
    assert code == 0, err
    runs = [c for c in calls if c.startswith("-m asv run")]
    assert len(runs) == 1
    assert "-b ^kda\\. --skip-existing " in runs[0]
    assert "--skip-existing-commits" not in runs[0]
    code, calls, err = _main_sh(tmp_path / "b", ATTNBENCH_VIEW="0")
    runs = [c for c in calls if c.startswith("-m asv run")]
    assert code == 0 and "--skip-existing-commits" in runs[0] and " -b " not in runs[0]


def test_main_sh_with_no_commits_runs_only_the_view(tmp_path):
    """ATTNBENCH_COMMITS=0: no run of the default suite and no report of it (the machine
    has no results), the view and its report as usual."""
    code, calls, err = _main_sh(tmp_path, ATTNBENCH_COMMITS="0")
    assert code == 0, err
    runs = [c for c in calls if c.startswith("-m asv run")]
    assert len(runs) == 1 and runs[0].startswith("-m asv run HEAD^! --machine m-view")
    reports = [c for c in calls if c.startswith("tools/report.py")]
    assert len(reports) == 1 and "--machine m-view" in reports[0]
    assert any(c.startswith("tools/site_extras.py html --report report") for c in calls)


@pytest.mark.parametrize(
    ("env_vars", "message"),
    [({"ATTNBENCH_COMMITS": "x"}, "whole number"),
     ({"ATTNBENCH_COMMITS": "-1"}, "whole number"),
     ({"ATTNBENCH_COMMITS": "0", "ATTNBENCH_VIEW": "0"}, "nothing to run")],
)  # fmt: skip
def test_main_sh_refuses_bad_settings_before_set_up(tmp_path, env_vars, message):
    code, calls, err = _main_sh(tmp_path, **env_vars)
    assert code == 2 and message in err
    assert "bootstrap" not in calls
