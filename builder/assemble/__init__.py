"""Images on the engine: one cell's build, its backends, the self-test in the image, the sweep,
bundles."""
