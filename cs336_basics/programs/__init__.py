"""The programs: each module here is one command (a `main`), over the library in the other folders. The three root
scripts (train_h100.py, verify_fp8_compilation.py, optimize_performance.py) are thin doors into train, verify_fp8 and
the benchmark sweep; the others run as `python -m cs336_basics.programs.<name>`; the benchmarks as
`python -m cs336_basics.benchmark.<name>`."""
