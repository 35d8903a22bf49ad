"""looptrace's benchmarks: overhead, throughput and resilience, each reported as a ratio measured in one run.

Run them with ``python -m benchmarks`` (``--quick`` for a smoke run, ``--only 1 3`` for a subset). Every benchmark
interleaves its variants (A B A B ...) and reports medians, because the machines these run on are noisy: noise then
hits every variant alike and the ratio survives it even when the absolute times do not. Nothing here asserts on time;
the goals are printed next to the figures. See benchmarks/README.md for what each one measures and a recorded run.
"""
