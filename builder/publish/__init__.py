"""The registry: the gate, pushes, attachments and their signatures, staging and promotion, verify
and rebuild."""
