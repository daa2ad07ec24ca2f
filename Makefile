PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test reproduce venv bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q

EXPERIMENTS := c1 c2 c2_threshold c3

reproduce: $(STAMP)
	for exp in $(EXPERIMENTS); do $(BIN)/sfxlin run $$exp --profile paper --out datasets || exit 1; done
	$(BIN)/sfxlin report --results datasets --out datasets/report.html

bench: $(STAMP)
	$(BIN)/sfxlin bench c1
	$(BIN)/sfxlin bench c3

clean:
	rm -rf $(VENV) build *.egg-info
