PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test reproduce check venv bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto

reproduce: $(STAMP)
	$(BIN)/sfxlin reproduce --out datasets

check: $(STAMP)
	$(BIN)/sfxlin check

bench: $(STAMP)
	$(BIN)/sfxlin bench c1
	$(BIN)/sfxlin bench c3
	$(BIN)/sfxlin bench c3 --protocol

clean:
	rm -rf $(VENV) build *.egg-info
