"""The evidence machinery: the report, the claims ledger, the pre-registration (README.md)."""
