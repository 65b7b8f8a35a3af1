"""docs/results.md's generated tables (and docs/operations.md's fault table), one module
per kind of evidence, each built from the committed records under benchmarks/results/.

:mod:`benchmarks.evidence.report` puts them in the documents and checks them (``--check``);
:mod:`benchmarks.evidence.claims` reads the same records and paired tables for its verdicts.
"""
