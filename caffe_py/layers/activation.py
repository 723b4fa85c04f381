"""Layer family: activation."""
