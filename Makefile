# The two quick-start commands of the README: `make demo` and `make test`.
# PYTHON=python3.13 make test: the same commands on another interpreter (.venv is remade for it)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP_TAG := $(subst /,_,$(PYTHON))
STAMP := $(VENV)/.installed-$(STAMP_TAG)
export PYTHON VENV STAMP_TAG
DEMO_DB := out/heat.d

.PHONY: demo test lint typecheck unit core bench clean

$(STAMP): pyproject.toml setup.py src/callpath/measure/python/_callpath_walk.c \
		src/callpath/measure/python/_callpath_native.c scripts/setup-venv.sh \
		src/callpath/structure/_callpath_decode.c src/callpath/structure/_x86_table.h \
		src/callpath/measure/_callpath_unwind.c src/callpath/measure/gpu/_callpath_records.c
	bash scripts/setup-venv.sh

## demo: set up, then profile the bundled example program and print its report
demo: $(STAMP)
	mkdir -p out
	gcc -O2 -g -o out/heat examples/heat.c
	rm -rf out/heat-measurements $(DEMO_DB)
	$(BIN)/callpath profile -m out/heat-measurements -o $(DEMO_DB) -- out/heat
	@echo
	@echo "Bottom-up view:     $(BIN)/callpath report $(DEMO_DB) -v bottom-up -d 3"
	@echo "Flat view:          $(BIN)/callpath report $(DEMO_DB) -v flat -t 2"
	@echo "Hot call path:      $(BIN)/callpath report $(DEMO_DB) --hot-path"
	@echo "Viewer (browser):   $(BIN)/callpath view $(DEMO_DB)   (on a cluster: --no-browser, then an SSH tunnel; docs/view.md)"

## test: set up, then lint, type-check and run the whole test suite
test: $(STAMP) lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

## core: the tests of measurement, structure, attribution and the database formats (CI runs them
## on every interpreter of its matrix; the whole suite runs on the newest)
core: $(STAMP)
	$(BIN)/pytest -m core $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/read_db.py

clean:
	rm -rf .venv .venv-* out .mypy_cache .ruff_cache .pytest_cache
