"""Controlled gradient alignment of SERA against MaxRL's uniform allocation (SERA.md §8A)."""
