"""Layer family: loss."""
