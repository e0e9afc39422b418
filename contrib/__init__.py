"""Integrations of kvtier with inference engines."""
