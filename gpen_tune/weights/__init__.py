"""Weights: registry lookups, the cache directory, safe reading and verification, downloads."""
