"""Dockerfiles and CI workflows, from templates/ and values every one of which was validated."""
