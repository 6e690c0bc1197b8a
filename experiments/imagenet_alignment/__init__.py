"""Controlled gradient alignment of SERA against MaxRL's uniform allocation (docs/method.md §8A)."""
