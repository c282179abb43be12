"""The input files (matrix.yaml, data/*.yaml), validated: each value against its grammar, the
first error as file:line."""
