"""Benchmarks: `flashdraft bench decode|serve|model` (see cli.py)."""
