"""The matrix's spec joined with the facts: its cells, their names and tags, and the cells it
rejects."""
