"""torch-images: reproducible, tested container images for GPU PyTorch, built from matrix.yaml."""
