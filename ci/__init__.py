"""Plain scripts the GitHub workflows call (run as `python -m ci.<name>` from the repo root)."""
