"""The programs: each module here is one command (a `main`), over the library in the other folders. The three root
scripts (train_h100.py, verify_fp8_compilation.py, optimize_performance.py) are thin doors into the run (run.py),
verify_fp8 and the sweep (sweep/); the others run as `python -m cs336_basics.programs.<name>`."""
