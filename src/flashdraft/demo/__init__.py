"""``flashdraft demo``: generate -> mix -> train -> bench -> export -> report on one target, resumable per stage."""
