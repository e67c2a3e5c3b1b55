"""Train a CS336-style transformer language model: BF16 + torch.compile on a GPU, a small float32 model on CPU.

uv run train_h100.py                      # the default: Python-stdlib corpus, preset chosen by device
uv run train_h100.py --help               # every flag; values resolve CLI > --config file > preset > default
uv run train_h100.py --resume --out_dir runs/default   # continue a run exactly where it stopped

Exit codes: 0 done, 1 training diverged or an output could not be written (the message says what is intact), 2 a
setting or input that cannot be used, 130 / 143 stopped by SIGINT / SIGTERM (a checkpoint is saved at the step boundary
first).
"""

from __future__ import annotations

from cs336_basics.cli import config_from_args, config_parser
from cs336_basics.errors import alike_on_every_rank, run_program
from cs336_basics.measure.results import check_results_file
from cs336_basics.parallel.world import exit_process
from cs336_basics.run import run_training
from cs336_basics.training.checkpoint import checkpoint_file
from cs336_basics.training.signals import terminate_raises


def _how_to_continue(config) -> str:
    if config is not None and checkpoint_file(config.train.out_dir).is_file():
        return f"Continue with: --resume --out_dir {config.train.out_dir}"
    return "No checkpoint was saved; start the run again (--overwrite if its folder was already created)."


def main(argv: list[str] | None = None) -> int:
    parser = config_parser(__doc__)
    parser.add_argument("--results_json", help="also append this run's record to a benchmark results file")
    args = parser.parse_args(argv)
    config = None

    def train() -> int:
        nonlocal config
        with terminate_raises():
            with alike_on_every_rank():  # every rank has the same flags
                if args.results_json is not None:
                    check_results_file(args.results_json, "--results_json")
                config = config_from_args(args)
            run_training(config, results_json=args.results_json)
        return 0

    return run_program(train, after_interrupt=lambda: _how_to_continue(config))


if __name__ == "__main__":
    exit_process(main())
