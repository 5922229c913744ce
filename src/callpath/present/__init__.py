"""Renderers: text report, JSON, CSV (and later the web viewer)."""
