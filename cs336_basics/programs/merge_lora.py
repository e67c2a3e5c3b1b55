"""Fold a LoRA run's adapters into its base: a plain model, saved as a course-layout state dict.

    uv run python -m cs336_basics.programs.merge_lora runs/lora --output merged.pt [--base MOVED_BASE]
    uv run python train_h100.py --init_from merged.pt ...      # or load it into a plain TransformerLM

W' = W + (alpha / r) B A for every layer with adapters, computed in float32 and stored in the base weights' dtype.
"""

from __future__ import annotations

import argparse
import sys

from cs336_basics.errors import run_program, writing
from cs336_basics.files.integrity import save_torch_file
from cs336_basics.files.output_paths import check_output_path
from cs336_basics.lora.merge import merged_state_dict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cs336_basics.programs.merge_lora", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    parser.add_argument("run", help="a LoRA run folder, or its checkpoint.pt")
    parser.add_argument("--output", required=True, help="the state dict file to write (.pt)")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument(
        "--base",
        help="where the run's base is now, if it moved since the run started (its weights must be the same)",
    )
    args = parser.parse_args(argv)

    def merge() -> int:
        output = check_output_path(args.output, "--output", folder=False, replace=args.overwrite)
        state = merged_state_dict(args.run, args.base)
        with writing(output, f"The run {args.run} is unchanged."):
            save_torch_file(output, state)
        print(f"wrote {output}: {len(state)} tensors, {sum(t.numel() for t in state.values()):,} parameters")
        return 0

    return run_program(merge)


if __name__ == "__main__":
    sys.exit(main())
