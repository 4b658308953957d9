"""``accelerate launch -m yarnlib.finetune …`` (or ``torchrun -m yarnlib.finetune …``)."""

import sys
import warnings

from yarnlib.cli import show_warning
from yarnlib.finetune.cli import parse_args, run


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = show_warning
    args = parse_args(argv)
    try:
        return run(args)
    except ValueError as error:  # bad input, as `yarnlib finetune` reports it
        print(f"yarnlib finetune: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
