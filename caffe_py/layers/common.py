"""Layer family: common."""
