"""One module per question about attention; each entry point returns a tidy DataFrame."""
