"""Benchmarks: commands that measure (speed, ratio, memory) and print what they measured; never tests."""
