"""Hash-pinned inputs: requirements.lock, debian.lock, their signed indexes, and the audit against
security fixes."""
