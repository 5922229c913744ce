# The two quick-start commands of the README: `make demo` and `make test`.
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DB := out/example.d

.PHONY: demo test lint typecheck unit bench clean

$(STAMP): pyproject.toml scripts/setup-venv.sh
	bash scripts/setup-venv.sh

## demo: set up, build the bundled example database, print its report
demo: $(STAMP)
	$(BIN)/python examples/example_db.py $(DEMO_DB)
	$(BIN)/callpath report $(DEMO_DB) --threshold 1
	@echo
	@echo "Execution contexts: $(BIN)/callpath report $(DEMO_DB) --contexts"
	@echo "As JSON:            $(BIN)/callpath report $(DEMO_DB) --format json"
	@echo "Viewer:             $(BIN)/callpath view $(DEMO_DB)   (the browser viewer is not yet available)"

## test: set up, then lint, type-check and run the whole test suite
test: $(STAMP) lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/read_db.py

clean:
	rm -rf $(VENV) out .mypy_cache .ruff_cache .pytest_cache
