"""Batch planning: the dependency graph over a batch's transactions."""
