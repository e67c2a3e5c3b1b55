"""Why FP8 is as fast as it is, for verify_fp8_compilation.py and the sweep: amdahl/ (where a step's time goes, and
what FP8's GEMM speedup can give it), doctor.py (the FP8 doctor's findings), measurement.py (training as a
measurement: a few steps in a throwaway folder)."""
