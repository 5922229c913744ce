"""Views and transforms over an experiment (top-down, bottom-up, flat, derived metrics)."""
