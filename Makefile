# The common tasks. The README's two commands are `make demo` and `make test`.
.PHONY: demo test lint crd bootstrap

demo: bootstrap
	.venv/bin/smoothscale demo

test:
	scripts/test

lint: bootstrap
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

crd: bootstrap
	.venv/bin/smoothscale crd

bootstrap:
	scripts/bootstrap
