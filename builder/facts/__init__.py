"""What the wheels say: torch's and TensorRT-LLM's own metadata, kept as data, and why a
combination cannot work."""
