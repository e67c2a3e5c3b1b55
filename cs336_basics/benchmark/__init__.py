"""Performance benchmarks: the isolated configuration sweep (`sweep`, `worker`) and profiler analyses."""
