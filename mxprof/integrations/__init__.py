"""Adapters for frameworks: each is optional and imports its framework lazily."""
