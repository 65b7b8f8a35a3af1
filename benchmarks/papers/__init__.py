"""The papers' own experiments, each measured as its paper measures it (README.md)."""
