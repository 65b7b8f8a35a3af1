"""The benchmarks, one folder per question: `python -m benchmarks.<folder>.<name>` from the
repository root (benchmarks/README.md).

A regular package, not a namespace one: opacus 1.6.0 installs a top-level `benchmarks`
package of its own into site-packages, which would otherwise be imported instead.
"""
