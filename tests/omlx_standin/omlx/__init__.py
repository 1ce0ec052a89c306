"""A stand-in for oMLX (flyto-mlx 0.7.0) that answers like it, for CI: see cli.py."""
