"""``python -m benchmarks.small_consortium``: the small consortium's grid
(:mod:`benchmarks.robustness.small_consortium`), under the command that P5-P7 of
benchmarks/preregistered.yaml registered before the benchmarks moved into folders."""

from benchmarks.robustness.small_consortium import main

if __name__ == "__main__":
    main()
