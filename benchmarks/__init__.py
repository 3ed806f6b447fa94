"""Benchmarks: speed and memory ratios against references measured in the same run.

`python -m benchmarks` (or `make bench`) runs the `main()` of every `benchmarks/bench_*.py`;
`python -m benchmarks forward` runs only `bench_forward.py`. Shared helpers live in
`benchmarks.common`.
"""
