"""Operators' scripts that drive the container stack from outside (smoke, faults, load,
health probes). Run from the repository root as modules (``python -m
scripts.container_faults``) or, those that import no sibling, as files; import-linter
keeps them above the product (they may use it, nothing in it uses them)."""
