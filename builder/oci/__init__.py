"""The OCI distribution client: a registry's API, its authentication and its answers, checked."""
