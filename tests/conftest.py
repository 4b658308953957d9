import os
import signal
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt, as in a terminal: a suite started in the background by a
    shell without job control inherits SIGINT ignored, and Python then installs no handler."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


# The files that take a minute or more (engines, launchers, fresh interpreters), first: with
# `-n 2 --dist loadfile` a worker takes the next file when it is free, so the longest ones
# starting last left one core idle for minutes at the end of a run.
LONGEST_FIRST = (
    "test_vllm_parity.py", "test_gpu_check.py", "test_plan_measure.py", "test_finetune_fsdp.py",
    "test_grpo_trl.py", "test_config_lock.py", "test_finetune_distributed.py", "test_wheel.py",
)  # fmt: skip


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest in order
