"""The pytest session: options, settings, stash keys, fixtures, xdist, example database,
progress."""
