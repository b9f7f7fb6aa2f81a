"""Scripts of the project: the product ones here, tuning and maintenance tools in `tools.dev`.

A package so that the tools run as modules from the repository root
(`python -m tools.dev.NAME`) and import the helpers they share plainly.
"""
