"""Export a run's checkpoint, sharded (FSDP2) or not, as one file in the one-process layout (course-layout model
state dict, optimizer with fp32 masters, step, config, sampler and RNG), loadable on one GPU or the CPU:

    uv run python -m cs336_basics.programs.export runs/default --output runs/default-single.pt

The file loads with cs336_basics.training.restore.load_checkpoint and the course's load_checkpoint; put it in a run
folder as checkpoint.pt (with that run's config.json) to resume there. A one-process `--resume` and
cs336_basics.programs.generate read sharded checkpoints directly, without exporting. A LoRA run's checkpoint (the
adapters alone) is refused: cs336_basics.programs.merge_lora folds them into their base.
"""

from __future__ import annotations

import argparse
import sys

from cs336_basics.errors import run_program, writing
from cs336_basics.files.integrity import save_torch_file
from cs336_basics.files.output_paths import check_output_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("source", help="a run folder (its checkpoint.pt) or a checkpoint file")
    parser.add_argument("--output", required=True, help="the single-file checkpoint to write (atomically)")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    args = parser.parse_args(argv)

    def export() -> int:
        output = check_output_path(args.output, "--output", folder=False, replace=args.overwrite)
        from cs336_basics.training.sharded_checkpoint import export_payload

        payload = export_payload(args.source)  # read first: an error reading names the source, not the output
        with writing(output, f"The checkpoint {args.source} is unchanged."):
            path = save_torch_file(output, payload)
        print(f"wrote {path}")
        return 0

    return run_program(export)


if __name__ == "__main__":
    sys.exit(main())
