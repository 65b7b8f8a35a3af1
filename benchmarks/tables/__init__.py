"""docs/results.md's generated tables (and docs/operations.md's fault table), one module
per kind of evidence, each built from the committed records under benchmarks/results/.

:mod:`benchmarks.report` puts them in the documents and checks them (``--check``);
:mod:`benchmarks.claims` reads the same records and paired tables for its verdicts.
"""
