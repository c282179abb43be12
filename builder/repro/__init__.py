"""Reproducible images: the pass after a build that rewrites every layer and the config in the
builder's encoding."""
