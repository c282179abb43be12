"""One module per command of `python -m builder`: its parser beside what it runs."""
