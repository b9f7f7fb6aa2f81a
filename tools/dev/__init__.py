"""Tuning and maintenance tools (tools/dev/README.md): run as `python -m tools.dev.NAME`."""
