import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def vllm_results(tmp_path_factory):
    """The findings of test_vllm_parity.py's worker, which runs test_vllm_negative.py's controls
    too: one process pays vLLM's import and first engine start for both files."""
    pytest.importorskip("vllm")
    from vllm_worker import run_worker

    out = tmp_path_factory.mktemp("vllm")
    # an installed yarnlib entry point must not load before step 1
    return run_worker(str(Path(__file__).parent / "test_vllm_parity.py"), out, VLLM_PLUGINS="")
