"""The one place where Spyglass defines its metrics, tracers and loggers, and their settings."""
