"""Benchmarks of the bidding package (see README.md); a regular package so mypy checks it."""
