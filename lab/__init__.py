"""The lab: tools that each answer one study's question (where a step's host time goes, what is alive at the memory
peak, what the checkpoint checksums cost, the optimizer step's alternatives, the BPE trainer's speed, loss parity
between precisions), and one that runs a device session's GPU jobs side by side (lanes). They are not part of the
package and do not ship in its wheel; they import only the package's public names, so a change inside the package
that breaks one fails its test (tests/test_lab.py and the tool's own).

Run them from the repository root: `python -m lab.<name> --help`. benchmarks/results/INDEX.md lists the studies they
served.
"""
