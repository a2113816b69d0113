"""Measured speed: each benchmark prints a ratio measured in one run and writes JSON."""
