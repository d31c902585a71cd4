"""The fit loop that every trainer runs: resume, validation and checkpoint cadence, stopping."""
