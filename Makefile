# Set-up and test entry points. `make demo` and `make test` work on a fresh machine (Python 3.11 + pip + PyPI).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.xlgen-test-installed
DEMO_STAMP := $(VENV)/.xlgen-demo-installed

.PHONY: install demo test test-fast lint format bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Tests: xlgen (editable) with the test, parity, tpu (libtpu: `xlgen plan` tests), tensorboard (the printed
# TensorBoard command is run by a test) and tf (tests/test_tf_import.py writes the original TF checkpoints and runs
# HF's TF loaders on them) extras, pinned by constraints.txt.
$(STAMP): $(PY) setup.py constraints.txt Makefile
	$(PY) -m pip install -q -c constraints.txt -e ".[test,parity,tpu,tensorboard,tf,deploy]"
	touch $(STAMP)

# Demo: only what it runs: xlgen itself (jax CPU, matplotlib for the plot) + the TensorBoard server it mentions.
$(DEMO_STAMP): $(PY) setup.py constraints.txt
	$(PY) -m pip install -q -c constraints.txt -e ".[tensorboard]"
	touch $(DEMO_STAMP)

install: $(STAMP)

# Formatting and lint (ruff.toml): `make format` rewrites, `make lint` checks; `make test` runs the check first.
# Dead code: vulture over the library and its users (tests count as users of test helpers). --ignore-names lists
# what is used by name at run time (registry records, config keys read as attributes, dataclass fields written to
# JSON, HF keyword arguments, pytest fixtures and hooks, methods a bench worker calls by name).
VULTURE_USED_BY_NAME := sources_history,_info,_split_generators,VERSION,no_cache,pytestmark,create_mask,schedule_history,num_documents,build_s,computation,tracking,max_nonfinite_steps,pre_tokenizer,Examples,SEG_SEP,return_dict,shift_jvp,register,compile_only,CEGAN,BADGAN,FAMILY,unlabeled_text,domain,digits_dir,peak_flops_per_device,pytest_sessionstart,pytest_runtest_logreport,pytest_terminal_summary,pytest_collection_modifyitems,pytest_unconfigure,p_*,ir_version
lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/vulture xlgen data_pipelines configs tests --min-confidence 60 --ignore-names $(VULTURE_USED_BY_NAME)

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# `--dist loadfile`: a file's tests run on one worker, so a module fixture (the TPU plan compiles of test_plan.py and
# test_pod_comm.py, ...) is built once, not once per worker (with the default `load`, both workers built them).
# `--max-worker-restart=0`: a crashed worker ends the run as a failure naming its test; under `loadfile`, pytest-xdist
# 3.8 can wait forever for a replaced worker (pytest-dev/pytest-xdist#784, #1323).
PYTEST = $(PY) -m pytest -q -n 2 --dist loadfile --max-worker-restart=0
test: $(STAMP) lint
	$(PYTEST) --durations=15 tests

test-fast: $(STAMP)
	$(PYTEST) -m "not slow" tests

# A small Transformer-XL character LM on the embedded tinyshakespeare corpus: a few minutes on 2 CPU cores, loss
# falling, evaluations (bpc) at steps 200/400/600; prints where checkpoints/metrics are and the commands to resume,
# evaluate, plot and load it (each runnable as printed from this directory); ends by writing the plots and printing
# a 200-character sample from the trained model.
demo: $(DEMO_STAMP)
	$(VENV)/bin/xlgen train --config=configs/pretrain/demo.py --workdir=workdirs/demo
	@echo "--- a sample from the model just trained (xlgen generate; same seed, same text) ---"
	$(VENV)/bin/xlgen generate --workdir=workdirs/demo --prompt="ROMEO:" --max_new_tokens=200 --seed=0
	@echo "--- training curves (xlgen plot) ---"
	$(VENV)/bin/xlgen plot --workdir=workdirs/demo

# The standard speed set (docs/performance.md): xlgen vs HF PyTorch, each in its own process, medians of alternated blocks,
# MFU against the measured matmul peak, XLNet-Large compile time. Results in bench_results/*.json.
bench: $(STAMP)
	$(VENV)/bin/xlgen bench --standard --out_dir=bench_results --into=docs/performance.md \
	    $(if $(BEFORE),--before=$(BEFORE),) $(if $(BEFORE_LABEL),--before_label="$(BEFORE_LABEL)",)

clean:
	rm -rf $(VENV) workdirs .pytest_cache
