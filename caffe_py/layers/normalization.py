"""Layer family: normalization."""
