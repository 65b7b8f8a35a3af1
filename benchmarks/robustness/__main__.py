"""``python -m benchmarks.robustness``: the robustness matrix (:mod:`.matrix`), under the
command the pre-registration registered before the benchmarks moved into folders."""

from benchmarks.robustness.matrix import main

main()
