"""The package imports, and the test setup chose the right execution mode."""

import os

import torch

import kernels


def test_package_exports_version():
    assert isinstance(kernels.__version__, str) and kernels.__version__


def test_interpreter_mode_matches_hardware():
    if torch.cuda.is_available():
        assert os.environ.get("TRITON_INTERPRET", "0") != "1"
    else:
        assert os.environ.get("TRITON_INTERPRET") == "1"
