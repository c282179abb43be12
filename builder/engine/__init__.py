"""The Docker engine the later stages use: connecting and starting it, bases, the one tar encoding
of a layer, image IDs."""
