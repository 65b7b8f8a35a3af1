"""Robustness: rules and filters under attack, and what they cost (README.md)."""
