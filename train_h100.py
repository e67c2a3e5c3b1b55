"""Train a CS336-style transformer language model: BF16 + torch.compile on a GPU, a small float32 model on CPU.

uv run train_h100.py                      # the default: Python-stdlib corpus, preset chosen by device
uv run train_h100.py --help               # every flag; values resolve CLI > --config file > preset > default
uv run train_h100.py --resume --out_dir runs/default   # continue a run exactly where it stopped
"""

from __future__ import annotations

import sys

from cs336_basics.errors import ConfigError, report_error
from cs336_basics.runtime import config_from_args, config_parser
from cs336_basics.training.run import run_training
from cs336_basics.training.trainer import TrainingDiverged


def main(argv: list[str] | None = None) -> int:
    parser = config_parser(__doc__)
    parser.add_argument("--results_json", help="also append this run's record to a benchmark results file")
    args = parser.parse_args(argv)
    try:
        run_training(config_from_args(args), results_json=args.results_json)
    except ConfigError as exc:
        return report_error(exc)
    except TrainingDiverged as exc:
        return report_error(exc, exit_code=1)
    except KeyboardInterrupt as exc:
        print(f"\n{exc or 'interrupted'}. Continue with: --resume --out_dir <the same folder>", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
