"""The wheelhouse: the locked files (wheels, .debs) fetched, verified and served to builds on
loopback, and the URL layout by which the rendered Dockerfiles fetch them."""
