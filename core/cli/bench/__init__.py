"""Benchmarks behind ``spyglass bench``: each prints ratios measured within one run."""
