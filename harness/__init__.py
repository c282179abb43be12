"""What the tests and the benchmarks both run beside the builder: loopback registries, a second
Docker engine (Docker 29), containerd's ctr, a lazily pulling node, and the verifiers a cluster
runs (cosign, oras). Not part of the builder: it ships with the checkout, not the package. The
benchmarks import it, never the tests."""
