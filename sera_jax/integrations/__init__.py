"""Bridges from sera_jax to other training frameworks (optional extras: each module imports its framework)."""
