# The two commands: `make demo` and `make test`. Both set up .venv from scratch if needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned (a CPU build from local disk); then the project with its test extras.
$(STAMP): pyproject.toml $(PY)
	$(PIP) install --quiet "torch==2.13.0"
	$(PIP) install --quiet -e ".[dev,torch,tf,text,images,demo]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/feedline demo

test: $(STAMP)
	$(PY) -m pytest tests feedline -q

lint: $(STAMP)
	$(VENV)/bin/ruff check feedline tests bench

bench: $(STAMP)
	$(PY) bench/read_write.py

clean:
	rm -rf $(VENV) demo-output .pytest_cache
