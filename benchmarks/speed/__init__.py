"""Speed and scale: time and memory against a floor or a reference (README.md)."""
