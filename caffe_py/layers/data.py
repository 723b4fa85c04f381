"""Layer family: data."""
