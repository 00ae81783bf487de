"""The measuring tools (docs/internals/benchmarks.md): the bench (``python -m
tests.benchmarks.bench``) and the in-process and ledger-scale tools beside it. Nothing in the
product imports them (the ``product-without-tests`` import contract)."""
